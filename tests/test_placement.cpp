// Placement (moe/placement.h) against an exhaustive search on small instances, plus the baselines and
// the cold-hit rate against counts computed by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "strata/base/error.h"
#include "strata/moe/placement.h"

namespace strata {
namespace {

// Reference: tries every subset of experts; returns the least expected cold bytes per token possible.
double brute_force_min_cold_bytes(const PlacementInput& in) {
  struct It {
    uint64_t b;
    double h;
  };
  std::vector<It> items;
  double all = 0.0;
  for (size_t l = 0; l < in.expert_bytes.size(); ++l)
    for (size_t e = 0; e < in.expert_bytes[l].size(); ++e) {
      items.push_back({in.expert_bytes[l][e], in.hotness[l][e]});
      all += in.hotness[l][e] * static_cast<double>(in.expert_bytes[l][e]);
    }
  double best_hot = 0.0;
  const size_t n = items.size();
  for (uint64_t mask = 0; mask < (uint64_t{1} << n); ++mask) {
    uint64_t w = 0;
    double v = 0.0;
    for (size_t i = 0; i < n; ++i)
      if (mask >> i & 1) {
        w += items[i].b;
        v += items[i].h * static_cast<double>(items[i].b);
      }
    if (w <= in.budget_bytes) best_hot = std::max(best_hot, v);
  }
  return all - best_hot;
}

// Recomputes a plan's numbers independently of the library and checks its invariants.
void check_plan(const PlacementInput& in, const ExpertPlan& p) {
  ASSERT_EQ(p.n_layer, static_cast<int>(in.expert_bytes.size()));
  ASSERT_EQ(p.slot_of.size(), in.expert_bytes.size());
  uint64_t used = 0;
  double cold_bytes = 0.0, cold_picks = 0.0;
  for (size_t l = 0; l < in.expert_bytes.size(); ++l) {
    ASSERT_EQ(p.slot_of[l].size(), in.expert_bytes[l].size());
    int next_slot = 0;
    for (size_t e = 0; e < in.expert_bytes[l].size(); ++e) {
      if (p.slot_of[l][e] >= 0) {
        EXPECT_EQ(p.slot_of[l][e], next_slot++) << "slots ascend with the expert id";
        used += in.expert_bytes[l][e];
      } else {
        EXPECT_EQ(p.slot_of[l][e], -1);
        cold_bytes += in.hotness[l][e] * static_cast<double>(in.expert_bytes[l][e]);
        cold_picks += in.hotness[l][e];
      }
    }
    EXPECT_EQ(p.n_hot[l], next_slot);
  }
  EXPECT_EQ(p.bytes_used, used);
  EXPECT_LE(used, in.budget_bytes);
  EXPECT_NEAR(p.expected_cold_bytes_per_token, cold_bytes, 1e-9 * std::max(1.0, cold_bytes));
  EXPECT_NEAR(p.expected_cold_picks_per_token, cold_picks, 1e-9 * std::max(1.0, cold_picks));
}

PlacementInput random_instance(std::mt19937& rng, bool equal_sizes) {
  PlacementInput in;
  const int n_layer = std::uniform_int_distribution<int>(1, 4)(rng);
  int left = 14;  // keep 2^items small
  for (int l = 0; l < n_layer; ++l) {
    int n = std::uniform_int_distribution<int>(0, 5)(rng);
    n = std::min(n, left);
    left -= n;
    const uint64_t layer_size = equal_sizes ? 1000 : 1000 * std::uniform_int_distribution<int>(1, 3)(rng);
    std::vector<uint64_t> b;
    std::vector<double> h;
    for (int e = 0; e < n; ++e) {
      // Unequal: sizes differ per layer and, sometimes, within a layer.
      b.push_back(equal_sizes ? 1000 : layer_size + (rng() % 3 == 0 ? 500 * (rng() % 3) : 0));
      h.push_back(static_cast<double>(rng() % 6) / 5.0);  // coarse values: ties happen
    }
    in.expert_bytes.push_back(b);
    in.hotness.push_back(h);
  }
  const uint64_t total = total_expert_bytes(in.expert_bytes);
  in.budget_bytes = std::uniform_int_distribution<uint64_t>(0, total + 1500)(rng);
  return in;
}

TEST(Placement, MatchesExhaustiveSearchEqualSizes) {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 400; ++iter) {
    const PlacementInput in = random_instance(rng, true);
    const ExpertPlan p = plan_placement(in);
    check_plan(in, p);
    const double best = brute_force_min_cold_bytes(in);
    EXPECT_NEAR(p.expected_cold_bytes_per_token, best, 1e-9 * std::max(1.0, best)) << "iteration " << iter;
  }
}

TEST(Placement, MatchesExhaustiveSearchUnequalSizes) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 400; ++iter) {
    const PlacementInput in = random_instance(rng, false);
    const ExpertPlan p = plan_placement(in);
    check_plan(in, p);
    const double best = brute_force_min_cold_bytes(in);
    EXPECT_NEAR(p.expected_cold_bytes_per_token, best, 1e-9 * std::max(1.0, best)) << "iteration " << iter;
  }
}

