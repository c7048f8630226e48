// The timing loop of `strata bench`, in the manner of llama-bench: per repetition a fresh sequence,
// a prefill of p seeded random tokens (prefill tok/s; time to first token = time to the first logits),
// then n greedy decode steps (decode tok/s). Statistics over the repetitions after one warm-up.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

class BenchBackend;

struct BenchParams {
  int n_prompt = 512;  // -p
  int n_gen = 128;     // -n
  int reps = 5;        // -r
  uint64_t seed = 1234;
  bool warmup = true;
};

struct Stats {
  double median = 0, mean = 0, stddev = 0, min = 0, max = 0;
  std::vector<double> values;
};
// Throws on an empty sample.
Stats summarize(std::vector<double> values);

struct BenchRun {
  std::vector<double> prefill_tps, decode_tps, ttft_ms;
  bool greedy_on_device = false;  // decode steps picked their token on the device (BenchBackend)
};

// Validates params (p >= 1, n >= 0, r >= 1) and times r repetitions.
BenchRun run_bench(BenchBackend& backend, const BenchParams& params);

// The prompt of repetition `rep`: n ids uniform in [0, n_vocab), from (seed, rep).
std::vector<int32_t> bench_prompt(int n, int64_t n_vocab, uint64_t seed, int rep);

}  // namespace strata
