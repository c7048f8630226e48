// The GPU sampler (cuda/sample_kernels.h) against the host Sampler and a float64 reference: the same
// distribution (temperature, top-k, top-p, min-p, ids past n never drawn), the same token as the host
// Sampler for the same uniform draws (cuts through runs of equal logits included), and
// GpuSession::decode_and_pick's sampled continuation equal to the host path's.
// Skips where CUDA is not built or no GPU exists.
#include <gtest/gtest.h>

#ifndef STRATA_HAVE_CUDA
TEST(CudaSample, Skipped) { GTEST_SKIP() << "built without CUDA (STRATA_HAVE_CUDA undefined)"; }
#else

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "cuda_test_models.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/kernels.h"
#include "strata/cuda/sample_kernels.h"
#include "strata/engine/model.h"
#include "strata/sample/sampler.h"

namespace {

namespace sc = strata::cuda;
using strata::cuda_test::Dev;

// The logits on the device, their arg-max over the first n ids, and the sampler's scratch (zeroed, as
// sample_token requires; the arg-max counter too).
struct DeviceLogits {
  Dev<float> logits;
  Dev<int> argmax, out;
  Dev<unsigned char> scratch;
  Dev<unsigned long long> part;
  Dev<unsigned int> counter;
  int64_t n = 0;
  DeviceLogits(const std::vector<float>& host, int64_t n_used)
      : logits(host), argmax(1), out(1), scratch(std::vector<unsigned char>(sc::sample_scratch_bytes(n_used), 0)),
        part(static_cast<size_t>(sc::argmax_wide_blocks(n_used))), counter(std::vector<unsigned int>{0u}), n(n_used) {
    sc::argmax_wide(logits.p, n, part.p, counter.p, argmax.p, nullptr, true);  // the sampler's reference
  }
  int draw(double inv_t, double min_p, double u) {
    sc::GpuSampling p;
    p.inv_temperature = inv_t;
    p.min_p = min_p;
    return draw(p, u);
  }
  int draw(const sc::GpuSampling& p, double u) {
    sc::sample_token(logits.p, n, argmax.p, p, u, scratch.p, out.p, nullptr);
    return out.get()[0];
  }
};

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Float64 reference with top-k and top-p: candidates by larger logit then lower id, the k best, then the
// shortest best-first prefix whose mass reaches top_p of theirs, then min-p; normalised.
std::vector<double> reference_cut(const std::vector<float>& l, int64_t n, double temp, int top_k, double top_p,
                                  double min_p) {
  std::vector<int> ids;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(l[i])) ids.push_back(static_cast<int>(i));
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  if (top_k > 0 && static_cast<size_t>(top_k) < ids.size()) ids.resize(static_cast<size_t>(top_k));
  const double mx = l[ids[0]];
  std::vector<double> q(ids.size());
  long double total = 0;
  for (size_t i = 0; i < ids.size(); ++i) total += q[i] = std::exp((l[ids[i]] - mx) / temp);
  size_t m = ids.size();
  if (top_p < 1.0) {
    long double acc = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      acc += q[i];
      if (acc >= top_p * total) {
        m = i + 1;
        break;
      }
    }
  }
  std::vector<double> p(l.size(), 0.0);
  double z = 0;
  for (size_t i = 0; i < m; ++i)
    if (q[i] >= min_p) p[static_cast<size_t>(ids[i])] = q[i], z += q[i];
  for (double& v : p) v /= z;
  return p;
}

// Draw frequencies against a float64 distribution (5 sd), and no draw outside its support.
void expect_frequencies(DeviceLogits& dev, const sc::GpuSampling& p, const std::vector<double>& want, int draws,
                        uint64_t seed, const char* what) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::vector<int> counts(want.size(), 0);
  for (int i = 0; i < draws; ++i) {
    const int id = dev.draw(p, uni(rng));
    ASSERT_GE(id, 0) << what;
    ASSERT_LT(id, dev.n) << what;
    ++counts[static_cast<size_t>(id)];
  }
  for (size_t t = 0; t < want.size(); ++t) {
    if (want[t] == 0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " is outside the kept set (" << what << ")";
      continue;
    }
    const double mean = want[t] * draws, sd = std::sqrt(draws * want[t] * (1 - want[t]));
    EXPECT_NEAR(counts[t], mean, 5 * sd + 1) << "token " << t << " p=" << want[t] << " (" << what << ")";
  }
}

// Three chunks of ids (the kernel sums 2048 per block), banned ids, and a prefix that excludes the tail.
TEST(CudaSample, FrequenciesMatchTheDistribution) {
  REQUIRE_GPU();
  std::vector<float> l = random_logits(5000, 3);
  for (int i = 0; i < 5000; i += 97) l[i] = -std::numeric_limits<float>::infinity();
  const int64_t n = 4500;  // ids 4500.. never drawn
  DeviceLogits dev(l, n);
  for (double min_p : {0.0, 0.02}) {
    const double temp = 1.7;
    sc::GpuSampling p;
    p.inv_temperature = 1.0 / temp;
    p.min_p = min_p;
    const std::string what = "min_p " + std::to_string(min_p);
    expect_frequencies(dev, p, reference_cut(l, n, temp, 0, 1.0, min_p), 20000, 11, what.c_str());
  }
}

