// The routing generator and routing-stats: deterministic from the seed, and the qwen3-30b-a3b-like
// setting reproduces the published Qwen3-30B-A3B figures the setting is calibrated to (static
// coverage of the hottest 40%, reuse at t+1 and within 8 tokens, median reuse distance, LRU hit rates
// at 5/15/30/40/50% residency) within a few points; uniform stays flat.
#include <gtest/gtest.h>

#include "strata/base/error.h"
#include "strata/moe/routing_generator.h"
#include "strata/moe/routing_stats.h"

namespace {

strata::RoutingStats stats_of(const std::string& name, uint64_t seed, int tokens = 3000, int layers = 6) {
  const strata::RoutingSetting& s = strata::routing_setting(name);
  return strata::routing_stats(strata::generate_routing_trace(s, layers, s.n_expert, s.k, seed, tokens));
}

}  // namespace

TEST(RoutingGenerator, DeterministicFromTheSeed) {
  const auto& s = strata::routing_setting("qwen3-30b-a3b-like");
  const auto a = strata::generate_routing_trace(s, 3, 128, 8, 9, 200);
  const auto b = strata::generate_routing_trace(s, 3, 128, 8, 9, 200);
  const auto c = strata::generate_routing_trace(s, 3, 128, 8, 10, 200);
  EXPECT_EQ(a.streams[0].picks, b.streams[0].picks);
  EXPECT_NE(a.streams[0].picks, c.streams[0].picks);
  EXPECT_EQ(a.header.source, "generated qwen3-30b-a3b-like seed 9");
  // Generated in pieces or at once: the same tokens.
  strata::RoutingGenerator g(s, 3, 128, 8, 9);
  std::vector<int> picks(200 * 3 * 8);
  g.next(120, picks.data());
  g.next(80, picks.data() + 120 * 3 * 8);
  EXPECT_EQ(std::vector<int>(a.streams[0].picks.begin(), a.streams[0].picks.end()), picks);
}

// Targets (Qwen3-30B-A3B, 128 experts top-8): hottest 40% take 67.6-72.6% of picks on held-out
// prompts; 45% of picks repeat at t+1; 80% within 8 tokens; median reuse distance 2; LRU hits
// 36.6 / 74.1 / 89.4 / 96.2% at 5 / 15 / 30 / 50% residency and 90-95% at 40%.
// Targets (Laguna-XS.2, 256 experts top-8): a calibrated hot set of 60% of the experts leaves 6.6% of
// held-out picks cold (so the hottest 60% take ~93%); a layer of a 256-expert top-8 model sees ~39.4 /
// ~58.9 distinct experts in 8 / 15 tokens.
TEST(RoutingGenerator, LagunaLikeReproducesThePublishedFigures) {
  const strata::RoutingStats st = stats_of("laguna-xs2-like", 1);
  EXPECT_NEAR(strata::stat_coverage(st, 60), 0.934, 0.03);
  ASSERT_EQ(st.distinct.size(), 2u);
  EXPECT_EQ(st.distinct[0].first, 8);
  EXPECT_NEAR(st.distinct[0].second, 39.4, 3.0);
  EXPECT_EQ(st.distinct[1].first, 16);
  EXPECT_GT(st.distinct[1].second, 58.9);  // 16 tokens: a little more than 15's
  EXPECT_LT(st.distinct[1].second, 65.0);
}

TEST(RoutingGenerator, Qwen3LikeReproducesThePublishedFigures) {
  const strata::RoutingStats st = stats_of("qwen3-30b-a3b-like", 1);
  EXPECT_NEAR(strata::stat_coverage(st, 40), 0.70, 0.04);
  EXPECT_NEAR(strata::stat_reuse_within(st, 1), 0.45, 0.04);
  EXPECT_NEAR(strata::stat_reuse_within(st, 8), 0.80, 0.05);
  EXPECT_EQ(st.reuse_median, 2);
  EXPECT_NEAR(strata::stat_lru_percent(st, 5), 0.366, 0.04);
  EXPECT_NEAR(strata::stat_lru_percent(st, 15), 0.741, 0.04);
  EXPECT_NEAR(strata::stat_lru_percent(st, 30), 0.894, 0.04);
  EXPECT_GE(strata::stat_lru_percent(st, 40), 0.90);
  EXPECT_LE(strata::stat_lru_percent(st, 40), 0.95);
  EXPECT_NEAR(strata::stat_lru_percent(st, 50), 0.962, 0.04);
  // Another seed lands on the same figures.
  const strata::RoutingStats other = stats_of("qwen3-30b-a3b-like", 2);
  EXPECT_NEAR(strata::stat_coverage(other, 40), strata::stat_coverage(st, 40), 0.02);
  EXPECT_NEAR(strata::stat_lru_percent(other, 40), strata::stat_lru_percent(st, 40), 0.02);
}

TEST(RoutingGenerator, UniformIsFlatWithoutReuse) {
  const strata::RoutingStats st = stats_of("uniform", 1);
  EXPECT_NEAR(strata::stat_coverage(st, 40), 0.40, 0.04);
  EXPECT_NEAR(strata::stat_reuse_within(st, 1), 8.0 / 128, 0.02);
  EXPECT_NEAR(strata::stat_lru_percent(st, 40), 0.40, 0.03);  // an LRU of 40% of uniform picks hits ~40%
}

TEST(RoutingStats, HandComputedTrace) {
  // One layer, 4 experts, top-1: picks 0 1 0 0 2.
  strata::RoutingTrace t;
  t.header.n_layer = 1, t.header.n_expert = 4, t.header.k = 1;
  t.streams.push_back({0, {0, 1, 0, 0, 2}});
  const strata::RoutingStats s = strata::routing_stats(t);
  EXPECT_DOUBLE_EQ(strata::stat_coverage(s, 25), 3.0 / 5);             // expert 0: 3 of 5 picks
  EXPECT_DOUBLE_EQ(strata::stat_reuse_within(s, 1), 1.0 / 5);          // the 4th pick
  EXPECT_DOUBLE_EQ(strata::stat_reuse_within(s, 2), 2.0 / 5);          // and the 3rd
  EXPECT_DOUBLE_EQ(s.lru_slots[0].second, 2.0 / 5);                    // 8 slots: every repeat hits
  EXPECT_DOUBLE_EQ(strata::stat_lru_percent(s, 5), 1.0 / 5);           // 1 slot: only the immediate repeat
  EXPECT_EQ(s.reuse_median, -1);  // 3 of 5 picks are first picks
  EXPECT_NE(strata::format_routing_stats(s).find("more than half the picks are first picks"), std::string::npos);
}

TEST(RoutingGenerator, BadNamesFailClearly) {
  try {
    strata::routing_setting("qwen9");
    FAIL() << "no error";
  } catch (const strata::Error& e) {
    EXPECT_NE(std::string(e.what()).find("uniform, qwen3-30b-a3b-like"), std::string::npos) << e.what();
  }
  strata::RoutingTrace empty;
  empty.header.n_layer = 1, empty.header.n_expert = 4, empty.header.k = 1;
  EXPECT_THROW(strata::routing_stats(empty), strata::Error);
}
