// Sampling cost per token at a real vocabulary size (Qwen3.5/3.6: 248,320 tokens), one core:
//   build/bench/bench_sampler
// Greedy (arg-max) against temperature alone, with top-p, and with top-k + top-p. With the GPU decode
// at ~3.6 ms per token on the 35B model, a sampling step of this cost on the host is a large share of
// a sampled token's time (docs/PERF.md).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "strata/sample/sampler.h"

namespace {

constexpr int32_t kVocab = 248320;

const std::vector<float>& base_logits() {
  static const std::vector<float> v = [] {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 3.0f);
    std::vector<float> l(kVocab);
    for (float& x : l) x = d(rng);
    return l;
  }();
  return v;
}

void run(benchmark::State& state, strata::SamplerParams p) {
  p.seed = 1;
  strata::Sampler s(p);
  std::vector<float> logits;
  const std::vector<int32_t> history;
  for (auto _ : state) {
    state.PauseTiming();
    logits = base_logits();  // the sampler edits logits in place
    state.ResumeTiming();
    benchmark::DoNotOptimize(s.sample(logits.data(), kVocab, history));
  }
}

void BM_Greedy(benchmark::State& state) {
  strata::SamplerParams p;
  p.temperature = 0.0f;
  run(state, p);
}
void BM_Temperature(benchmark::State& state) {
  strata::SamplerParams p;
  p.temperature = 0.7f;
  run(state, p);
}
void BM_TopP(benchmark::State& state) {
  strata::SamplerParams p;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  run(state, p);
}
void BM_TopKTopP(benchmark::State& state) {
  strata::SamplerParams p;
  p.temperature = 0.7f;
  p.top_k = 40;
  p.top_p = 0.9f;
  run(state, p);
}

}  // namespace

BENCHMARK(BM_Greedy)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Temperature)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopP)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopKTopP)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
