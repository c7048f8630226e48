// Placement as a 0/1 knapsack: item (l, e) has weight bytes[l][e] and value hotness[l][e] * bytes[l][e]
// (the cold bytes per token it saves when hot); maximise the value of the hot set within the budget.
//
// Why this is solved exactly here. Experts of one size are interchangeable except for their value, and
// among items of equal weight value order equals hotness order. Exchange argument: if an optimal set
// holds expert x but not a hotter expert y of the same size, swapping them keeps the weight and does not
// lower the value. So some optimal solution takes, in every size class, a prefix of that class sorted
// by hotness. Real models have few distinct expert sizes (one per quant mix: q4_k_m gives two, since
// some layers keep ffn_down in q6_k), so the problem reduces to choosing a count per size class:
//   - one class: take the top floor(budget / size) experts by hotness (greedy, exactly optimal);
//   - S classes: enumerate the counts of all classes but the largest, and fill the largest class with as
//     many of its prefix as the remaining budget allows (values are >= 0, so filling never hurts).
//     Work = product over enumerated classes of (count + 1); exact while it is <= kMaxEnumeration.
// Beyond that limit (many distinct sizes; not seen in practice) we fall back to greedy by value density
// (= hotness), skipping what does not fit. Its loss is bounded: the fractional (LP) greedy optimum is >=
// the 0/1 optimum, and skip-greedy gives up at most the value of the first item that did not fit, i.e.
// at most max(hotness * bytes) of one expert in expected cold bytes per token.
#include "strata/moe/placement.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "strata/base/error.h"