TEST(Placement, GreedyByHotnessIsNotEnoughWithUnequalSizes) {
  // One hot big expert (value 0.5 * 3000 = 1500) vs two lukewarm small ones (0.4 * 2000 each, 1600
  // together): with 4000 bytes, greedy by hotness would take the big one and then nothing else fits;
  // the optimum takes the two small ones.
  PlacementInput in;
  in.expert_bytes = {{3000}, {2000, 2000}};
  in.hotness = {{0.5}, {0.4, 0.4}};
  in.budget_bytes = 4000;
  const ExpertPlan p = plan_placement(in);
  check_plan(in, p);
  EXPECT_EQ(p.slot_of[0][0], -1);
  EXPECT_EQ(p.n_hot[1], 2);
  EXPECT_NEAR(p.expected_cold_bytes_per_token, 1500.0, 1e-9);
}

TEST(Placement, BudgetZeroAndBudgetForEverything) {
  PlacementInput in;
  in.expert_bytes = {{10, 10, 10}, {}, {20, 20}};
  in.hotness = {{0.5, 1.0, 1.5}, {}, {1.0, 1.0}};
  in.budget_bytes = 0;
  ExpertPlan p = plan_placement(in);
  check_plan(in, p);
  EXPECT_EQ(p.n_hot_total(), 0);
  EXPECT_EQ(p.n_expert_total(), 5);
  EXPECT_NEAR(p.expected_cold_picks_per_token, 5.0, 1e-12);
  EXPECT_NEAR(p.expected_cold_bytes_per_token, 5 + 10 + 15 + 20 + 20, 1e-12);

  for (uint64_t budget : {uint64_t{70}, uint64_t{71}, uint64_t{1} << 40}) {
    in.budget_bytes = budget;
    p = plan_placement(in);
    check_plan(in, p);
    EXPECT_EQ(p.n_hot_total(), 5);
    EXPECT_EQ(p.bytes_used, 70u);
    EXPECT_EQ(p.expected_cold_bytes_per_token, 0.0);
    EXPECT_TRUE(p.slot_of[1].empty()) << "a layer without experts gets nothing";
    EXPECT_EQ(p.n_hot[1], 0);
  }
  const std::vector<std::function<ExpertPlan(const PlacementInput&)>> baselines = {
      uniform_placement, [](const PlacementInput& i) { return by_layer_placement(i); }};
  for (const auto& f : baselines) {
    in.budget_bytes = 0;
    EXPECT_EQ(f(in).n_hot_total(), 0);
    in.budget_bytes = 70;
    EXPECT_EQ(f(in).n_hot_total(), 5);
  }
}

TEST(Placement, TiesPreferLowerLayerThenLowerId) {
  PlacementInput in;
  in.expert_bytes = {{1, 1, 1}, {1, 1, 1}};
  in.hotness = {{0.2, 0.5, 0.5}, {0.5, 0.5, 0.2}};
  in.budget_bytes = 3;
  const ExpertPlan p = plan_placement(in);
  check_plan(in, p);
  EXPECT_EQ(p.slot_of[0], (std::vector<int>{-1, 0, 1}));
  EXPECT_EQ(p.slot_of[1], (std::vector<int>{0, -1, -1}));
}

TEST(Placement, Deterministic) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 50; ++iter) {
    const PlacementInput in = random_instance(rng, iter % 2 == 0);
    const ExpertPlan a = plan_placement(in), b = plan_placement(in);
    EXPECT_EQ(a.slot_of, b.slot_of);
    EXPECT_EQ(a.bytes_used, b.bytes_used);
  }
}

