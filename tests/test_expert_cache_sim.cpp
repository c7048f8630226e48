// The offline expert-cache model (moe/expert_cache_sim.h): its counts add up, the pinned set alone is
// the static coverage of the measured tokens, a trace that keeps picking the same experts is caught
// once the delays have passed, and a cache cannot catch what never repeats.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/moe/expert_cache_sim.h"
#include "strata/moe/routing_generator.h"

namespace {

// A trace of one stream: token t picks picks_of(t, layer) in each of n_layer layers.
template <class F>
strata::RoutingTrace make_trace(int n_layer, int n_expert, int k, int n_tokens, F picks_of) {
  strata::RoutingTrace t;
  t.header.n_layer = n_layer, t.header.n_expert = n_expert, t.header.k = k;
  t.streams.resize(1);
  for (int i = 0; i < n_tokens; ++i)
    for (int l = 0; l < n_layer; ++l)
      for (int e : picks_of(i, l)) t.streams[0].picks.push_back(static_cast<uint16_t>(e));
  return t;
}

}  // namespace

TEST(ExpertCacheSim, CountsAddUpAndNoCacheIsTheStaticCoverage) {
  const auto& s = strata::routing_setting("qwen3-30b-a3b-like");
  const strata::RoutingTrace tr = strata::generate_routing_trace(s, 4, s.n_expert, s.k, 3, 800);
  strata::CacheSimConfig c;
  c.residency = 0.4;
  const strata::CacheSimResult none = strata::simulate_expert_cache(tr, c);
  EXPECT_EQ(none.tokens, 400u);
  EXPECT_EQ(none.picks, 400u * 4 * s.k);
  EXPECT_EQ(none.cache_hits, 0u);
  EXPECT_EQ(none.pinned_hits + none.misses, none.picks);
  // Pinned hits computed directly: the 40% most-picked experts of each layer over tokens 0..399.
  uint64_t hits = 0;
  const size_t stride = tr.token_stride();
  for (int l = 0; l < 4; ++l) {
    std::vector<int> count(s.n_expert, 0);
    for (int t = 0; t < 400; ++t)
      for (int q = 0; q < s.k; ++q) ++count[tr.streams[0].picks[t * stride + l * s.k + q]];
    std::vector<int> order(s.n_expert);
    for (int e = 0; e < s.n_expert; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return count[a] > count[b]; });
    std::vector<bool> hot(s.n_expert, false);
    for (int i = 0; i < static_cast<int>(0.4 * s.n_expert + 0.5); ++i) hot[order[i]] = true;
    for (int t = 400; t < 800; ++t)
      for (int q = 0; q < s.k; ++q) hits += hot[tr.streams[0].picks[t * stride + l * s.k + q]] ? 1 : 0;
  }
  EXPECT_EQ(none.pinned_hits, hits);

  c.slots_per_layer = 16;
  for (auto policy : {strata::ExpertCachePolicy::Lru, strata::ExpertCachePolicy::Lfu}) {
    c.policy = policy;
    const strata::CacheSimResult r = strata::simulate_expert_cache(tr, c);
    EXPECT_EQ(r.pinned_hits + r.cache_hits + r.misses, r.picks);
    EXPECT_GT(r.cache_hits, 0u);
    EXPECT_LT(r.misses, none.misses);  // this routing repeats itself: the cache catches some of it
    EXPECT_LE(r.copies, r.tokens * static_cast<uint64_t>(c.copy_experts));
  }
}

