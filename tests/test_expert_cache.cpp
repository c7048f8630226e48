// The expert cache's policy (moe/expert_cache.h), without a GPU: eviction order under LRU and LFU,
// LFU ageing, the per-step copy bound, and the slot map changing only in between_steps() (a copy's
// expert mapped only after its copy finished, a slot being filled never chosen again).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "strata/base/error.h"
#include "strata/moe/expert_cache.h"

namespace strata {
namespace {

constexpr uint64_t kBytes = 100;

// One layer of n experts, expert 0 pinned, `slots` cache slots.
ExpertCacheConfig one_layer(int n, int slots, ExpertCachePolicy p) {
  ExpertCacheConfig c;
  c.pinned = {std::vector<int>(static_cast<size_t>(n), -1)};
  c.pinned[0][0] = 0;
  c.slots_per_layer = slots;
  c.policy = p;
  c.expert_bytes = {kBytes};
  return c;
}

// Picks of one layer: experts listed (each once), `times` picks each.
std::vector<uint64_t> picks(int n, std::initializer_list<int> experts, uint64_t times = 1) {
  std::vector<uint64_t> v(static_cast<size_t>(n), 0);
  for (int e : experts) v[static_cast<size_t>(e)] += times;
  return v;
}

// Runs between_steps and finishes every copy it started, then maps them with a second call (what the
// GPU side does once its copies' events completed). Returns the first call's plan.
ExpertCache::StepPlan admit_and_load(ExpertCache& c, uint64_t budget = 1000) {
  ExpertCache::StepPlan p = c.between_steps(budget);
  for (const auto& cp : p.copies) c.copy_done(cp.layer, cp.slot);
  const ExpertCache::StepPlan mapped = c.between_steps(0);
  EXPECT_EQ(mapped.writes.size(), p.copies.size());
  return p;
}

TEST(ExpertCache, PolicyNamesAndSlotCaps) {
  EXPECT_EQ(parse_expert_cache_policy("lru"), ExpertCachePolicy::Lru);
  EXPECT_EQ(parse_expert_cache_policy("lfu"), ExpertCachePolicy::Lfu);
  EXPECT_THROW(parse_expert_cache_policy("fifo"), Error);
  EXPECT_STREQ(expert_cache_policy_name(ExpertCachePolicy::Lfu), "lfu");
  // Layer 0: 2 of 4 cold; layer 1: dense (empty row); layer 2: all 4 cold.
  const std::vector<std::vector<int>> pinned = {{0, -1, 1, -1}, {}, {-1, -1, -1, -1}};
  EXPECT_EQ(expert_cache_slots_per_layer(pinned, 3), (std::vector<int>{2, 0, 3}));
  EXPECT_EQ(expert_cache_slots_per_layer(pinned, 0), (std::vector<int>{0, 0, 0}));
  EXPECT_THROW(expert_cache_slots_per_layer(pinned, -1), Error);
  ExpertCacheConfig c;
  c.pinned = pinned;
  c.slots_per_layer = 8;
  c.expert_bytes = {kBytes, 0, kBytes};
  ExpertCache cache(c);
  EXPECT_EQ(cache.cache_slots(0), 2);
  EXPECT_EQ(cache.cache_slots(1), 0);
  EXPECT_EQ(cache.cache_slots(2), 4);
  EXPECT_EQ(cache.pinned(0), 2);
  EXPECT_EQ(cache.pinned(2), 0);
  EXPECT_EQ(cache.total_cache_slots(), 6);
  c.pinned[0] = {1, 0, -1, -1};  // pinned slots out of order
  EXPECT_THROW(ExpertCache bad(c), Error);
}

TEST(ExpertCache, LruEvictsThePickLongestAgo) {
  ExpertCache c(one_layer(6, 2, ExpertCachePolicy::Lru));
  c.observe(picks(6, {1}), 6);
  auto p = admit_and_load(c);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].expert, 1);
  EXPECT_EQ(p.copies[0].slot, 1);  // cache slots follow the pinned one
  EXPECT_TRUE(p.writes.empty());   // a free slot: nothing to unmap
  c.observe(picks(6, {2}), 6);
  p = admit_and_load(c);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].slot, 2);
  EXPECT_EQ(c.slot_map(0)[1], 1);
  EXPECT_EQ(c.slot_map(0)[2], 2);
  // Expert 1 is picked again (a hit), then 3 misses: 2 was picked longest ago and goes.
  c.observe(picks(6, {1}), 6);
  c.observe(picks(6, {3}), 6);
  p = c.between_steps(1000);
  ASSERT_EQ(p.writes.size(), 1u);
  EXPECT_EQ(p.writes[0].expert, 2);
  EXPECT_EQ(p.writes[0].slot, -1);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].expert, 3);
  EXPECT_EQ(p.copies[0].slot, 2);
  EXPECT_EQ(c.stats().evictions, 1u);
  EXPECT_EQ(c.slot_map(0)[0], 0);  // the pinned expert is never a victim, though never picked
}