TEST(Placement, LargeTwoSizeModelIsExactAndFast) {
  // 40 layers x 256 experts; every third layer's experts are larger (q6_k down): two size classes.
  std::mt19937 rng(5);
  PlacementInput in;
  for (int l = 0; l < 40; ++l) {
    const uint64_t size = l % 3 == 0 ? 1900000 : 1700000;
    in.expert_bytes.emplace_back(256, size);
    std::vector<double> h(256);
    for (double& x : h) x = std::pow(static_cast<double>(rng() % 1000 + 1) / 1000.0, 4.0);
    in.hotness.push_back(h);
  }
  in.budget_bytes = total_expert_bytes(in.expert_bytes) / 2;
  const ExpertPlan p = plan_placement(in);
  check_plan(in, p);
  // Independent check of optimality for two classes: scan every count of the small class.
  std::vector<double> small, large;
  for (int l = 0; l < 40; ++l)
    for (double h : in.hotness[l]) (l % 3 == 0 ? large : small).push_back(h);
  std::sort(small.rbegin(), small.rend());
  std::sort(large.rbegin(), large.rend());
  double best = 0.0, total = 0.0;
  for (double h : small) total += h * 1700000;
  for (double h : large) total += h * 1900000;
  double vs = 0.0;
  for (size_t cs = 0; cs <= small.size(); ++cs) {
    if (cs > 0) vs += small[cs - 1] * 1700000;
    if (cs * 1700000 > in.budget_bytes) break;
    const size_t cl = std::min<size_t>(large.size(), (in.budget_bytes - cs * 1700000) / 1900000);
    double vl = 0.0;
    for (size_t i = 0; i < cl; ++i) vl += large[i] * 1900000;
    best = std::max(best, vs + vl);
  }
  EXPECT_NEAR(p.expected_cold_bytes_per_token, total - best, 1e-9 * total);
}

TEST(Placement, ManySizesFallbackStaysWithinBound) {
  // Four size classes of 600 experts: enumeration would be 601^3 > the limit, so greedy-with-skip runs.
  std::mt19937 rng(11);
  PlacementInput in;
  double max_value = 0.0;
  for (int l = 0; l < 4; ++l) {
    const uint64_t size = 1000 + 37 * static_cast<uint64_t>(l);
    in.expert_bytes.emplace_back(600, size);
    std::vector<double> h(600);
    for (double& x : h) {
      x = static_cast<double>(rng() % 10000) / 10000.0;
      max_value = std::max(max_value, x * size);
    }
    in.hotness.push_back(h);
  }
  in.budget_bytes = total_expert_bytes(in.expert_bytes) / 3 + 517;
  const ExpertPlan p = plan_placement(in);
  check_plan(in, p);
  // LP bound: take items by hotness, the last one fractionally.
  struct It {
    double h;
    uint64_t b;
  };
  std::vector<It> items;
  double total = 0.0;
  for (int l = 0; l < 4; ++l)
    for (int e = 0; e < 600; ++e) {
      items.push_back({in.hotness[l][e], in.expert_bytes[l][e]});
      total += in.hotness[l][e] * in.expert_bytes[l][e];
    }
  std::sort(items.begin(), items.end(), [](const It& a, const It& b) { return a.h > b.h; });
  double lp = 0.0, left = static_cast<double>(in.budget_bytes);
  for (const It& it : items) {
    const double take = std::min(left, static_cast<double>(it.b));
    lp += it.h * take;
    left -= take;
    if (left <= 0) break;
  }
  const double hot_value = total - p.expected_cold_bytes_per_token;
  EXPECT_GE(hot_value, lp - max_value - 1e-6);
  EXPECT_LE(hot_value, lp + 1e-6);
}

TEST(Placement, UniformBaselineSameCountPerLayerThenLeftover) {
  PlacementInput in;
  in.expert_bytes = {{10, 10, 10, 10}, {}, {10, 10, 10, 10}, {10, 10, 10, 10}};
  in.hotness = uniform_hotness(in.expert_bytes, 2);
  in.budget_bytes = 75;  // 2 per layer (60) + one more in the lowest layer (70); 5 bytes unused
  const ExpertPlan p = uniform_placement(in);
  check_plan(in, p);
  EXPECT_EQ(p.slot_of[0], (std::vector<int>{0, 1, 2, -1}));
  EXPECT_EQ(p.slot_of[2], (std::vector<int>{0, 1, -1, -1}));
  EXPECT_EQ(p.slot_of[3], (std::vector<int>{0, 1, -1, -1}));
  EXPECT_EQ(p.bytes_used, 70u);
}

