// The one thread policy (engine/thread_policy.h): never more busy threads than cores unless forced.
#include <gtest/gtest.h>

#include "strata/base/error.h"
#include "strata/engine/thread_policy.h"

using namespace strata;

namespace {

constexpr uint64_t kSmall = 10ull << 20;
constexpr uint64_t kLarge = 4ull << 30;

TEST(ThreadPolicy, SmallModelGetsOneThreadPerSlot) {
  // The serve default on a 2-core machine used to give its one slot both cores for the bundled model.
  const ThreadPlan p = plan_threads({0, false, 1, kSmall}, 2);
  EXPECT_EQ(p.per_slot, 1);
  EXPECT_TRUE(p.warning.empty());
}

TEST(ThreadPolicy, LargeModelSharesTheCoresAmongSlots) {
  EXPECT_EQ(plan_threads({0, false, 1, kLarge}, 8).per_slot, 8);
  EXPECT_EQ(plan_threads({0, false, 4, kLarge}, 8).per_slot, 2);
  EXPECT_EQ(plan_threads({0, false, 3, kLarge}, 8).per_slot, 2);  // 6 busy threads, never 9
  EXPECT_EQ(plan_threads({0, false, 1, 0}, 8).per_slot, 8);      // unknown size: as large
}

TEST(ThreadPolicy, MoreThreadsThanCoresIsCappedWithAWarningUnlessForced) {
  const ThreadPlan capped = plan_threads({16, false, 1, kLarge}, 2);
  EXPECT_EQ(capped.per_slot, 2);
  EXPECT_NE(capped.warning.find("--threads 16"), std::string::npos) << capped.warning;
  EXPECT_NE(capped.warning.find("--threads-force"), std::string::npos) << capped.warning;
  const ThreadPlan forced = plan_threads({16, true, 1, kLarge}, 2);
  EXPECT_EQ(forced.per_slot, 16);
  EXPECT_TRUE(forced.warning.empty());
  EXPECT_EQ(plan_threads({2, false, 1, kLarge}, 2).per_slot, 2);
  EXPECT_TRUE(plan_threads({2, false, 1, kLarge}, 2).warning.empty());
}

TEST(ThreadPolicy, NeverMoreBusyThreadsThanCores) {
  for (int cores = 1; cores <= 16; ++cores)
    for (int slots = 1; slots <= cores; ++slots)
      for (int threads = 0; threads <= 40; threads += 3)
        for (uint64_t bytes : {kSmall, kLarge}) {
          const ThreadPlan p = plan_threads({threads, false, slots, bytes}, cores);
          EXPECT_LE(p.per_slot * slots, cores) << cores << " cores, " << slots << " slots, --threads " << threads;
          EXPECT_GE(p.per_slot, 1);
        }
}

TEST(ThreadPolicy, MoreSlotsThanCoresWarns) {
  const ThreadPlan p = plan_threads({0, false, 4, kLarge}, 2);
  EXPECT_EQ(p.per_slot, 1);
  EXPECT_NE(p.warning.find("4 slots on 2 cores"), std::string::npos) << p.warning;
}

TEST(ThreadPolicy, NegativeThreadsIsAnError) { EXPECT_THROW(plan_threads({-1, false, 1, 0}, 2), Error); }

}  // namespace