TEST(ExpertCache, LruDoesNotEvictWhatThisStepPicked) {
  ExpertCache c(one_layer(6, 1, ExpertCachePolicy::Lru));
  c.observe(picks(6, {1}), 6);
  admit_and_load(c);
  // 1 (resident) and 2 (a miss) in the same step: 2 is not worth more than 1.
  c.observe(picks(6, {1, 2}), 6);
  const auto p = c.between_steps(1000);
  EXPECT_TRUE(p.copies.empty());
  EXPECT_TRUE(p.writes.empty());
}

TEST(ExpertCache, LfuEvictsTheRarestAndAdmitsOnlyWhatBeatsIt) {
  ExpertCache c(one_layer(6, 2, ExpertCachePolicy::Lfu));
  c.observe(picks(6, {1}, 5), 6);
  admit_and_load(c);
  c.observe(picks(6, {2}, 2), 6);
  admit_and_load(c);
  // 1 is frequent but older, 2 recent but rare: a miss of 3 (5 picks, ahead of 2's by more than the
  // default margin) evicts 2, unlike LRU.
  c.observe(picks(6, {3}, 5), 6);
  auto p = c.between_steps(1000);
  ASSERT_EQ(p.writes.size(), 1u);
  EXPECT_EQ(p.writes[0].expert, 2);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].expert, 3);
  for (const auto& cp : p.copies) c.copy_done(cp.layer, cp.slot);
  c.between_steps(0);
  // A single pick of 4 beats neither 1 (~5) nor 3 (~5): not admitted.
  c.observe(picks(6, {4}, 1), 6);
  p = c.between_steps(1000);
  EXPECT_TRUE(p.copies.empty());
  EXPECT_TRUE(p.writes.empty());
}

// An LFU cache of one layer of 6 experts and 2 slots (half-life 8 steps) holding expert 1 at an aged
// count of ~0.6 and expert 2 at ~1.2, then a miss of one pick for expert 3.
ExpertCache aged_cache_after_a_miss(double admit_margin) {
  ExpertCacheConfig cfg = one_layer(6, 2, ExpertCachePolicy::Lfu);
  cfg.lfu_half_life = 8.0;
  cfg.admit_margin = admit_margin;
  ExpertCache c(cfg);
  c.observe(picks(6, {1}, 10), 6);
  admit_and_load(c);
  c.observe(picks(6, {2}, 3), 6);
  admit_and_load(c);
  // 32 quiet steps: 1's count of 10 ages to about 0.5, 2's 3 to about 0.2.
  for (int i = 0; i < 32; ++i) c.observe(picks(6, {}), 6);
  c.observe(picks(6, {2}, 1), 6);  // 2 refreshed to ~1.2
  c.observe(picks(6, {3}, 1), 6);  // a miss of weight 1, ahead of the aged 0.6 of expert 1
  return c;
}

TEST(ExpertCache, LfuCountsAge) {
  ExpertCache c = aged_cache_after_a_miss(0.0);  // the ageing alone decides here
  const auto p = c.between_steps(1000);
  ASSERT_EQ(p.writes.size(), 1u);
  EXPECT_EQ(p.writes[0].expert, 1);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].expert, 3);
}

TEST(ExpertCache, LfuAdmitsOnlyAMissClearlyAheadOfItsVictim) {
  // At a margin of one pick: the miss of one pick is ahead of the 0.6 but by less than the margin, so
  // nothing moves; a miss of two picks displaces it.
  ExpertCache c = aged_cache_after_a_miss(1.0);
  EXPECT_TRUE(c.between_steps(1000).copies.empty());
  c.observe(picks(6, {4}, 2), 6);
  const auto p = c.between_steps(1000);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].expert, 4);
  ASSERT_EQ(p.writes.size(), 1u);
  EXPECT_EQ(p.writes[0].expert, 1);
  EXPECT_EQ(p.writes[0].slot, -1);
}

TEST(ExpertCache, LfuDefaultMarginIsTwoPicks) {
  // The default margin (two picks): a miss of two picks does not displace the 0.6, one of three does.
  EXPECT_EQ(ExpertCacheConfig{}.admit_margin, 2.0);
  ExpertCache c = aged_cache_after_a_miss(ExpertCacheConfig{}.admit_margin);
  c.observe(picks(6, {4}, 2), 6);
  EXPECT_TRUE(c.between_steps(1000).copies.empty());
  c.observe(picks(6, {5}, 3), 6);
  const auto p = c.between_steps(1000);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(p.copies[0].expert, 5);
  ASSERT_EQ(p.writes.size(), 1u);
  EXPECT_EQ(p.writes[0].expert, 1);
}

