// The prompt cache (engine/prompt_cache.h) against cold runs: a request restored from snapshots gives
// the logits and greedy tokens of a sequence that ran the whole prompt itself, bit for bit, for a prefix
// shorter than what was cached, another sequence's snapshots, an identical prompt, block-boundary prompt
// lengths, eviction under a tiny bound and sliding-window rings (laguna); bad restores change nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/engine/model.h"
#include "strata/engine/prompt_cache.h"
#include "strata/engine/session.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

const std::string kBundled = std::string(STRATA_SOURCE_DIR) + "/models/strata-tiny.gguf";

std::vector<int32_t> random_tokens(int n, int seed, int64_t n_vocab) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab));
  return t;
}

struct Answer {
  std::vector<float> logits;  // the prompt's last token
  std::vector<int32_t> greedy;
  int cached = 0;
};

constexpr int kGreedy = 6;

// What the server does with a prompt: restore the longest cached prefix (leaving the last token to run),
// prefill through the cache, run the last token, then decode greedily.
Answer serve(PromptCache* cache, Session& s, const std::vector<int32_t>& prompt) {
  Answer a;
  const int n = static_cast<int>(prompt.size());
  std::vector<float> scratch;
  if (cache) {
    s.reset();
    a.cached = cache->restore(s, prompt, n - 1);
    cache->prefill(s, prompt, n - 1, scratch);
  } else {
    s.reset();
    // A cold run: the whole prompt but its last token in one forward.
    if (n > 1) {
      scratch.resize(static_cast<size_t>(s.model().config().n_vocab));
      s.forward(prompt.data(), n - 1, scratch.data(), false);
    }
  }
  a.logits.resize(static_cast<size_t>(s.model().config().n_vocab));
  s.forward(&prompt.back(), 1, a.logits.data(), false);
  int32_t next = argmax(a.logits.data(), static_cast<int64_t>(a.logits.size()));
  std::vector<float> one(a.logits.size());
  for (int i = 0; i < kGreedy; ++i) {
    a.greedy.push_back(next);
    s.forward(&next, 1, one.data(), false);
    next = argmax(one.data(), static_cast<int64_t>(one.size()));
  }
  return a;
}

void expect_same(const Answer& got, const Answer& want, const std::string& what) {
  EXPECT_TRUE(got.logits == want.logits) << what << ": logits differ";
  EXPECT_EQ(got.greedy, want.greedy) << what;
}

class PromptCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = Model::load(kBundled).release(); }
  static void TearDownTestSuite() { delete model_; }
  static Model* model_;
  int64_t vocab() const { return model_->config().n_vocab; }
  Answer cold(const std::vector<int32_t>& prompt) {
    Session s(*model_, 1024);
    return serve(nullptr, s, prompt);
  }
};
Model* PromptCacheTest::model_ = nullptr;

TEST_F(PromptCacheTest, BundledModelHasRecurrentAndAttentionLayers) {
  bool deltanet = false, attention = false;
  for (int il = 0; il < model_->config().n_layer; ++il)
    (is_attention(model_->config().mixer(il)) ? attention : deltanet) = true;
  EXPECT_TRUE(deltanet && attention) << "the cache tests below are meant for a hybrid model";
}

TEST_F(PromptCacheTest, IdenticalPromptAndCrossSequence) {
  PromptCache cache(size_t(1) << 30, 64);
  const auto prompt = random_tokens(300, 1, vocab());
  Session a(*model_, 1024), b(*model_, 1024);
  const Answer first = serve(&cache, a, prompt);
  EXPECT_EQ(first.cached, 0);
  const Answer want = cold(prompt);
  expect_same(first, want, "first run through the cache");
  // The same prompt on another sequence that holds something else: all but the last token restored.
  serve(nullptr, b, random_tokens(100, 2, vocab()));
  const Answer again = serve(&cache, b, prompt);
  EXPECT_EQ(again.cached, 299);
  expect_same(again, want, "identical prompt, other sequence");
}

TEST_F(PromptCacheTest, PrefixShorterThanCached) {
  PromptCache cache(size_t(1) << 30, 64);
  const auto long_prompt = random_tokens(500, 3, vocab());
  Session a(*model_, 1024);
  serve(&cache, a, long_prompt);
  // Shares 300 tokens: the snapshot at 256 (a block boundary) is the longest usable one.
  auto prompt = long_prompt;
  prompt.resize(300);
  const auto tail = random_tokens(80, 4, vocab());
  prompt.insert(prompt.end(), tail.begin(), tail.end());
  const Answer got = serve(&cache, a, prompt);
  EXPECT_EQ(got.cached, 256);
  expect_same(got, cold(prompt), "prefix shorter than cached");
  // A continuation of the first prompt goes on from its end (one before it: the snapshot kept there).
  auto longer = long_prompt;
  const auto more = random_tokens(40, 5, vocab());
  longer.insert(longer.end(), more.begin(), more.end());
  const Answer cont = serve(&cache, a, longer);
  EXPECT_EQ(cont.cached, 499);
  expect_same(cont, cold(longer), "continuation");
}

