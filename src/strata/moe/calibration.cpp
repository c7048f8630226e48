#include "strata/moe/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/base/error.h"
#include "strata/moe/routing_profile.h"

namespace strata {

uint64_t CorpusPart::n_tokens() const {
  uint64_t n = 0;
  for (const auto& d : docs) n += d.size();
  return n;
}

CorpusSplit split_corpus(const std::vector<std::vector<int32_t>>& docs, const std::vector<std::string>& names,
                         double frac) {
  if (!(frac >= 0.0 && frac < 1.0)) fail("--holdout ", frac, ": the held-out fraction must be in [0, 1)");
  if (docs.size() != names.size()) fail("calibrate: ", docs.size(), " documents but ", names.size(), " names");
  if (docs.empty()) fail("calibrate: no corpus documents");
  CorpusSplit s;
  const size_t n = docs.size();
  if (n == 1) {
    const size_t tokens = docs[0].size();
    const size_t held = static_cast<size_t>(std::llround(frac * static_cast<double>(tokens)));
    const size_t cut = tokens - held;
    if (cut == 0) fail("calibrate: ", names[0], " has no tokens to train on");
    s.train.docs.emplace_back(docs[0].begin(), docs[0].begin() + static_cast<std::ptrdiff_t>(cut));
    s.train.names.push_back(names[0]);
    if (held > 0) {
      s.heldout.docs.emplace_back(docs[0].begin() + static_cast<std::ptrdiff_t>(cut), docs[0].end());
      s.heldout.names.push_back(cat(names[0], " (last ", held, " tokens)"));
    } else if (frac > 0.0) {
      fail("calibrate: --holdout ", frac, " of ", tokens, " tokens in ", names[0], " leaves nothing held out");
    }
    return s;
  }
  size_t held = frac > 0.0 ? std::max<size_t>(1, static_cast<size_t>(std::llround(frac * static_cast<double>(n)))) : 0;
  held = std::min(held, n - 1);
  for (size_t i = 0; i < n; ++i) {
    CorpusPart& part = i + held >= n ? s.heldout : s.train;
    part.docs.push_back(docs[i]);
    part.names.push_back(names[i]);
  }
  if (s.train.n_tokens() == 0) fail("calibrate: the training documents have no tokens");
  if (held > 0 && s.heldout.n_tokens() == 0) fail("calibrate: the held-out documents have no tokens");
  return s;
}

void count_routes(Sequence& session, const CorpusPart& part, int chunk, RoutingCounts& counts,
                  const std::function<void(uint64_t)>& progress, ChunkTrace* trace) {
  if (chunk <= 0) fail("calibrate: chunk size must be positive, got ", chunk);
  if (session.max_ctx() < chunk) fail("calibrate: the session's context ", session.max_ctx(), " < chunk ", chunk);
  const int64_t n_vocab = session.model().config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  session.set_routing_counts(&counts);
  uint64_t done = 0;
  try {
    for (const auto& doc : part.docs) {
      for (size_t at = 0; at < doc.size(); at += static_cast<size_t>(chunk)) {
        const int n = static_cast<int>(std::min(doc.size() - at, static_cast<size_t>(chunk)));
        session.reset();
        if (trace && trace->writer) session.set_routing_trace(trace->writer, trace->next_stream++);
        session.forward(doc.data() + at, n, logits.data(), false);
        done += static_cast<uint64_t>(n);
        if (progress) progress(done);
      }
    }
  } catch (...) {
    session.set_routing_counts(nullptr);
    if (trace && trace->writer) session.set_routing_trace(nullptr, 0);
    throw;
  }
  session.set_routing_counts(nullptr);  // detaching flushes what a device counted
  if (trace && trace->writer) session.set_routing_trace(nullptr, 0);
}

std::vector<BudgetComparison> compare_placements(const std::vector<std::vector<uint64_t>>& expert_bytes,
                                                 const RoutingCounts& train, const RoutingCounts& heldout,
                                                 int n_expert_used, const std::vector<double>& percents) {
  const uint64_t all = total_expert_bytes(expert_bytes);
  PlacementInput in;
  in.expert_bytes = expert_bytes;
  in.hotness = hotness_from_counts(train, n_expert_used);
  if (in.hotness.size() != expert_bytes.size())
    fail("calibrate: routing counts have ", in.hotness.size(), " layers, the model ", expert_bytes.size());
  std::vector<BudgetComparison> out;
  for (double pct : percents) {
    BudgetComparison b;
    b.percent = pct;
    b.budget_bytes = static_cast<uint64_t>(std::floor(static_cast<double>(all) * pct / 100.0));
    in.budget_bytes = b.budget_bytes;
    PlacementInput oracle = in;
    oracle.hotness = hotness_from_counts(heldout, n_expert_used);
    const std::pair<const char*, ExpertPlan> plans[] = {
        {"profile", plan_placement(in)},
        {"uniform", uniform_placement(in)},
        {"by-layer", by_layer_placement(in, LayerFillOrder::LastLayersOnGpu)},
        {"oracle", plan_placement(oracle)},
    };
    for (const auto& [name, plan] : plans) {
      MethodResult m;
      m.name = name;
      m.plan = plan;
      m.train_rate = cold_hit_rate(plan, train);
      m.heldout_rate = cold_hit_rate(plan, heldout);
      m.heldout_per_layer = cold_hit_rate_per_layer(plan, heldout);
      b.methods.push_back(std::move(m));
    }
    out.push_back(std::move(b));
  }
  return out;
}

RoutingCounts read_heldout_counts(const std::string& path, const ModelIdentity& model) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open held-out counts");
  std::ostringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, ": held-out counts are not valid JSON: ", e.what());
  }
  if (j.is_object() && j.contains("format")) return load_profile(path, model).counts;
  // tools/train_tiny/train.py's routing_counts.json.
  auto need_uint = [&](const char* key) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_number_unsigned())
      fail(path, ": neither a strata routing profile nor a train_tiny routing_counts.json (no integer '", key, "')");
    return j[key].get<uint64_t>();
  };
  const uint64_t tokens = need_uint("tokens");
  const uint64_t top_k = need_uint("top_k");
  const uint64_t experts = need_uint("num_experts");
  if (static_cast<int>(experts) != model.n_expert || static_cast<int>(top_k) != model.n_expert_used)
    fail(path, ": counts for ", experts, " experts (top-", top_k, "), the model has ", model.n_expert, " (top-",
         model.n_expert_used, ")");
  const auto& rows = j["counts"];
  if (!rows.is_array() || static_cast<int>(rows.size()) != model.n_layer)
    fail(path, ": 'counts' must hold one row per layer (", model.n_layer, ")");
  RoutingCounts c;
  c.reset(model.n_layer, model.n_expert);
  c.n_tokens = tokens;
  for (int l = 0; l < model.n_layer; ++l) {
    const auto& row = rows[static_cast<size_t>(l)];
    if (!row.is_array() || static_cast<int>(row.size()) != model.n_expert)
      fail(path, ": counts row ", l, " must hold ", model.n_expert, " integers");
    for (int e = 0; e < model.n_expert; ++e) {
      if (!row[static_cast<size_t>(e)].is_number_unsigned())
        fail(path, ": counts[", l, "][", e, "] is not a non-negative integer");
      c.add(l, e, row[static_cast<size_t>(e)].get<uint64_t>());
    }
    if (c.layer_total(l) > tokens * top_k)
      fail(path, ": layer ", l, " counts more picks than tokens * top_k = ", tokens * top_k);
  }
  return c;
}

std::vector<double> parse_percent_list(const std::string& text, const char* option_name) {
  std::vector<double> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && (item.back() == ' ' || item.back() == '%')) item.pop_back();
    char* end = nullptr;
    const double v = item.empty() ? -1.0 : std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(v >= 0.0 && v <= 100.0))
      fail(option_name, ": '", text.substr(start, comma - start), "' is not a percentage in 0..100");
    out.push_back(v);
    start = comma + 1;
  }
  return out;
}

}  // namespace strata