// For the same uniform draws the GPU picks what the host Sampler picks (temperature, with and without
// min-p, over a real vocabulary size).
TEST(CudaSample, SameTokensAsTheHostSamplerForTheSameDraws) {
  REQUIRE_GPU();
  const std::vector<float> l = random_logits(248320, 5);
  DeviceLogits dev(l, static_cast<int64_t>(l.size()));
  for (float min_p : {0.0f, 0.05f}) {
    strata::SamplerParams p;
    p.temperature = 0.9f;
    p.min_p = min_p;
    p.seed = 21;
    strata::Sampler host(p), twin(p);
    int same = 0;
    for (int i = 0; i < 300; ++i) {
      std::vector<float> copy = l;
      const int32_t want = host.sample(copy.data(), static_cast<int32_t>(copy.size()), {});
      const int got = dev.draw(1.0 / 0.9, min_p, twin.draw_uniform());
      same += got == want;
    }
    // Only a draw within rounding of a boundary may differ (the sums run in other orders).
    EXPECT_GE(same, 299) << "min_p " << min_p;
  }
}

TEST(CudaSample, EdgesOfTheDrawAndNothingToDraw) {
  REQUIRE_GPU();
  std::vector<float> l(3000, -std::numeric_limits<float>::infinity());
  l[10] = 1.0f, l[2500] = 1.0f, l[2999] = 5.0f;
  DeviceLogits dev(l, 2999);  // id 2999 is past n
  EXPECT_EQ(dev.draw(1.0, 0.0, 0.0), 10) << "u = 0: the first id with mass";
  EXPECT_EQ(dev.draw(1.0, 0.0, std::nextafter(1.0, 0.0)), 2500) << "u -> 1: the last id with mass below n";
  std::vector<float> none(100, -std::numeric_limits<float>::infinity());
  none[7] = std::numeric_limits<float>::quiet_NaN();
  DeviceLogits empty(none, 100);
  EXPECT_EQ(empty.draw(1.0, 0.0, 0.5), -1) << "nothing finite: nothing drawn (the host Sampler fails)";
  // NaN and +inf are not candidates (the host Sampler keeps finite logits only), with or without a cut.
  std::vector<float> odd(4000, -std::numeric_limits<float>::infinity());
  odd[5] = std::numeric_limits<float>::quiet_NaN(), odd[6] = std::numeric_limits<float>::infinity();
  odd[100] = 1.0f, odd[3000] = 2.0f;
  DeviceLogits dodd(odd, 4000);
  sc::GpuSampling cut;
  cut.top_p = 0.999;
  for (double u : {0.0, 0.3, 0.7, std::nextafter(1.0, 0.0)}) {
    const int a = dodd.draw(1.0, 0.0, u), b = dodd.draw(cut, u);
    EXPECT_TRUE(a == 100 || a == 3000) << u;
    EXPECT_TRUE(b == 100 || b == 3000) << u;
  }
}

// Top-k and top-p cut where the float64 reference does, alone, together and with min-p, on three chunks
// of ids with banned tokens and a prefix; the draws follow the reference distribution.
TEST(CudaSample, TopKAndTopPKeepTheReferenceSet) {
  REQUIRE_GPU();
  std::vector<float> l = random_logits(5000, 7);
  for (int i = 0; i < 5000; i += 89) l[i] = -std::numeric_limits<float>::infinity();
  const int64_t n = 4700;
  DeviceLogits dev(l, n);
  struct Case {
    int top_k;
    double top_p, min_p;
  };
  for (const Case& c : {Case{40, 1.0, 0.0}, Case{0, 0.9, 0.0}, Case{300, 0.5, 0.0}, Case{0, 0.95, 0.01},
                        Case{1, 1.0, 0.0}, Case{10000, 1.0, 0.0}}) {
    sc::GpuSampling p;
    p.inv_temperature = 1.0 / 0.8;
    p.top_k = c.top_k, p.top_p = c.top_p, p.min_p = c.min_p;
    const std::vector<double> want = reference_cut(l, n, 0.8, c.top_k, c.top_p, c.min_p);
    const std::string what = "top_k " + std::to_string(c.top_k) + " top_p " + std::to_string(c.top_p) + " min_p " +
                             std::to_string(c.min_p);
    expect_frequencies(dev, p, want, 20000, 13 + c.top_k, what.c_str());
  }
}