namespace strata {
namespace {

constexpr double kMaxEnumeration = 2e7;

struct Item {
  int layer, expert;
  uint64_t bytes;
  double hot;
};

// Hotter first; equal hotness: lower layer, then lower expert id.
bool hotter(const Item& a, const Item& b) {
  if (a.hot != b.hot) return a.hot > b.hot;
  if (a.layer != b.layer) return a.layer < b.layer;
  return a.expert < b.expert;
}

void validate(const PlacementInput& in) {
  if (in.hotness.size() != in.expert_bytes.size())
    fail("placement: hotness has ", in.hotness.size(), " layers, expert sizes have ", in.expert_bytes.size());
  for (size_t l = 0; l < in.expert_bytes.size(); ++l) {
    const auto& b = in.expert_bytes[l];
    if (b.empty()) continue;
    if (in.hotness[l].size() != b.size())
      fail("placement: layer ", l, " has ", b.size(), " expert sizes but ", in.hotness[l].size(), " hotness values");
    for (size_t e = 0; e < b.size(); ++e) {
      if (b[e] == 0) fail("placement: layer ", l, " expert ", e, " has size 0");
      const double h = in.hotness[l][e];
      if (!(h >= 0.0) || h > 1e300) fail("placement: layer ", l, " expert ", e, " has invalid hotness ", h);
    }
  }
}

std::vector<Item> items_of(const PlacementInput& in) {
  std::vector<Item> items;
  for (size_t l = 0; l < in.expert_bytes.size(); ++l)
    for (size_t e = 0; e < in.expert_bytes[l].size(); ++e)
      items.push_back({static_cast<int>(l), static_cast<int>(e), in.expert_bytes[l][e], in.hotness[l][e]});
  return items;
}

// Builds the plan from a hot mask [layer][expert] and fills in the derived numbers.
ExpertPlan make_plan(const PlacementInput& in, const std::vector<std::vector<char>>& hot) {
  ExpertPlan p;
  p.n_layer = static_cast<int>(in.expert_bytes.size());
  p.slot_of.resize(in.expert_bytes.size());
  p.n_hot.assign(in.expert_bytes.size(), 0);
  for (size_t l = 0; l < in.expert_bytes.size(); ++l) {
    const size_t n = in.expert_bytes[l].size();
    p.n_expert = std::max(p.n_expert, static_cast<int>(n));
    p.slot_of[l].assign(n, -1);
    for (size_t e = 0; e < n; ++e) {
      const double h = in.hotness[l][e];
      const uint64_t b = in.expert_bytes[l][e];
      if (hot[l][e]) {
        p.slot_of[l][e] = p.n_hot[l]++;
        p.bytes_used += b;
      } else {
        p.expected_cold_picks_per_token += h;
        p.expected_cold_bytes_per_token += h * static_cast<double>(b);
      }
    }
  }
  if (p.bytes_used > in.budget_bytes)
    fail("placement: internal error: plan uses ", p.bytes_used, " bytes of a ", in.budget_bytes, " byte budget");
  return p;
}

std::vector<std::vector<char>> empty_mask(const PlacementInput& in) {
  std::vector<std::vector<char>> m(in.expert_bytes.size());
  for (size_t l = 0; l < m.size(); ++l) m[l].assign(in.expert_bytes[l].size(), 0);
  return m;
}

struct SizeClass {
  uint64_t bytes = 0;
  std::vector<Item> items;     // hottest first (hotter())
  std::vector<double> prefix;  // prefix[c] = value of the first c items
  size_t max_count(uint64_t budget) const { return std::min<uint64_t>(items.size(), budget / bytes); }
};

// Exact search over per-class counts (see the file comment); returns false when it would be too much work.
bool exact_by_classes(std::vector<SizeClass>& classes, uint64_t budget, std::vector<size_t>& best_counts) {
  // The class with the most items is filled greedily last; the others are enumerated.
  std::stable_sort(classes.begin(), classes.end(),
                   [](const SizeClass& a, const SizeClass& b) { return a.items.size() < b.items.size(); });
  double work = 1.0;
  for (size_t s = 0; s + 1 < classes.size(); ++s) work *= static_cast<double>(classes[s].max_count(budget) + 1);
  if (work > kMaxEnumeration) return false;

  const size_t S = classes.size();
  std::vector<size_t> counts(S, 0);
  best_counts.assign(S, 0);
  double best_value = -1.0;
  // Recursion over the enumerated classes; `left` is the budget not yet spent.
  std::function<void(size_t, uint64_t, double)> go = [&](size_t s, uint64_t left, double value) {
    if (s + 1 == S) {
      const size_t c = classes[s].max_count(left);
      counts[s] = c;
      const double v = value + classes[s].prefix[c];
      // Strictly better by more than rounding: the first plan found wins ties (deterministic).
      if (v > best_value + 1e-12 * std::max(1.0, std::abs(best_value))) {
        best_value = v;
        best_counts = counts;
      }
      return;
    }
    const size_t cmax = classes[s].max_count(left);
    for (size_t c = 0; c <= cmax; ++c) {
      counts[s] = c;
      go(s + 1, left - c * classes[s].bytes, value + classes[s].prefix[c]);
    }
  };
  go(0, budget, 0.0);
  return true;
}

}  // namespace

int ExpertPlan::n_hot_total() const { return std::accumulate(n_hot.begin(), n_hot.end(), 0); }

int ExpertPlan::n_expert_total() const {
  int n = 0;
  for (const auto& row : slot_of) n += static_cast<int>(row.size());
  return n;
}

uint64_t total_expert_bytes(const std::vector<std::vector<uint64_t>>& expert_bytes) {
  uint64_t t = 0;
  for (const auto& row : expert_bytes)
    for (uint64_t b : row) t += b;
  return t;
}

std::vector<std::vector<double>> hotness_from_counts(const RoutingCounts& counts, int n_expert_used) {
  std::vector<std::vector<double>> h(static_cast<size_t>(counts.n_layer));
  for (int l = 0; l < counts.n_layer; ++l) {
    h[l].resize(static_cast<size_t>(counts.n_expert));
    for (int e = 0; e < counts.n_expert; ++e)
      h[l][e] = counts.n_tokens == 0 ? static_cast<double>(n_expert_used) / counts.n_expert
                                     : static_cast<double>(counts.at(l, e)) / static_cast<double>(counts.n_tokens);
  }
  return h;
}

std::vector<std::vector<double>> uniform_hotness(const std::vector<std::vector<uint64_t>>& expert_bytes,
                                                 int n_expert_used) {
  std::vector<std::vector<double>> h(expert_bytes.size());
  for (size_t l = 0; l < expert_bytes.size(); ++l)
    h[l].assign(expert_bytes[l].size(),
                expert_bytes[l].empty() ? 0.0 : static_cast<double>(n_expert_used) / expert_bytes[l].size());
  return h;
}

ExpertPlan plan_placement(const PlacementInput& in) {
  validate(in);
  std::vector<Item> items = items_of(in);
  auto hot = empty_mask(in);

  std::map<uint64_t, SizeClass> by_size;
  for (const Item& it : items) {
    SizeClass& c = by_size[it.bytes];
    c.bytes = it.bytes;
    c.items.push_back(it);
  }
  std::vector<SizeClass> classes;
  for (auto& [bytes, c] : by_size) {
    std::sort(c.items.begin(), c.items.end(), hotter);
    c.prefix.assign(c.items.size() + 1, 0.0);
    for (size_t i = 0; i < c.items.size(); ++i)
      c.prefix[i + 1] = c.prefix[i] + c.items[i].hot * static_cast<double>(c.items[i].bytes);
    classes.push_back(std::move(c));
  }

  std::vector<size_t> counts;
  if (classes.empty()) return make_plan(in, hot);
  if (exact_by_classes(classes, in.budget_bytes, counts)) {
    for (size_t s = 0; s < classes.size(); ++s)
      for (size_t i = 0; i < counts[s]; ++i) hot[classes[s].items[i].layer][classes[s].items[i].expert] = 1;
    return make_plan(in, hot);
  }

  // Fallback (see the file comment): greedy by density = hotness, skipping items that do not fit.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.hot != b.hot) return a.hot > b.hot;
    if (a.bytes != b.bytes) return a.bytes < b.bytes;
    return hotter(a, b);
  });
  uint64_t left = in.budget_bytes;
  for (const Item& it : items) {
    if (it.bytes > left) continue;
    left -= it.bytes;
    hot[it.layer][it.expert] = 1;
  }
  return make_plan(in, hot);
}