TEST_F(PromptCacheTest, BlockBoundaryLengths) {
  const int block = 32;
  for (int n : {1, 2, block - 1, block, block + 1, 2 * block, 2 * block + 1, 3 * block - 1}) {
    PromptCache cache(size_t(1) << 30, block);
    const auto prompt = random_tokens(n, 100 + n, vocab());
    Session a(*model_, 1024), b(*model_, 1024);
    const Answer want = cold(prompt);
    expect_same(serve(&cache, a, prompt), want, "cold through the cache, n=" + std::to_string(n));
    const Answer again = serve(&cache, b, prompt);
    EXPECT_EQ(again.cached, n - 1) << n;
    expect_same(again, want, "identical, n=" + std::to_string(n));
    // One token more and one token fewer than the cached prompt.
    auto plus = prompt;
    plus.push_back(7);
    const Answer p = serve(&cache, b, plus);
    EXPECT_EQ(p.cached, n - 1) << n;  // the snapshot before the cached prompt's last token
    expect_same(p, cold(plus), "one more, n=" + std::to_string(n));
    if (n > 2) {
      auto minus = prompt;
      minus.pop_back();
      const Answer m = serve(&cache, b, minus);
      EXPECT_EQ(m.cached, ((n - 2) / block) * block) << n;
      expect_same(m, cold(minus), "one fewer, n=" + std::to_string(n));
    }
  }
}

TEST_F(PromptCacheTest, EvictionUnderATinyBound) {
  // Measure one prompt's snapshots, then bound the cache to about two prompts' worth.
  const int block = 64;
  size_t per_prompt = 0;
  {
    PromptCache probe(size_t(1) << 30, block);
    Session s(*model_, 1024);
    serve(&probe, s, random_tokens(200, 10, vocab()));
    per_prompt = probe.stats().bytes;
  }
  ASSERT_GT(per_prompt, 0u);
  PromptCache cache(per_prompt * 2 + per_prompt / 2, block);
  Session s(*model_, 1024);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) {
    prompts.push_back(random_tokens(200, 20 + i, vocab()));
    serve(&cache, s, prompts.back());
    EXPECT_LE(cache.stats().bytes, cache.max_bytes());
  }
  EXPECT_GT(cache.stats().evicted, 0u);
  // The oldest prompt is gone, the newest kept; either way the answer is a cold run's.
  const Answer old = serve(&cache, s, prompts[0]);
  EXPECT_EQ(old.cached, 0);
  expect_same(old, cold(prompts[0]), "evicted prompt");
  const Answer recent = serve(&cache, s, prompts[4]);
  EXPECT_EQ(recent.cached, 199);
  expect_same(recent, cold(prompts[4]), "kept prompt");
  // A bound below one snapshot keeps nothing and still answers right.
  PromptCache tiny(64, block);
  const Answer t = serve(&tiny, s, prompts[1]);
  EXPECT_EQ(tiny.stats().snapshots, 0u);
  expect_same(t, cold(prompts[1]), "nothing fits");
}

TEST_F(PromptCacheTest, BadRestoresChangeNothing) {
  EXPECT_THROW(PromptCache(0), Error);
  EXPECT_THROW(PromptCache(1024, 0), Error);
  Session a(*model_, 1024), small(*model_, 64);
  PromptCache cache(size_t(1) << 30, 64);
  const auto prompt = random_tokens(200, 30, vocab());
  serve(&cache, a, prompt);
  // Spans longer than a context are refused; the sequence keeps what it had.
  std::vector<float> logits(static_cast<size_t>(vocab()));
  small.forward(prompt.data(), 3, logits.data(), false);
  EXPECT_THROW(cache.restore(small, prompt, 199), Error);
  EXPECT_EQ(small.n_past(), 3);
}

// Sliding-window rings wrap: snapshots keep the whole ring, so restores are still exact.
TEST(PromptCacheLaguna, RingCachesRestoreExactly) {
  convert::SynthOptions o;
  o.preset = "tiny-laguna";
  o.quant = "f32";
  o.seed = 7;
  o.threads = 2;
  o.out_path = (fs::path(testing::TempDir()) / ("prompt_cache_laguna_" + std::to_string(getpid()) + ".gguf")).string();
  convert::synth_model(o);
  auto model = Model::load(o.out_path);
  const int ctx = 128;
  PromptCache cache(size_t(1) << 30, 8);
  Session a(*model, ctx, {}, 16), b(*model, ctx, {}, 16), cold_s(*model, ctx, {}, 16);
  ASSERT_LT(a.state().layers[1].rows, 40);  // the ring wraps within the prompts below
  const auto prompt = random_tokens(90, 40, model->config().n_vocab);
  const Answer want = serve(nullptr, cold_s, prompt);
  expect_same(serve(&cache, a, prompt), want, "laguna cold through the cache");
  const Answer again = serve(&cache, b, prompt);
  EXPECT_EQ(again.cached, 89);
  expect_same(again, want, "laguna identical");
  auto shorter = prompt;
  shorter.resize(61);
  const Answer s = serve(&cache, b, shorter);
  EXPECT_EQ(s.cached, 56);
  expect_same(s, serve(nullptr, cold_s, shorter), "laguna shorter");
  fs::remove(o.out_path);
}

}  // namespace
