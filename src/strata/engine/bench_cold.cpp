#include "strata/engine/bench_cold.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>

#include "strata/base/error.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/quant/quantize.h"

namespace strata {
namespace {

// Distinct random rows each matrix repeats (enough that neighbouring rows differ).
constexpr int kDistinctRows = 61;

ExpertStack stack_at(GgmlType type, const uint8_t* data, int64_t rows, int64_t cols, int n_expert) {
  ExpertStack s;
  s.first = WeightMatrix{type, data, rows, cols, row_bytes(type, cols)};
  s.expert_stride = s.first.row_stride * static_cast<size_t>(rows);
  s.n_expert = n_expert;
  return s;
}

size_t matrix_bytes(const ExpertStack& s) { return s.first.row_stride * static_cast<size_t>(s.first.n_rows); }

// Quantised random rows of n values (normal, sd 0.02 like a trained model's weights).
std::vector<uint8_t> random_rows(GgmlType type, int64_t n, std::mt19937_64& rng) {
  const size_t rb = row_bytes(type, n);
  std::vector<uint8_t> out(rb * kDistinctRows);
  std::normal_distribution<float> g(0.0f, 0.02f);
  std::vector<float> row(static_cast<size_t>(n));
  for (int r = 0; r < kDistinctRows; ++r) {
    for (float& v : row) v = g(rng);
    quantize_row(type, row.data(), out.data() + rb * static_cast<size_t>(r), n);
  }
  return out;
}

// Fills n_rows rows of rb bytes at dst from the distinct rows, starting at a different one per matrix.
void fill_rows(uint8_t* dst, int64_t n_rows, size_t rb, const std::vector<uint8_t>& src, int64_t salt) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_rows; ++r)
    std::memcpy(dst + static_cast<size_t>(r) * rb, src.data() + static_cast<size_t>((r + salt) % kDistinctRows) * rb,
                rb);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void SyntheticExperts::Free::operator()(uint8_t* p) const { std::free(p); }

SyntheticExperts::SyntheticExperts(GgmlType type, int64_t d, int64_t ff, int n_expert, int n_layer, uint64_t seed) {
  if (d <= 0 || ff <= 0 || n_expert <= 0 || n_layer <= 0)
    fail("synthetic experts: bad shape ", d, " x ", ff, ", ", n_expert, " experts, ", n_layer, " layers");
  const size_t rb_d = row_bytes(type, d), rb_ff = row_bytes(type, ff);  // throw on partial blocks
  const size_t per_expert = 2 * rb_d * static_cast<size_t>(ff) + rb_ff * static_cast<size_t>(d);
  const size_t per_matrix_stack_gu = rb_d * static_cast<size_t>(ff) * static_cast<size_t>(n_expert);
  const size_t per_matrix_stack_dn = rb_ff * static_cast<size_t>(d) * static_cast<size_t>(n_expert);
  bytes_ = per_expert * static_cast<size_t>(n_expert) * static_cast<size_t>(n_layer);
  // Page-aligned, as a mapped file's tensors are at least 32-byte aligned.
  const size_t alloc = (bytes_ + 4095) / 4096 * 4096;
  data_.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, alloc)));
  if (!data_) fail("synthetic experts: cannot allocate ", alloc, " bytes");
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> rows_d = random_rows(type, d, rng), rows_ff = random_rows(type, ff, rng);
  uint8_t* p = data_.get();
  for (int l = 0; l < n_layer; ++l) {
    ExpertFfn w;
    w.gate = stack_at(type, p, ff, d, n_expert);
    fill_rows(p, ff * n_expert, rb_d, rows_d, 3 * l);
    p += per_matrix_stack_gu;
    w.up = stack_at(type, p, ff, d, n_expert);
    fill_rows(p, ff * n_expert, rb_d, rows_d, 3 * l + 1);
    p += per_matrix_stack_gu;
    w.down = stack_at(type, p, d, ff, n_expert);
    fill_rows(p, d * n_expert, rb_ff, rows_ff, 3 * l + 2);
    p += per_matrix_stack_dn;
    layers_.push_back(w);
  }
}

size_t cold_expert_bytes(const ExpertFfn& w) {
  return matrix_bytes(w.gate) + matrix_bytes(w.up) + matrix_bytes(w.down);
}

