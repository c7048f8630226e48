// matvec / matmul throughput per weight type and CPU kernel level.
// BM_Matmul args: {level, type id, n_tok}; the matrix is 2048 x 2048 (a qwen3.5 projection) so
// weights of quantised types stay near L3 size; reports weights/s and GFLOP/s.
// BM_ExpertMatvec: the cold-expert shapes (gate/up 512 x 2048, down 2048 x 512) as independent
// matvecs on `threads` OpenMP threads, each cycling through its own copies of the matrix (256 MiB
// in all: weights come from DRAM) or re-reading one copy (in cache: the kernels' own speed), with the
// fused int8 path on or off (off = unpack to int8 codes, then dot). weightGB/s counts all threads;
// perCoreGB/s divides by the thread count.
#include <benchmark/benchmark.h>

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
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

// Args: {level, type id, rows, cols, threads, fused (0/1), from DRAM (0/1)}. Each iteration runs
// kMatvecsPerIteration matvecs per thread (amortising the fork/join of the parallel region).
constexpr int kMatvecsPerIteration = 8;
void BM_ExpertMatvec(benchmark::State& state) {
  const auto level = static_cast<CpuKernelLevel>(state.range(0));
  const auto type = static_cast<GgmlType>(state.range(1));
  const int64_t rows = state.range(2), cols = state.range(3);
  const int threads = static_cast<int>(state.range(4));
  const bool fused = state.range(5) != 0, dram = state.range(6) != 0;
  if (!strata::cpu_supports(level)) {
    state.SkipWithError("kernel level not supported by this CPU");
    return;
  }
  strata::set_cpu_kernel_level(level);
  strata::set_cpu_fused_path(fused);
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = g(rng);
  const size_t rb = strata::row_bytes(type, cols), mb = rb * static_cast<size_t>(rows);
  // Copies: enough for 256 MiB when streaming from DRAM, else one per thread.
  const size_t copies = dram ? std::max<size_t>(static_cast<size_t>(threads), (size_t{256} << 20) / mb) : threads;
  std::vector<uint8_t> q(mb * copies);
  for (int64_t r = 0; r < rows; ++r) strata::quantize_row(type, w.data() + r * cols, q.data() + r * rb, cols);
  for (size_t c = 1; c < copies; ++c) std::copy(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(mb), q.begin() + c * mb);
  std::vector<float> x(static_cast<size_t>(cols * threads)), y(static_cast<size_t>(rows * threads));
  for (auto& v : x) v = g(rng);
  const size_t per_thread = copies / static_cast<size_t>(threads);
  std::vector<size_t> next(static_cast<size_t>(threads) * 16, 0);  // padded per-thread cursors
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);  // a matvec outside a parallel region (threads == 1) stays on this thread
  for (auto _ : state) {
#pragma omp parallel num_threads(threads)
    {
      const size_t t = static_cast<size_t>(omp_get_thread_num());
      size_t& i = next[16 * t];
      for (int rep = 0; rep < kMatvecsPerIteration; ++rep) {
        const size_t copy = t * per_thread + i;
        i = (i + 1) % per_thread;
        const strata::WeightMatrix m{type, q.data() + copy * mb, rows, cols, rb};
        strata::matvec(m, x.data() + t * static_cast<size_t>(cols), y.data() + t * static_cast<size_t>(rows));
      }
    }
    benchmark::DoNotOptimize(y.data());
  }
  omp_set_num_threads(saved_threads);
  strata::set_cpu_fused_path(true);
  state.SetLabel(std::string(strata::cpu_kernel_level_name(level)) + " " + strata::type_traits(type).name + " " +
                 std::to_string(rows) + "x" + std::to_string(cols) + (fused ? " fused" : " unpacked") +
                 (dram ? " dram" : " cache") + " t" + std::to_string(threads));
  const double bytes = static_cast<double>(mb) * threads * kMatvecsPerIteration;
  state.counters["weightGB/s"] =
      benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["perCoreGB/s"] = benchmark::Counter(bytes / threads, benchmark::Counter::kIsIterationInvariantRate,
                                                     benchmark::Counter::kIs1000);
}

// STRATA_BENCH_THREADS (default 1) adds a multi-thread run per case beside the single-thread one.
void ExpertArgs(benchmark::internal::Benchmark* b) {
  const char* env = std::getenv("STRATA_BENCH_THREADS");
  const int64_t many = env != nullptr ? std::atoi(env) : 1;
  struct Shape {
    GgmlType type;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{GgmlType::Q4_K, 512, 2048}, {GgmlType::Q5_K, 512, 2048}, {GgmlType::Q6_K, 512, 2048},
                          {GgmlType::Q4_K, 2048, 512}, {GgmlType::Q6_K, 2048, 512}, {GgmlType::Q8_0, 512, 2048}};
  for (int level = 1; level <= 2; ++level)
    for (const Shape& s : shapes)
      for (int fused = 1; fused >= 0; --fused)
        for (int dram = 0; dram <= 1; ++dram) {
          b->Args({level, static_cast<int64_t>(s.type), s.rows, s.cols, 1, fused, dram});
          if (many > 1 && dram) b->Args({level, static_cast<int64_t>(s.type), s.rows, s.cols, many, fused, dram});
        }
}

BENCHMARK(BM_ExpertMatvec)->Apply(ExpertArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
