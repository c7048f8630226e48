// CopyTeam (cpu/copy_team.h): every byte of every copy lands, for sizes that do not divide into blocks,
// sizes below one block and zero, over thousands of back-to-back copies into one reused destination (the
// streaming prefill's pattern), and the destination is never written after copy() returns.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "strata/cpu/copy_team.h"

namespace {

TEST(CopyTeam, EveryByteOfEveryCopy) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> src(3u << 20);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (int threads : {1, 2, 3, 8}) {
    strata::CopyTeam team(threads);
    EXPECT_EQ(team.n_threads(), threads);
    std::vector<uint8_t> dst(src.size() + 128);
    for (int i = 0; i < 3000; ++i) {
      const size_t n = i % 10 == 0 ? rng() % 130 : rng() % (src.size() - 64);
      const size_t from = rng() % (src.size() - n + 1);
      const uint8_t fill = static_cast<uint8_t>(i);
      std::fill(dst.begin(), dst.end(), fill);
      team.copy(dst.data() + 1, src.data() + from, n);  // odd destination alignment
      ASSERT_TRUE(std::equal(src.begin() + static_cast<std::ptrdiff_t>(from),
                             src.begin() + static_cast<std::ptrdiff_t>(from + n), dst.begin() + 1))
          << threads << " threads, copy " << i << " of " << n << " bytes";
      EXPECT_EQ(dst[0], fill);
      EXPECT_EQ(dst[n + 1], fill) << "a copy wrote past its end";
    }
  }
}

// Sizes at the block boundaries: one block, one byte either side of it, whole multiples and one past.
TEST(CopyTeam, BlockBoundaries) {
  constexpr size_t kBlock = size_t{256} << 10;
  std::vector<uint8_t> src(5 * kBlock + 1);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  strata::CopyTeam team(3);
  for (const size_t n : {size_t{0}, kBlock - 1, kBlock, kBlock + 1, 2 * kBlock, 4 * kBlock + 1, 5 * kBlock,
                         5 * kBlock + 1}) {
    std::vector<uint8_t> dst(src.size() + 1, 0xee);
    team.copy(dst.data(), src.data(), n);
    EXPECT_TRUE(std::equal(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(n), dst.begin())) << n << " bytes";
    EXPECT_EQ(dst[n], 0xee) << "a copy of " << n << " bytes wrote past its end";
  }
}

TEST(CopyTeam, NothingWritesAfterCopyReturns) {
  strata::CopyTeam team(4);
  std::vector<uint8_t> a(1u << 20, 1), b(1u << 20, 2), dst(1u << 20);
  for (int i = 0; i < 500; ++i) {
    team.copy(dst.data(), (i % 2 ? a : b).data(), dst.size());
    const uint8_t want = i % 2 ? 1 : 2;
    std::this_thread::sleep_for(std::chrono::microseconds(i % 7 == 0 ? 200 : 0));
    for (size_t j = 0; j < dst.size(); j += 4093) ASSERT_EQ(dst[j], want) << "copy " << i;
  }
}

TEST(CopyTeam, ZeroThreadsMeansTheCallerAlone) {
  strata::CopyTeam team(0);
  EXPECT_EQ(team.n_threads(), 1);
  const std::vector<uint8_t> src = {1, 2, 3};
  std::vector<uint8_t> dst(3);
  team.copy(dst.data(), src.data(), 3);
  EXPECT_EQ(dst, src);
}

}  // namespace