TEST(Placement, ByLayerBaselineFillsWholeLayers) {
  PlacementInput in;
  in.expert_bytes = {{10, 10}, {10, 10}, {}, {10, 10}};
  in.hotness = uniform_hotness(in.expert_bytes, 1);
  in.budget_bytes = 45;  // two whole layers
  ExpertPlan p = by_layer_placement(in);  // llama.cpp --n-cpu-moe: the first layers stay on the CPU
  check_plan(in, p);
  EXPECT_EQ(p.n_hot, (std::vector<int>{0, 2, 0, 2}));
  p = by_layer_placement(in, LayerFillOrder::FirstLayersOnGpu);
  check_plan(in, p);
  EXPECT_EQ(p.n_hot, (std::vector<int>{2, 2, 0, 0}));
}

TEST(Placement, ColdHitRateCountsColdPicks) {
  PlacementInput in;
  in.expert_bytes = {{1, 1, 1}, {1, 1, 1}};
  in.hotness = uniform_hotness(in.expert_bytes, 1);
  in.budget_bytes = 2;
  const ExpertPlan p = by_layer_placement(in, LayerFillOrder::FirstLayersOnGpu);  // nothing fits: 3 > 2
  ASSERT_EQ(p.n_hot_total(), 0);
  RoutingCounts c;
  c.reset(2, 3);
  c.add(0, 0, 5);
  c.add(1, 2, 3);
  c.n_tokens = 8;
  EXPECT_DOUBLE_EQ(cold_hit_rate(p, c), 1.0);

  in.budget_bytes = 4;  // plan: hottest by counts
  in.hotness = hotness_from_counts(c, 1);
  const ExpertPlan q = plan_placement(in);
  EXPECT_TRUE(q.is_hot(0, 0));
  EXPECT_TRUE(q.is_hot(1, 2));
  EXPECT_DOUBLE_EQ(cold_hit_rate(q, c), 0.0);

  RoutingCounts held;
  held.reset(2, 3);
  held.add(0, 0, 2);
  held.add(0, 1, 2);
  held.add(1, 0, 4);
  held.n_tokens = 8;
  double cold0 = 0, cold1 = 0;
  for (int e = 0; e < 3; ++e) {
    if (!q.is_hot(0, e)) cold0 += held.at(0, e);
    if (!q.is_hot(1, e)) cold1 += held.at(1, e);
  }
  const std::vector<double> per = cold_hit_rate_per_layer(q, held);
  EXPECT_DOUBLE_EQ(per[0], cold0 / 4.0);
  EXPECT_DOUBLE_EQ(per[1], cold1 / 4.0);
  EXPECT_DOUBLE_EQ(cold_hit_rate(q, held), (cold0 + cold1) / 8.0);
}

TEST(Placement, RejectsInconsistentInput) {
  PlacementInput in;
  in.expert_bytes = {{1, 1}};
  in.hotness = {{0.5}};
  EXPECT_THROW(plan_placement(in), Error);
  in.hotness = {{0.5, -1.0}};
  EXPECT_THROW(plan_placement(in), Error);
  in.hotness = {{0.5, 0.5}};
  in.expert_bytes = {{1, 0}};
  EXPECT_THROW(plan_placement(in), Error);
  in.expert_bytes = {{1, 1}};
  RoutingCounts wrong;
  wrong.reset(3, 2);
  EXPECT_THROW(cold_hit_rate(plan_placement(in), wrong), Error);
}

TEST(RoutingCounts, AddMergeAndBounds) {
  RoutingCounts a, b, empty;
  a.reset(2, 4);
  a.add(1, 3, 7);
  a.n_tokens = 7;
  b.reset(2, 4);
  b.add(1, 3);
  b.add(0, 0, 2);
  b.n_tokens = 2;
  a.merge(b);
  EXPECT_EQ(a.at(1, 3), 8u);
  EXPECT_EQ(a.at(0, 0), 2u);
  EXPECT_EQ(a.n_tokens, 9u);
  EXPECT_EQ(a.layer_total(1), 8u);
  empty.merge(a);
  EXPECT_EQ(empty.at(1, 3), 8u);
  EXPECT_THROW(a.add(2, 0), Error);
  EXPECT_THROW(a.at(0, 4), Error);
  RoutingCounts c;
  c.reset(3, 4);
  EXPECT_THROW(a.merge(c), Error);
}

}  // namespace
}  // namespace strata