// Runs of equal logits at the cut: the host keeps the lowest ids of the run first (its sort), so must the
// GPU; for the same uniform draws both pick the same token.
TEST(CudaSample, CutsThroughEqualLogitsTakeTheLowestIds) {
  REQUIRE_GPU();
  std::vector<float> l = random_logits(7000, 9);
  for (float& v : l) v *= 0.3f;                      // about 19 random logits above 2.5
  for (int i = 100; i < 7000; i += 37) l[i] = 2.5f;  // a run of 187 equal logits below those
  for (int i = 0; i < 7000; i += 53) l[i] = 6.0f;    // and one of 133 at the top (about 57% of the mass)
  DeviceLogits dev(l, 7000);
  struct Case {
    int top_k;
    float top_p;
  };
  for (const Case& c : {Case{100, 1.0f}, Case{200, 1.0f}, Case{0, 0.3f}, Case{0, 0.6f}, Case{170, 0.99f}}) {
    strata::SamplerParams sp;
    sp.temperature = 1.3f;
    sp.top_k = c.top_k;
    sp.top_p = c.top_p;
    sp.seed = 5;
    strata::Sampler host(sp), twin(sp);
    sc::GpuSampling p;
    p.inv_temperature = 1.0 / static_cast<double>(1.3f);  // the host's 1 / (double)temperature
    p.top_k = c.top_k, p.top_p = c.top_p;
    int same = 0;
    std::vector<int> seen(l.size(), 0);
    for (int i = 0; i < 400; ++i) {
      std::vector<float> copy = l;
      const int32_t want = host.sample(copy.data(), static_cast<int32_t>(copy.size()), {});
      const int got = dev.draw(p, twin.draw_uniform());
      ASSERT_GE(got, 0);
      same += got == want;
      ++seen[static_cast<size_t>(got)];
    }
    EXPECT_GE(same, 399) << "top_k " << c.top_k << " top_p " << c.top_p;
    const std::vector<double> want = reference_cut(l, 7000, 1.3, c.top_k, c.top_p, 0.0);
    for (size_t t = 0; t < l.size(); ++t) {
      if (want[t] == 0) {
        EXPECT_EQ(seen[t], 0) << "token " << t << " outside the kept set";
      }
    }
  }
}

// The host Sampler's tokens for the same draws at a real vocabulary size, with the run's default top-p.
TEST(CudaSample, TopPSameTokensAsTheHostSamplerAtAFullVocabulary) {
  REQUIRE_GPU();
  std::vector<float> l = random_logits(248320, 17);
  for (int i = 0; i < 40; ++i) l[static_cast<size_t>(i) * 6007] += 12.0f + 0.25f * i;  // a peaked head, as a model's
  DeviceLogits dev(l, static_cast<int64_t>(l.size()));
  for (const auto& [top_k, top_p] : std::vector<std::pair<int, float>>{{0, 0.9f}, {40, 0.95f}, {0, 0.999f}}) {
    strata::SamplerParams sp;
    sp.temperature = 0.7f;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.seed = 23;
    strata::Sampler host(sp), twin(sp);
    sc::GpuSampling p;
    p.inv_temperature = 1.0 / static_cast<double>(0.7f);
    p.top_k = top_k, p.top_p = top_p;
    int same = 0;
    for (int i = 0; i < 200; ++i) {
      std::vector<float> copy = l;
      const int32_t want = host.sample(copy.data(), static_cast<int32_t>(copy.size()), {});
      same += dev.draw(p, twin.draw_uniform()) == want;
    }
    EXPECT_GE(same, 199) << "top_k " << top_k << " top_p " << top_p;
  }
}

// GpuSession::decode_and_pick samples on the device: a seeded continuation equals the host path's
// (the default Sequence::decode_and_pick: logits copied, host Sampler), and repeats with the same seed.
TEST(CudaSample, DecodeAndPickSamplesLikeTheHostPath) {
  REQUIRE_GPU();
  const std::string tiny = (std::filesystem::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf").string();
  auto model = strata::Model::load(tiny);
  const int32_t vocab = static_cast<int32_t>(model->config().n_vocab);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 8; ++i) prompt.push_back((i * 7919 + 13) % vocab);
  strata::SamplerParams p;
  p.temperature = 0.8f;
  p.min_p = 0.01f;
  p.seed = 3;
  auto continuation = [&](bool device) {
    sc::GpuSession s(*model, 64);
    std::vector<float> logits(static_cast<size_t>(vocab)), scratch;
    s.forward(prompt.data(), 8, logits.data(), false);
    strata::Sampler sampler(p);
    std::vector<int32_t> out, history = prompt;
    int32_t tok = prompt.back();
    for (int i = 0; i < 24; ++i) {
      tok = device ? s.decode_and_pick(tok, sampler, history, vocab - 3, scratch)
                   : s.Sequence::decode_and_pick(tok, sampler, history, vocab - 3, scratch);
      EXPECT_LT(tok, vocab - 3);
      out.push_back(tok);
      history.push_back(tok);
    }
    return out;
  };
  for (const auto& [top_k, top_p] : std::vector<std::pair<int, float>>{{0, 1.0f}, {0, 0.9f}, {20, 0.95f}}) {
    p.top_k = top_k;
    p.top_p = top_p;
    const std::vector<int32_t> gpu = continuation(true);
    EXPECT_EQ(gpu, continuation(true)) << "the same seed must repeat on the GPU (top_k " << top_k << ")";
    EXPECT_EQ(gpu, continuation(false)) << "the GPU draw must pick what the host Sampler picks (top_p " << top_p << ")";
  }
}

}  // namespace

#endif
