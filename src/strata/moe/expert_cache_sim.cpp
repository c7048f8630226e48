// simulate_expert_cache (expert_cache_sim.h): the real ExpertCache policy, driven boundary by boundary.
#include "strata/moe/expert_cache_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <numeric>
#include <utility>

#include "strata/base/error.h"

namespace strata {
namespace {

// Each layer's pinned slot map: the `keep` most-picked experts of tokens [0, n_cal) (the lower id among
// equal counts), numbered in ascending id as placement numbers them.
std::vector<std::vector<int>> pinned_from(const std::vector<const uint16_t*>& tokens, int n_cal, int n_layer,
                                          int n_expert, int k, int keep) {
  std::vector<std::vector<int>> map(static_cast<size_t>(n_layer), std::vector<int>(static_cast<size_t>(n_expert), -1));
  std::vector<uint64_t> count(static_cast<size_t>(n_expert));
  std::vector<int> order(static_cast<size_t>(n_expert));
  for (int l = 0; l < n_layer; ++l) {
    std::fill(count.begin(), count.end(), 0);
    for (int t = 0; t < n_cal; ++t)
      for (int q = 0; q < k; ++q) ++count[tokens[static_cast<size_t>(t)][static_cast<size_t>(l) * k + q]];
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return count[static_cast<size_t>(a)] > count[static_cast<size_t>(b)]; });
    std::vector<int>& row = map[static_cast<size_t>(l)];
    for (int i = 0; i < keep; ++i) row[static_cast<size_t>(order[static_cast<size_t>(i)])] = 0;
    int next = 0;
    for (int e = 0; e < n_expert; ++e)
      if (row[static_cast<size_t>(e)] == 0) row[static_cast<size_t>(e)] = next++;
  }
  return map;
}

}  // namespace

CacheSimResult simulate_expert_cache(const RoutingTrace& trace, const CacheSimConfig& cfg) {
  const RoutingTraceHeader& h = trace.header;
  const int L = h.n_layer, E = h.n_expert, k = h.k;
  if (!(cfg.residency >= 0.0 && cfg.residency <= 1.0)) fail("cache simulation: residency must be 0..1, got ", cfg.residency);
  if (!(cfg.calibrate > 0.0 && cfg.calibrate < 1.0)) fail("cache simulation: calibrate must be between 0 and 1, got ", cfg.calibrate);
  if (cfg.slots_per_layer < 0 || cfg.copy_experts < 0 || cfg.observe_delay < 1 || cfg.copy_delay < 1)
    fail("cache simulation: slots and copy budget must be >= 0, the delays >= 1");
  std::vector<const uint16_t*> tokens;
  const size_t stride = trace.token_stride();
  for (const RoutingStream& s : trace.streams)
    for (size_t i = 0; i + stride <= s.picks.size(); i += stride) tokens.push_back(s.picks.data() + i);
  const int n = static_cast<int>(tokens.size());
  const int n_cal = static_cast<int>(std::floor(cfg.calibrate * n));
  if (n_cal < 1 || n_cal >= n) fail("cache simulation: a trace of ", n, " tokens leaves nothing on one side of the split");
  const int keep = static_cast<int>(std::lround(cfg.residency * E));

  ExpertCacheConfig cc;
  cc.pinned = pinned_from(tokens, n_cal, L, E, k, keep);
  cc.slots_per_layer = cfg.slots_per_layer;
  cc.policy = cfg.policy;
  cc.lfu_half_life = cfg.lfu_half_life;
  cc.admit_margin = cfg.admit_margin;
  cc.expert_bytes.assign(static_cast<size_t>(L), 1);  // the budget counts experts
  ExpertCache cache(std::move(cc));
  const bool cached = cache.total_cache_slots() > 0;

  CacheSimResult r;
  std::deque<std::pair<int, std::vector<uint64_t>>> unseen;  // (step, its picks) the policy has not seen
  std::deque<std::pair<int, std::vector<ExpertCache::Copy>>> copying;  // (boundary started, copies)
  for (int s = 0; s + n_cal < n; ++s) {
    if (cached) {  // the boundary before step s
      while (!unseen.empty() && unseen.front().first + cfg.observe_delay <= s) {
        cache.observe(unseen.front().second, E);
        unseen.pop_front();
      }
      while (!copying.empty() && copying.front().first + cfg.copy_delay <= s) {
        for (const ExpertCache::Copy& c : copying.front().second) cache.copy_done(c.layer, c.slot);
        copying.pop_front();
      }
      ExpertCache::StepPlan plan = cache.between_steps(static_cast<uint64_t>(cfg.copy_experts));
      if (!plan.copies.empty()) copying.emplace_back(s, std::move(plan.copies));
    }
    const uint16_t* tok = tokens[static_cast<size_t>(s + n_cal)];
    std::vector<uint64_t> step_picks(static_cast<size_t>(L) * E, 0);
    for (int l = 0; l < L; ++l) {
      const std::vector<int>& map = cache.slot_map(l);
      const int pinned = cache.pinned(l);
      for (int q = 0; q < k; ++q) {
        const int e = tok[static_cast<size_t>(l) * k + q];
        ++step_picks[static_cast<size_t>(l) * E + e];
        ++r.picks;
        const int slot = map[static_cast<size_t>(e)];
        if (slot < 0) ++r.misses;
        else if (slot < pinned) ++r.pinned_hits;
        else ++r.cache_hits;
      }
    }
    ++r.tokens;
    if (cached) unseen.emplace_back(s, std::move(step_picks));
  }
  r.copies = cache.stats().copies;
  r.evictions = cache.stats().evictions;
  return r;
}

std::string format_cache_sim_grid(const RoutingTrace& trace, const CacheSimConfig& base) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "expert cache, simulated (pinned: each layer's most-picked experts of the first %.0f%% of the tokens; "
                "measured on the rest; copies of at most %d experts per step, seen %d and mapped %d step(s) later):\n",
                base.calibrate * 100.0, base.copy_experts, base.observe_delay, base.copy_delay);
  out += buf;
  for (double residency : {0.25, 0.5, 0.75}) {
    std::snprintf(buf, sizeof buf, "  residency %2.0f%%:", residency * 100.0);
    out += buf;
    for (int slots : {0, 8, 16, 32}) {
      for (ExpertCachePolicy policy : {ExpertCachePolicy::Lru, ExpertCachePolicy::Lfu}) {
        if (slots == 0 && policy == ExpertCachePolicy::Lfu) continue;
        CacheSimConfig c = base;
        c.residency = residency;
        c.slots_per_layer = slots;
        c.policy = policy;
        const CacheSimResult r = simulate_expert_cache(trace, c);
        if (slots == 0) {
          std::snprintf(buf, sizeof buf, " no cache %.1f%% cold;", r.miss_rate() * 100.0);
        } else {
          // Hits a copy: a copy moves an expert's bytes through host memory about three times, a hit saves
          // the CPU one read of them.
          std::snprintf(buf, sizeof buf,
                        " %s %d: %.1f%% cold (%.0f%% of misses caught, %.1f copies/token, %.1f hits/copy);",
                        expert_cache_policy_name(policy), slots, r.miss_rate() * 100.0, r.cache_hit_rate() * 100.0,
                        r.tokens ? static_cast<double>(r.copies) / static_cast<double>(r.tokens) : 0.0,
                        r.copies ? static_cast<double>(r.cache_hits) / static_cast<double>(r.copies) : 0.0);
        }
        out += buf;
      }
    }
    out.back() = '\n';
  }
  return out;
}

}  // namespace strata