TEST(ExpertCache, CopiesPerStepStayWithinTheBudget) {
  // Three layers of 8 experts, nothing pinned, 4 slots each: 12 misses at once.
  ExpertCacheConfig cfg;
  cfg.pinned.assign(3, std::vector<int>(8, -1));
  cfg.slots_per_layer = 4;
  cfg.expert_bytes = {kBytes, kBytes, kBytes};
  ExpertCache c(cfg);
  std::vector<uint64_t> all(24, 0);
  for (int l = 0; l < 3; ++l)
    for (int e = 0; e < 4; ++e) all[static_cast<size_t>(l * 8 + e)] = 1;
  c.observe(all, 8);
  auto p = c.between_steps(250);  // room for two copies, not three
  EXPECT_EQ(p.copies.size(), 2u);
  uint64_t bytes = 0;
  for (const auto& cp : p.copies) bytes += cp.bytes;
  EXPECT_LE(bytes, 250u);
  EXPECT_TRUE(c.between_steps(0).copies.empty());  // no budget: no copy
  p = c.between_steps(1000);
  EXPECT_EQ(p.copies.size(), 10u);  // the rest of the recent misses
  EXPECT_EQ(c.stats().copies, 12u);
  EXPECT_EQ(c.stats().bytes, 12 * kBytes);
}

TEST(ExpertCache, SlotMapChangesOnlyBetweenSteps) {
  ExpertCache c(one_layer(6, 1, ExpertCachePolicy::Lru));
  const std::vector<int> before = c.slot_map(0);
  c.observe(picks(6, {3}), 6);
  EXPECT_EQ(c.slot_map(0), before);
  auto p = c.between_steps(1000);
  ASSERT_EQ(p.copies.size(), 1u);
  EXPECT_EQ(c.slot_map(0), before);  // the copy is on its way: still cold
  EXPECT_EQ(c.resident(0), 1);
  // While the only slot fills, more misses start nothing (the slot is no victim) and map nothing.
  c.observe(picks(6, {4}, 9), 6);
  p = c.between_steps(1000);
  EXPECT_TRUE(p.copies.empty());
  EXPECT_TRUE(p.writes.empty());
  c.copy_done(0, 1);
  EXPECT_EQ(c.slot_map(0), before);  // finished, but mapped only by the next between_steps
  EXPECT_THROW(c.copy_done(0, 1), Error);  // no copy in flight any more
  p = c.between_steps(0);
  ASSERT_EQ(p.writes.size(), 1u);
  EXPECT_EQ(p.writes[0].expert, 3);
  EXPECT_EQ(p.writes[0].slot, 1);
  EXPECT_EQ(c.slot_map(0)[3], 1);
  EXPECT_EQ(c.resident(0), 2);
  EXPECT_THROW(c.copy_done(0, 0), Error);  // slot 0 is pinned
}

// Random traffic: the writes, applied in order to a copy of the map (what the device holds), always
// give the host's map; every cache slot holds at most one mapped expert; pinned entries never change.
TEST(ExpertCache, WritesReplayToTheHostMap) {
  for (ExpertCachePolicy policy : {ExpertCachePolicy::Lru, ExpertCachePolicy::Lfu}) {
    ExpertCacheConfig cfg;
    const int ne = 16;
    cfg.pinned = {std::vector<int>(ne, -1), {}, std::vector<int>(ne, -1)};
    for (int e = 0; e < 4; ++e) cfg.pinned[0][static_cast<size_t>(e)] = e;
    cfg.slots_per_layer = 5;
    cfg.policy = policy;
    cfg.expert_bytes = {kBytes, 0, 2 * kBytes};
    ExpertCache c(cfg);
    std::vector<std::vector<int>> device = cfg.pinned;
    std::mt19937 rng(7);
    std::vector<ExpertCache::Copy> in_flight;
    for (int step = 0; step < 400; ++step) {
      std::vector<uint64_t> p(3 * ne, 0);
      for (int l : {0, 2})
        for (int j = 0; j < 3; ++j) p[static_cast<size_t>(l * ne) + rng() % (step % 50 < 25 ? 8 : ne)] += 1;
      c.observe(p, ne);
      // Copies finish in a random order and after a random delay.
      std::shuffle(in_flight.begin(), in_flight.end(), rng);
      while (!in_flight.empty() && rng() % 2) {
        c.copy_done(in_flight.back().layer, in_flight.back().slot);
        in_flight.pop_back();
      }
      const auto plan = c.between_steps(rng() % 4 * kBytes);
      for (const auto& w : plan.writes) device[static_cast<size_t>(w.layer)][static_cast<size_t>(w.expert)] = w.slot;
      for (const auto& cp : plan.copies) in_flight.push_back(cp);
      for (int l = 0; l < 3; ++l) {
        ASSERT_EQ(device[static_cast<size_t>(l)], c.slot_map(l)) << "step " << step;
        std::vector<int> seen;
        for (int e = 0; e < static_cast<int>(device[static_cast<size_t>(l)].size()); ++e) {
          const int s = device[static_cast<size_t>(l)][static_cast<size_t>(e)];
          if (l == 0 && e < 4) {
            ASSERT_EQ(s, e);
          }
          if (s < 0) continue;
          ASSERT_LT(s, c.pinned(l) + c.cache_slots(l));
          seen.push_back(s);
          // A slot with its copy in flight is never mapped.
          for (const auto& cp : in_flight) ASSERT_FALSE(cp.layer == l && cp.slot == s) << "step " << step;
        }
        std::sort(seen.begin(), seen.end());
        ASSERT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "step " << step;
      }
    }
    EXPECT_GT(c.stats().copies, 0u);
    EXPECT_GT(c.stats().evictions, 0u);
  }
}

}  // namespace
}  // namespace strata