ExpertPlan uniform_placement(const PlacementInput& in) {
  validate(in);
  auto hot = empty_mask(in);
  size_t max_n = 0;
  for (const auto& row : in.expert_bytes) max_n = std::max(max_n, row.size());
  // cost(c): bytes of experts 0..c-1 in every layer; monotone in c, so walk up while it fits.
  auto cost = [&](size_t c) {
    uint64_t b = 0;
    for (const auto& row : in.expert_bytes)
      for (size_t e = 0; e < std::min(c, row.size()); ++e) b += row[e];
    return b;
  };
  size_t c = 0;
  while (c < max_n && cost(c + 1) <= in.budget_bytes) ++c;
  uint64_t left = in.budget_bytes - cost(c);
  for (size_t l = 0; l < in.expert_bytes.size(); ++l) {
    const auto& row = in.expert_bytes[l];
    for (size_t e = 0; e < std::min(c, row.size()); ++e) hot[l][e] = 1;
    if (c < row.size() && row[c] <= left) {  // the leftover: one more expert, lower layers first
      hot[l][c] = 1;
      left -= row[c];
    }
  }
  return make_plan(in, hot);
}

ExpertPlan by_layer_placement(const PlacementInput& in, LayerFillOrder order) {
  validate(in);
  auto hot = empty_mask(in);
  const int n = static_cast<int>(in.expert_bytes.size());
  uint64_t left = in.budget_bytes;
  for (int i = 0; i < n; ++i) {
    const int l = order == LayerFillOrder::FirstLayersOnGpu ? i : n - 1 - i;
    const auto& row = in.expert_bytes[l];
    if (row.empty()) continue;
    const uint64_t b = std::accumulate(row.begin(), row.end(), uint64_t{0});
    if (b > left) break;
    left -= b;
    std::fill(hot[l].begin(), hot[l].end(), 1);
  }
  return make_plan(in, hot);
}

std::vector<double> cold_hit_rate_per_layer(const ExpertPlan& plan, const RoutingCounts& counts) {
  if (plan.n_layer != counts.n_layer)
    fail("cold-hit rate: the plan has ", plan.n_layer, " layers, the routing counts ", counts.n_layer);
  std::vector<double> rate(static_cast<size_t>(plan.n_layer), 0.0);
  for (int l = 0; l < plan.n_layer; ++l) {
    const auto& row = plan.slot_of[l];
    const uint64_t total = counts.layer_total(l);
    if (row.empty()) {
      if (total != 0) fail("cold-hit rate: layer ", l, " has no experts in the plan but ", total, " counted picks");
      continue;
    }
    if (static_cast<int>(row.size()) != counts.n_expert)
      fail("cold-hit rate: layer ", l, " has ", row.size(), " experts in the plan, the counts ", counts.n_expert);
    uint64_t cold = 0;
    for (int e = 0; e < counts.n_expert; ++e)
      if (row[e] < 0) cold += counts.at(l, e);
    rate[l] = total == 0 ? 0.0 : static_cast<double>(cold) / static_cast<double>(total);
  }
  return rate;
}

double cold_hit_rate(const ExpertPlan& plan, const RoutingCounts& counts) {
  (void)cold_hit_rate_per_layer(plan, counts);  // validates the shapes
  uint64_t cold = 0, total = 0;
  for (int l = 0; l < plan.n_layer; ++l) {
    const auto& row = plan.slot_of[l];
    for (size_t e = 0; e < row.size(); ++e) {
      const uint64_t n = counts.at(l, static_cast<int>(e));
      total += n;
      if (row[e] < 0) cold += n;
    }
  }
  return total == 0 ? 0.0 : static_cast<double>(cold) / static_cast<double>(total);
}

int hot_slot_count(const std::vector<int>& row, size_t layer) {
  int next = 0;
  for (size_t e = 0; e < row.size(); ++e) {
    const int slot = row[e];
    if (slot == -1) continue;
    if (slot != next)
      fail("expert slot map: layer ", layer, " expert ", e, " has slot ", slot, ", expected ", next,
           " (hot experts take slots 0, 1, ... in ascending expert id; cold ones -1)");
    ++next;
  }
  return next;
}

}  // namespace strata
