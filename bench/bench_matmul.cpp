// matvec / matmul throughput per weight type and CPU kernel level.
// Args: {level, type id, n_tok}; the matrix is 2048 x 2048 (a qwen3.5 projection) so weights of
// quantised types stay near L3 size; reports weights/s and GFLOP/s.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/matmul.h"
#include "strata/quant/quantize.h"

namespace {

using strata::CpuKernelLevel;
using strata::GgmlType;

void BM_Matmul(benchmark::State& state) {
  const auto level = static_cast<CpuKernelLevel>(state.range(0));
  const auto type = static_cast<GgmlType>(state.range(1));
  const int64_t n_tok = state.range(2);
  if (!strata::cpu_supports(level)) {
    state.SkipWithError("kernel level not supported by this CPU");
    return;
  }
  strata::set_cpu_kernel_level(level);
  const int64_t rows = 2048, cols = 2048;
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = g(rng);
  const size_t rb = strata::row_bytes(type, cols);
  std::vector<uint8_t> q(rb * rows);
  for (int64_t r = 0; r < rows; ++r) strata::quantize_row(type, w.data() + r * cols, q.data() + r * rb, cols);
  std::vector<float> x(static_cast<size_t>(n_tok * cols)), y(static_cast<size_t>(n_tok * rows));
  for (auto& v : x) v = g(rng);
  const strata::WeightMatrix m{type, q.data(), rows, cols, rb};
  for (auto _ : state) {
    strata::matmul(m, x.data(), n_tok, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetLabel(std::string(strata::cpu_kernel_level_name(level)) + " " + strata::type_traits(type).name);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * n_tok, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.counters["weightGB/s"] = benchmark::Counter(static_cast<double>(q.size()), benchmark::Counter::kIsIterationInvariantRate,
                                                    benchmark::Counter::kIs1000);
}

void Args(benchmark::internal::Benchmark* b) {
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  for (int level = 0; level <= 2; ++level)
    for (GgmlType t : types)
      for (int64_t n_tok : {1, 64}) b->Args({level, static_cast<int64_t>(t), n_tok});
}

BENCHMARK(BM_Matmul)->Apply(Args)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
