#include "strata/engine/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "strata/base/error.h"
#include "strata/engine/bench_backend.h"
#include "strata/engine/session.h"

namespace strata {

Stats summarize(std::vector<double> v) {
  if (v.empty()) fail("bench: no samples to summarise");
  Stats s;
  s.values = v;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(n);
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.stddev = n > 1 ? std::sqrt(ss / static_cast<double>(n - 1)) : 0.0;
  return s;
}

std::vector<int32_t> bench_prompt(int n, int64_t n_vocab, uint64_t seed, int rep) {
  std::mt19937_64 rng(seed * 1000003ull + static_cast<uint64_t>(rep));
  std::uniform_int_distribution<int64_t> pick(0, n_vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = static_cast<int32_t>(pick(rng));
  return ids;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct OneRun {
  double prefill_s = 0, decode_s = 0;
};

OneRun run_once(BenchBackend& backend, const std::vector<int32_t>& prompt, int n_gen) {
  std::vector<float> logits(static_cast<size_t>(backend.n_vocab()));
  backend.reset();
  OneRun r;
  auto t0 = Clock::now();
  backend.forward(prompt.data(), static_cast<int>(prompt.size()), logits.data(), false);
  r.prefill_s = seconds_since(t0);
  for (float x : logits) {
    if (!std::isfinite(x)) fail("bench: the model produced a non-finite logit; timings would be meaningless");
  }
  t0 = Clock::now();
  int32_t next = argmax(logits.data(), backend.n_vocab());
  for (int i = 0; i < n_gen; ++i) next = backend.decode_greedy(next, logits.data());
  r.decode_s = seconds_since(t0);
  if (next < 0 || next >= backend.n_vocab()) fail("bench: greedy decode returned token ", next, " outside the vocabulary");
  return r;
}

}  // namespace

int32_t BenchBackend::decode_greedy(int32_t token, float* logits) {
  forward(&token, 1, logits, false);
  return argmax(logits, n_vocab());
}

BenchRun run_bench(BenchBackend& backend, const BenchParams& p) {
  if (p.n_prompt < 1) fail("bench: -p must be >= 1 (decode starts from the prompt's logits)");
  if (p.n_gen < 0) fail("bench: -n must be >= 0");
  if (p.reps < 1) fail("bench: -r must be >= 1");
  if (p.warmup) run_once(backend, bench_prompt(std::min(p.n_prompt, 16), backend.n_vocab(), p.seed, -1), std::min(p.n_gen, 2));
  BenchRun out;
  for (int rep = 0; rep < p.reps; ++rep) {
    const OneRun r = run_once(backend, bench_prompt(p.n_prompt, backend.n_vocab(), p.seed, rep), p.n_gen);
    out.ttft_ms.push_back(1e3 * r.prefill_s);
    out.prefill_tps.push_back(p.n_prompt / r.prefill_s);
    if (p.n_gen > 0) out.decode_tps.push_back(p.n_gen / r.decode_s);
  }
  out.greedy_on_device = backend.greedy_on_device();  // known once a step has run
  return out;
}

}  // namespace strata
