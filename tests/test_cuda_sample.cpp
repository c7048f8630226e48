// The GPU sampler (cuda/sample_kernels.h) against the host Sampler and a float64 reference: the same
// distribution (temperature, min-p, ids past n never drawn), the same token as the host Sampler for the
// same uniform draws, and GpuSession::decode_and_pick's sampled continuation equal to the host path's.
// Skips where CUDA is not built or no GPU exists.
#include <gtest/gtest.h>

#ifndef STRATA_HAVE_CUDA
TEST(CudaSample, Skipped) { GTEST_SKIP() << "built without CUDA (STRATA_HAVE_CUDA undefined)"; }
#else

#include <cuda_runtime.h>

#include <cmath>
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

// The logits on the device, their arg-max over the first n ids, and the sampler's scratch.
struct DeviceLogits {
  float* logits = nullptr;
  int* argmax = nullptr;
  int* out = nullptr;
  double* partial = nullptr;
  unsigned long long* part = nullptr;
  unsigned int* counter = nullptr;
  int64_t n = 0;
  DeviceLogits(const std::vector<float>& host, int64_t n_used) : n(n_used) {
    EXPECT_EQ(cudaMalloc(&logits, host.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(logits, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&argmax, sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out, sizeof(int)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&partial, sc::sample_partials(n) * sizeof(double)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&part, sc::argmax_wide_blocks(n) * sizeof(unsigned long long)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&counter, sizeof(unsigned int)), cudaSuccess);
    EXPECT_EQ(cudaMemset(counter, 0, sizeof(unsigned int)), cudaSuccess);
    sc::argmax_wide(logits, n, part, counter, argmax, nullptr);
  }
  ~DeviceLogits() {
    for (void* p : {static_cast<void*>(logits), static_cast<void*>(argmax), static_cast<void*>(out),
                    static_cast<void*>(partial), static_cast<void*>(part), static_cast<void*>(counter)})
      cudaFree(p);
  }
  int draw(double inv_t, double min_p, double u) {
    sc::sample_temperature(logits, n, argmax, inv_t, min_p, u, partial, out, nullptr);
    int id = -2;
    EXPECT_EQ(cudaMemcpy(&id, out, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
    return id;
  }
};

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Float64 reference: p_i proportional to exp(l_i / T) over the finite logits of ids < n, min-p relative
// to the best token, normalised.
std::vector<double> reference(const std::vector<float>& l, int64_t n, double temp, double min_p) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(l[i])) mx = std::max(mx, double(l[i]));
  std::vector<double> p(l.size(), 0.0);
  double z = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(l[i])) continue;
    const double q = std::exp((l[i] - mx) / temp);
    if (q >= min_p) p[i] = q, z += q;
  }
  for (double& q : p) q /= z;
  return p;
}

// Three chunks of ids (the kernel sums 2048 per block), banned ids, and a prefix that excludes the tail.
TEST(CudaSample, FrequenciesMatchTheDistribution) {
  REQUIRE_GPU();
  std::vector<float> l = random_logits(5000, 3);
  for (int i = 0; i < 5000; i += 97) l[i] = -std::numeric_limits<float>::infinity();
  const int64_t n = 4500;  // ids 4500.. never drawn
  DeviceLogits dev(l, n);
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  for (double min_p : {0.0, 0.02}) {
    const double temp = 1.7;
    const std::vector<double> want = reference(l, n, temp, min_p);
    std::vector<int> counts(l.size(), 0);
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) {
      const int id = dev.draw(1.0 / temp, min_p, uni(rng));
      ASSERT_GE(id, 0);
      ASSERT_LT(id, n);
      ++counts[static_cast<size_t>(id)];
    }
    for (size_t t = 0; t < l.size(); ++t) {
      if (want[t] == 0) {
        EXPECT_EQ(counts[t], 0) << "token " << t << " has probability 0 (min_p " << min_p << ")";
        continue;
      }
      const double mean = want[t] * draws, sd = std::sqrt(draws * want[t] * (1 - want[t]));
      EXPECT_NEAR(counts[t], mean, 5 * sd + 1) << "token " << t << " p=" << want[t] << " min_p " << min_p;
    }
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
  DeviceLogits empty(none, 100);
  EXPECT_EQ(empty.draw(1.0, 0.0, 0.5), -1);
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
  const std::vector<int32_t> gpu = continuation(true);
  EXPECT_EQ(gpu, continuation(true)) << "the same seed must repeat on the GPU";
  EXPECT_EQ(gpu, continuation(false)) << "the GPU draw must pick what the host Sampler picks";
}

}  // namespace

#endif