ColdBenchResult bench_cold_experts(ColdExpertPool& pool, const std::vector<ExpertFfn>& layers,
                                   const ColdBenchOptions& opt) {
  if (layers.empty()) fail("bench-cold: no expert layers");
  const ExpertFfn& w0 = layers.front();
  const int n_expert = w0.gate.n_expert;
  const int k = opt.picks;
  if (k < 1 || k > n_expert) fail("bench-cold: ", k, " picks per job with ", n_expert, " experts per layer");
  for (const ExpertFfn& w : layers)
    if (w.gate.n_expert != n_expert || w.gate.first.n_cols != w0.gate.first.n_cols ||
        w.gate.first.n_rows != w0.gate.first.n_rows)
      fail("bench-cold: the layers' expert stacks differ in shape");
  const int64_t d = w0.gate.first.n_cols;

  // One cold cycle: per round, each layer in turn takes the next k experts of its own shuffled order,
  // so consecutive jobs read different layers (as decode does) and a cycle reads every expert once.
  std::mt19937_64 rng(opt.seed);
  const int n_layer = static_cast<int>(layers.size());
  const int rounds = n_expert / k;
  std::vector<std::vector<int>> order(static_cast<size_t>(n_layer), std::vector<int>(static_cast<size_t>(n_expert)));
  for (auto& o : order) {
    std::iota(o.begin(), o.end(), 0);
    std::shuffle(o.begin(), o.end(), rng);
  }
  std::vector<float> xn(static_cast<size_t>(d));
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (float& v : xn) v = g(rng);
  std::vector<float> out(static_cast<size_t>(k) * static_cast<size_t>(d));
  std::vector<ColdPick> picks(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) picks[static_cast<size_t>(i)].out = out.data() + static_cast<size_t>(i) * static_cast<size_t>(d);
  const auto run_job = [&](int64_t job) {
    const int l = static_cast<int>(job % n_layer);
    const int r = static_cast<int>((job / n_layer) % rounds);
    for (int i = 0; i < k; ++i)
      picks[static_cast<size_t>(i)].expert = order[static_cast<size_t>(l)][static_cast<size_t>(r * k + i)];
    pool.run(layers[static_cast<size_t>(l)], xn.data(), picks.data(), k);
  };

  ColdBenchResult res;
  res.picks = k;
  res.threads = pool.n_threads();
  res.bytes_per_job = static_cast<double>(k) * static_cast<double>(cold_expert_bytes(w0));
  const int64_t cycle = static_cast<int64_t>(rounds) * n_layer;
  res.working_set_bytes = static_cast<double>(cycle) * res.bytes_per_job;

  for (int64_t j = 0; j < cycle; ++j) run_job(j);  // pages in, warms the pool
  std::vector<double> times;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t job = 0;
  while (seconds_since(t0) < opt.seconds || job < cycle) {
    const auto tj = std::chrono::steady_clock::now();
    run_job(job++);
    times.push_back(seconds_since(tj));
  }
  const double cold_s = seconds_since(t0);
  res.cold_jobs = job;
  res.cold_ms_per_job = 1e3 * cold_s / static_cast<double>(job);
  res.cold_gbs = res.bytes_per_job * static_cast<double>(job) / cold_s / 1e9;
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
  res.cold_median_ms = 1e3 * times[times.size() / 2];

  // Cached: the first job's experts over and over.
  run_job(0);
  const auto t1 = std::chrono::steady_clock::now();
  int64_t n = 0;
  while (seconds_since(t1) < opt.seconds / 4 || n < 16) {
    pool.run(layers.front(), xn.data(), picks.data(), k);
    ++n;
  }
  const double cached_s = seconds_since(t1);
  res.cached_jobs = n;
  res.cached_ms_per_job = 1e3 * cached_s / static_cast<double>(n);
  res.cached_gbs = res.bytes_per_job * static_cast<double>(n) / cached_s / 1e9;
  return res;
}

BatchBenchResult bench_batched_experts(const std::vector<ExpertFfn>& layers, int tokens, int threads, bool dram,
                                       double seconds) {
  if (layers.empty()) fail("bench-cold: no expert layers");
  if (tokens < 1 || threads < 1) fail("bench-cold: --batch needs tokens >= 1 and threads >= 1");
  const ExpertFfn& w0 = layers.front();
  const int64_t d = w0.gate.first.n_cols, ff = w0.gate.first.n_rows;
  const size_t ut = static_cast<size_t>(tokens);
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> X(ut * static_cast<size_t>(d)), H(ut * static_cast<size_t>(ff));
  for (float& v : X) v = g(rng);
  for (float& v : H) v = g(rng);
  std::vector<float> G(H.size()), U(H.size()), Y(X.size());
  const int64_t n_expert = w0.gate.n_expert, n_layer = static_cast<int64_t>(layers.size());
  const auto run = [&](int64_t job) {
    const ExpertFfn& w = dram ? layers[static_cast<size_t>(job % n_layer)] : w0;
    const int e = dram ? static_cast<int>((job / n_layer) % n_expert) : 0;
    matmul(w.gate.expert(e), X.data(), tokens, G.data());
    matmul(w.up.expert(e), X.data(), tokens, U.data());
    matmul(w.down.expert(e), H.data(), tokens, Y.data());
  };
  const double ops = 2.0 * static_cast<double>(tokens) * 3.0 * static_cast<double>(d) * static_cast<double>(ff);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const bool saved_tiles = cpu_tile_path();
  BatchBenchResult res;
  res.tokens = tokens;
  res.threads = threads;
  res.dram = dram;
  int64_t job = 0;
  // Rounds alternate the two kernels so that drifting clocks or neighbours hit both alike.
  double time[2] = {0, 0};
  int64_t jobs[2] = {0, 0};
  const int rounds = 4;
  for (int r = 0; r < 2 * rounds + 2; ++r) {
    const int which = r % 2;  // 0: per token, 1: tiles
    set_cpu_tile_path(which == 1);
    const bool warm = r < 2;
    const auto t0 = std::chrono::steady_clock::now();
    int64_t n = 0;
    while (seconds_since(t0) < (warm ? 0.1 : seconds / (2 * rounds)) || n < 2) {
      run(job++);
      ++n;
    }
    if (!warm) {
      time[which] += seconds_since(t0);
      jobs[which] += n;
    }
  }
  set_cpu_tile_path(saved_tiles);
  omp_set_num_threads(saved);
  res.per_token_gops = ops * static_cast<double>(jobs[0]) / time[0] / 1e9;
  res.tiles_gops = ops * static_cast<double>(jobs[1]) / time[1] / 1e9;
  return res;
}

}  // namespace strata