TEST(ExpertCacheSim, RepeatedPicksAreCaughtAfterTheDelays) {
  // Calibration tokens pick experts 0..3; the measured ones always pick 8..11 (never pinned).
  const strata::RoutingTrace tr = make_trace(2, 32, 4, 200, [](int t, int) {
    return t < 100 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{8, 9, 10, 11};
  });
  strata::CacheSimConfig c;
  c.residency = 4.0 / 32.0;
  c.slots_per_layer = 4;
  c.copy_experts = 8;
  const strata::CacheSimResult r = strata::simulate_expert_cache(tr, c);
  EXPECT_EQ(r.pinned_hits, 0u);
  // Step 0's picks are seen at boundary 2, copied (8 per boundary: both layers' four) and mapped at 3.
  EXPECT_EQ(r.misses, 3u * 2 * 4);
  EXPECT_EQ(r.cache_hits, r.picks - r.misses);
  EXPECT_EQ(r.copies, 8u);
  c.observe_delay = 1;  // seen one boundary sooner: one token fewer missed
  EXPECT_EQ(strata::simulate_expert_cache(tr, c).misses, 2u * 2 * 4);
  // The grid's cells say what each copy bought: at 25% (8 of 32 pinned, 8..11 still cold) with 8 slots,
  // 776 hits for 8 copies.
  c.observe_delay = 2;
  const std::string grid = strata::format_cache_sim_grid(tr, c);
  EXPECT_NE(grid.find("lfu 8: 3.0% cold (97% of misses caught, 0.1 copies/token, 97.0 hits/copy)"), std::string::npos)
      << grid;
}

TEST(ExpertCacheSim, NothingRepeatsNothingIsCaught) {
  // Every token picks four experts never picked before or after.
  const strata::RoutingTrace tr = make_trace(1, 480, 4, 120, [](int t, int) {
    const int b = t * 4;
    return std::vector<int>{b, b + 1, b + 2, b + 3};
  });
  strata::CacheSimConfig c;
  c.residency = 0.0;
  c.slots_per_layer = 8;
  const strata::CacheSimResult r = strata::simulate_expert_cache(tr, c);
  EXPECT_EQ(r.cache_hits, 0u);
  EXPECT_EQ(r.misses, r.picks);
}

TEST(ExpertCacheSim, BadInputFailsClearly) {
  const auto& s = strata::routing_setting("uniform");
  const strata::RoutingTrace tr = strata::generate_routing_trace(s, 1, s.n_expert, s.k, 1, 10);
  strata::CacheSimConfig c;
  c.calibrate = 1.0;
  EXPECT_THROW(strata::simulate_expert_cache(tr, c), strata::Error);
  c.calibrate = 0.5;
  c.copy_delay = 0;
  EXPECT_THROW(strata::simulate_expert_cache(tr, c), strata::Error);
  c.copy_delay = 1;
  c.residency = 1.5;
  EXPECT_THROW(strata::simulate_expert_cache(tr, c), strata::Error);
}

// The LFU knobs reach the policy: a margin no newcomer can pass admits only into free slots (nothing is
// ever evicted), no margin lets spread-out picks churn; a longer half-life remembers more and so changes
// what is admitted.
TEST(ExpertCacheSim, LfuKnobsReachThePolicy) {
  const auto& s = strata::routing_setting("laguna-xs2-like");
  const strata::RoutingTrace tr = strata::generate_routing_trace(s, 4, s.n_expert, s.k, 2, 1200);
  strata::CacheSimConfig c;
  c.residency = 0.5;
  c.slots_per_layer = 8;
  c.admit_margin = 1e9;
  const strata::CacheSimResult never = strata::simulate_expert_cache(tr, c);
  EXPECT_EQ(never.evictions, 0u);
  EXPECT_LE(never.copies, 4u * 8u);  // each layer's free slots once
  c.admit_margin = 0.0;
  const strata::CacheSimResult churn = strata::simulate_expert_cache(tr, c);
  EXPECT_GT(churn.evictions, 100u);
  c.admit_margin = 1.0;
  const strata::CacheSimResult base = strata::simulate_expert_cache(tr, c);
  c.lfu_half_life = 256.0;
  const strata::CacheSimResult longer = strata::simulate_expert_cache(tr, c);
  EXPECT_NE(base.copies, longer.copies);
  c.lfu_half_life = 0.0;
  EXPECT_THROW(strata::simulate_expert_cache(tr, c), strata::Error);
}
