// The batched GPU prefill (src/strata/cuda/prefill.h) against two independent references: the GPU
// token-by-token path (the decode step run once per prompt token) and the CPU engine (scalar float
// path), on the HF fixtures converted to several weight types and on the bundled strata-tiny model
// (Q8_0, plus a copy re-encoded in K-quants where the rows allow). Checks every prompt position's logits, chunked prompts
// and prompts split over several calls (attention reading the earlier cache, DeltaNet continuing its
// state), and greedy continuations through GpuSession (prefill, then the decode graph on the state the
// prefill left). Skips where CUDA is not built or no GPU exists.
#include <gtest/gtest.h>

#ifndef STRATA_HAVE_CUDA
TEST(CudaPrefill, Skipped) { GTEST_SKIP() << "built without CUDA (STRATA_HAVE_CUDA undefined)"; }
#else

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/convert/converter.h"
#include "strata/convert/synth.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cuda/device_model.h"
#include "strata/cuda/device_state.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/matvec_kernels.h"
#include "strata/cuda/prefill.h"
#include "strata/moe/gpu_expert_plan.h"
#include "strata/cuda/prefill_kernels.h"
#include "strata/engine/model.h"
#include "strata/engine/sequence_state.h"
#include "strata/engine/session.h"
#include "cuda_test_models.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/moe/gpu_support.h"
#include "strata/quant/quantize.h"

namespace {

namespace fs = std::filesystem;
namespace sc = strata::cuda;

using strata::cuda_test::max_row_rel_err;
using strata::cuda_test::tmp_dir;

std::string convert_fixture(const std::string& name, const std::string& type) {
  return strata::cuda_test::convert_fixture(name, type, "prefill_");
}
std::string kquant_copy(const std::string& path) { return strata::cuda_test::kquant_copy(path, "_prefill_kquant"); }

std::vector<int32_t> some_prompt(int64_t vocab, int n, int salt = 0) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 7919 + 13 + salt * 104729) % vocab));
  return p;
}

// Every position's logits through GpuPrefill on its own DeviceModel / state, the prompt given in calls of
// the lengths in `calls` (summing to the prompt length).
std::vector<float> prefill_logits(const strata::Model& model, const std::vector<int32_t>& prompt,
                                  sc::PrefillOptions opt, const std::vector<int>& calls, int ctx) {
  const size_t vocab = static_cast<size_t>(model.config().n_vocab);
  sc::DeviceModel dm(model);
  sc::DeviceSequenceState st(model.config(), ctx);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::vector<float> out(prompt.size() * vocab, NAN);
  {
    sc::GpuPrefill pf(dm, opt);
    int off = 0;
    for (int len : calls) {
      pf.run(st, prompt.data() + off, len, out.data() + static_cast<size_t>(off) * vocab, true, s);
      off += len;
      EXPECT_EQ(st.n_past, off);
    }
  }
  cudaStreamDestroy(s);
  return out;
}

sc::PrefillOptions options(sc::PrefillMath math, int chunk = 512) {
  sc::PrefillOptions o;
  o.math = math;
  o.max_chunk = chunk;
  return o;
}

// Exact and fast prefill logits against the GPU token-by-token path and the CPU engine.
// flipped_rows: how many prompt rows may miss the fast bound. A random synth model can hold an exact
// near-tie between its k-th and (k+1)-th expert; half-precision products may then pick the other expert
// for that token, which moves that row's logits far more than rounding does (the other rows, which only
// attend to it, stay within the bound).
void compare_logits(const std::string& gguf, const std::string& label, int n_prompt, int flipped_rows = 0,
                    int salt = 0) {
  strata::set_cpu_kernel_level(strata::CpuKernelLevel::Scalar);
  auto model = strata::Model::load(gguf);
  const size_t vocab = static_cast<size_t>(model->config().n_vocab);
  const std::vector<int32_t> prompt = some_prompt(static_cast<int64_t>(vocab), n_prompt, salt);
  const int ctx = n_prompt + 4;

  strata::Session cpu(*model, ctx);
  std::vector<float> want_cpu(prompt.size() * vocab);
  cpu.forward(prompt.data(), n_prompt, want_cpu.data(), true);

  sc::GpuSessionOptions per_token;
  per_token.batched_prefill = false;
  sc::GpuSession gpu(*model, ctx, per_token);
  std::vector<float> want_gpu(want_cpu.size(), NAN);
  // The decode steps in float arithmetic (GemvMath::Float), the function the Exact prefill computes.
  const sc::GemvMath math = sc::gemv_math();
  sc::set_gemv_math(sc::GemvMath::Float);
  gpu.forward(prompt.data(), n_prompt, want_gpu.data(), true);
  sc::set_gemv_math(math);

  const std::vector<float> exact = prefill_logits(*model, prompt, options(sc::PrefillMath::Exact), {n_prompt}, ctx);
  const double e_gpu = max_row_rel_err(exact, want_gpu, vocab);
  const double e_cpu = max_row_rel_err(exact, want_cpu, vocab);
  // Chunks of 7 tokens, the prompt given in three calls: every chunk continues the cache and state.
  const int a = n_prompt / 3, b = n_prompt / 3;
  const std::vector<float> chunked =
      prefill_logits(*model, prompt, options(sc::PrefillMath::Exact, 7), {a, b, n_prompt - a - b}, ctx);
  const double e_chunk = max_row_rel_err(chunked, want_gpu, vocab);
  const std::vector<float> fast = prefill_logits(*model, prompt, options(sc::PrefillMath::Fast), {n_prompt}, ctx);
  const auto rows = strata::test_util::rows_against_bound(fast, want_cpu, vocab, 3e-2, "[cuda-prefill] " + label + " fast");
  const int fast_misses = rows.beyond;
  const double e_fast = rows.within;
  sc::PrefillOptions no_cache = options(sc::PrefillMath::Fast);
  no_cache.cache_dense_f16 = false;
  const std::vector<float> fast_nc = prefill_logits(*model, prompt, no_cache, {n_prompt}, ctx);
  // The half copies hold the same half weights the per-call decode produces.
  EXPECT_LE(max_row_rel_err(fast_nc, fast, vocab), 1e-5) << label;
  std::printf("[cuda-prefill] %s, %d tokens: exact vs per-token GPU %.3g, vs CPU %.3g; chunked(7) exact vs "
              "per-token %.3g; fast vs CPU %.3g (%d rows beyond 3e-2)\n",
              label.c_str(), n_prompt, e_gpu, e_cpu, e_chunk, e_fast, fast_misses);
  // Float32 throughout: only the order of the sums differs from the per-token path.
  EXPECT_LE(e_gpu, 1e-4) << label;
  EXPECT_LE(e_cpu, 1e-3) << label;
  EXPECT_LE(e_chunk, 1e-4) << label;
  // Half operands (11-bit mantissas) with float accumulation.
  EXPECT_LE(e_fast, 3e-2) << label;
  EXPECT_LE(fast_misses, flipped_rows) << label;
}

// Greedy continuation through GpuSession (batched prefill, then the decode graph) equals the CPU's.
void compare_greedy(const std::string& gguf, const std::string& label, int n_prompt, int n_new, sc::PrefillMath math,
                    int chunk = 512) {
  strata::set_cpu_kernel_level(strata::CpuKernelLevel::Scalar);
  auto model = strata::Model::load(gguf);
  const std::vector<int32_t> prompt = some_prompt(model->config().n_vocab, n_prompt, 1);
  const int ctx = n_prompt + n_new + 1;
  strata::Session cpu(*model, ctx);
  const std::vector<int32_t> want = strata::generate_greedy(cpu, prompt, n_new);
  sc::GpuSessionOptions o;
  o.prefill_math = math;
  o.prefill_chunk = chunk;
  sc::GpuSession gpu(*model, ctx, o);
  const std::vector<int32_t> got = sc::generate_greedy(gpu, prompt, n_new);
  std::printf("[cuda-prefill] %s greedy (%s, chunk %d): %d tokens %s\n", label.c_str(), sc::prefill_math_name(math),
              chunk, n_new, got == want ? "equal" : "DIFFER");
  EXPECT_EQ(got, want) << label << " " << sc::prefill_math_name(math);
  EXPECT_EQ(gpu.n_past(), n_prompt + n_new - 1);
}

// The grouped expert GEMM kernels on their own, every weight type, against a float64 reference computed
// here from the CPU decode of the same stored weights (and, for the half forms, from the inputs and
// weights rounded to half as the kernels round them): 100 tokens x 2 experts of 5, so every expert gets
// more than one 32-row tile, and 96 weight rows, so blocks overhang the matrix.
TEST(CudaPrefill, GroupedExpertGemmMatchesFloat64Reference) {
  REQUIRE_GPU();
  namespace pf = sc::prefill;
  using strata::GgmlType;
  const int E = 5, N = 96, n = 100, k = 2, pairs = n * k;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::vector<int> ids(pairs);
  for (int t = 0; t < n; ++t) {
    ids[t * k] = (t * 3) % E;
    ids[t * k + 1] = (ids[t * k] + 1 + t % (E - 1)) % E;
  }
  int* ids_d = nullptr;
  ASSERT_EQ(cudaMalloc(&ids_d, sizeof(int) * pairs), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ids_d, ids.data(), sizeof(int) * pairs, cudaMemcpyHostToDevice), cudaSuccess);
  pf::ExpertGroups g;
  const int bound = pf::max_tiles(pairs, E, pf::kGroupTileM);
  std::vector<void*> bufs;
  auto ialloc = [&](int count) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, sizeof(int) * count), cudaSuccess);
    bufs.push_back(p);
    return static_cast<int*>(p);
  };
  g.counts = ialloc(E);
  g.cursor = ialloc(E);
  g.src_pair = ialloc(pairs);
  g.pair_row = ialloc(pairs);
  g.tile_expert = ialloc(bound);
  g.tile_row0 = ialloc(bound);
  g.tile_rows = ialloc(bound);
  g.n_tiles = ialloc(1);
  pf::group_by_expert(ids_d, pairs, k, E, pf::kGroupTileM, g, s);
  std::vector<int> pair_row(pairs);
  ASSERT_EQ(cudaMemcpy(pair_row.data(), g.pair_row, sizeof(int) * pairs, cudaMemcpyDeviceToHost), cudaSuccess);
  {
    std::vector<int> sorted(pair_row);
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < pairs; ++i) ASSERT_EQ(sorted[i], i) << "pair_row must be a permutation";
  }

  auto round_half = [](float v) { return __half2float(__float2half_rn(v)); };
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                            GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
  for (GgmlType type : types) {
    for (int K : {512, 96}) {
      const bool kquant = type == GgmlType::Q4_K || type == GgmlType::Q5_K || type == GgmlType::Q6_K;
      if (kquant && K % 256 != 0) continue;
      const size_t rb = strata::row_bytes(type, K);
      std::vector<uint8_t> raw(rb * N * E);
      std::vector<float> w(static_cast<size_t>(E) * N * K), row(K);
      for (int r = 0; r < E * N; ++r) {
        for (float& v : row) v = nd(rng);
        strata::quantize_row(type, row.data(), raw.data() + rb * r, K);
        strata::dequantize_row(type, raw.data() + rb * r, w.data() + static_cast<size_t>(r) * K, K);
      }
      std::vector<float> x(static_cast<size_t>(n) * K);
      for (float& v : x) v = nd(rng);
      std::vector<__half> xh(x.size());
      for (size_t i = 0; i < x.size(); ++i) xh[i] = __float2half_rn(x[i]);
      uint8_t* w_d = nullptr;
      float *x_d = nullptr, *y_d = nullptr;
      __half* xh_d = nullptr;
      ASSERT_EQ(cudaMalloc(&w_d, raw.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&x_d, sizeof(float) * x.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&xh_d, sizeof(__half) * xh.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&y_d, sizeof(float) * pairs * N), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(w_d, raw.data(), raw.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(x_d, x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(xh_d, xh.data(), sizeof(__half) * xh.size(), cudaMemcpyHostToDevice), cudaSuccess);
      sc::DevMatrix m;
      m.type = type;
      m.data = w_d;
      m.n_rows = N;
      m.n_cols = K;
      m.row_bytes = rb;
      m.expert_stride = rb * N;
      m.n_expert = E;
      for (int variant = 0; variant < 2; ++variant) {  // exact, fast (half inputs)
        const bool half_ops = variant > 0;
        ASSERT_EQ(cudaMemset(y_d, 0xff, sizeof(float) * pairs * N), cudaSuccess);  // NaN poison
        if (half_ops) {
          pf::grouped_gemm_h(m, xh_d, true, k, g, bound, y_d, s);
        } else {
          pf::grouped_gemm(m, x_d, true, k, g, bound, y_d, s);
        }
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        std::vector<float> y(static_cast<size_t>(pairs) * N);
        ASSERT_EQ(cudaMemcpy(y.data(), y_d, sizeof(float) * y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        double num = 0, den = 0;
        for (int p = 0; p < pairs; ++p) {
          const int t = p / k, e = ids[p];
          for (int r = 0; r < N; ++r) {
            double ref = 0;
            const float* wr = w.data() + (static_cast<size_t>(e) * N + r) * K;
            const float* xr = x.data() + static_cast<size_t>(t) * K;
            for (int c = 0; c < K; ++c)
              ref += half_ops ? double(round_half(wr[c])) * round_half(xr[c]) : double(wr[c]) * xr[c];
            const float got = y[static_cast<size_t>(pair_row[p]) * N + r];
            num = std::isfinite(got) ? std::max(num, std::fabs(got - ref)) : INFINITY;
            den = std::max(den, std::fabs(ref));
          }
        }
        const double err = num / den;
        std::printf("[cuda-prefill] grouped GEMM %s K=%d %s: max error / max |ref| %.3g\n",
                    strata::type_traits(type).name, K, half_ops ? "fast" : "exact",
                    err);
        EXPECT_LE(err, half_ops ? 1e-4 : 1e-5) << strata::type_traits(type).name << " K=" << K << " variant " << variant;
      }
      cudaFree(w_d);
      cudaFree(x_d);
      cudaFree(xh_d);
      cudaFree(y_d);
    }
  }
  for (void* p : bufs) cudaFree(p);
  cudaFree(ids_d);
  cudaStreamDestroy(s);
}

// The gated delta rule over a prompt (the sequential scan and the chunkwise-parallel form)
// against a float64 transcription of the per-token rule of cpu/ops.h (deltanet_step), from a non-zero
// state, over more tokens than one shared-memory stage or one 32-token chunk (partial last chunks), with
// value-column counts that leave lanes idle, and at the real models' head shape; the final state is
// checked too. A shape whose rows the chunked form does not take (odd width) must be refused loudly.
// The scan's step records (the state after each token, for keeping a prefix of pending tokens) match
// the reference's state after those tokens, across stage boundaries, and the last is the final state.
TEST(CudaPrefill, DeltaNetScanMatchesFloat64Reference) {
  REQUIRE_GPU();
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  struct Shape { int nk, nv, dk, dv, n; };
  for (const Shape sh : {Shape{2, 4, 128, 24, 70}, Shape{2, 4, 16, 8, 150}, Shape{1, 2, 256, 9, 40},
                         Shape{1, 2, 256, 10, 40}, Shape{4, 8, 128, 128, 100}}) {
    const int channels = 2 * sh.nk * sh.dk + sh.nv * sh.dv;
    std::vector<float> mixed(static_cast<size_t>(sh.n) * channels), b(sh.n * sh.nv), al(sh.n * sh.nv);
    std::vector<float> a(sh.nv), dtb(sh.nv), S0(static_cast<size_t>(sh.nv) * sh.dk * sh.dv);
    for (float& v : mixed) v = nd(rng);
    for (int t = 0; t < sh.n; ++t)  // q and k heads L2-normalised, as the model feeds them
      for (int h = 0; h < 2 * sh.nk; ++h) {
        float* x = mixed.data() + static_cast<size_t>(t) * channels + static_cast<size_t>(h) * sh.dk;
        double ss = 0;
        for (int i = 0; i < sh.dk; ++i) ss += double(x[i]) * x[i];
        for (int i = 0; i < sh.dk; ++i) x[i] = static_cast<float>(x[i] / std::sqrt(ss));
      }
    for (float& v : b) v = nd(rng);
    for (float& v : al) v = nd(rng);
    for (float& v : a) v = -std::exp(0.5f * nd(rng));
    for (float& v : dtb) v = 0.5f * nd(rng);
    for (float& v : S0) v = 0.1f * nd(rng);

    // Reference, with the state after some tokens: the first ones, around stage boundaries, the last.
    std::vector<double> S(S0.begin(), S0.end()), o_ref(static_cast<size_t>(sh.n) * sh.nv * sh.dv);
    std::vector<int> probe;
    for (int t : {0, 1, 15, 16, 31, 32, 33, 127, 128, 129, sh.n / 2, sh.n - 2, sh.n - 1})
      if (t >= 0 && t < sh.n && std::find(probe.begin(), probe.end(), t) == probe.end()) probe.push_back(t);
    std::vector<std::vector<double>> S_at(probe.size());
    for (int t = 0; t < sh.n; ++t) {
      for (int h = 0; h < sh.nv; ++h) {
        const int kh = h % sh.nk;
        const float* row = mixed.data() + static_cast<size_t>(t) * channels;
        const float* q = row + kh * sh.dk;
        const float* kv = row + sh.nk * sh.dk + kh * sh.dk;
        const float* v = row + 2 * sh.nk * sh.dk + h * sh.dv;
        const double beta = 1.0 / (1.0 + std::exp(-double(b[t * sh.nv + h])));
        const double xa = double(al[t * sh.nv + h]) + dtb[h];
        const double g = a[h] * (xa > 20 ? xa : std::log1p(std::exp(xa)));
        double* Sh = S.data() + static_cast<size_t>(h) * sh.dk * sh.dv;
        for (int j = 0; j < sh.dv; ++j) {
          double skj = 0;
          for (int i = 0; i < sh.dk; ++i) {
            Sh[i * sh.dv + j] *= std::exp(g);
            skj += Sh[i * sh.dv + j] * kv[i];
          }
          const double delta = beta * (v[j] - skj);
          double oj = 0;
          for (int i = 0; i < sh.dk; ++i) {
            Sh[i * sh.dv + j] += kv[i] * delta;
            oj += Sh[i * sh.dv + j] * q[i];
          }
          o_ref[(static_cast<size_t>(t) * sh.nv + h) * sh.dv + j] = oj;
        }
      }
      for (size_t p = 0; p < probe.size(); ++p)
        if (probe[p] == t) S_at[p] = S;
    }

    float *mixed_d, *b_d, *al_d, *a_d, *dtb_d, *S_d, *o_d;
    auto up = [&](float** p, const std::vector<float>& v) {
      ASSERT_EQ(cudaMalloc(p, sizeof(float) * v.size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(*p, v.data(), sizeof(float) * v.size(), cudaMemcpyHostToDevice), cudaSuccess);
    };
    up(&mixed_d, mixed);
    up(&b_d, b);
    up(&al_d, al);
    up(&a_d, a);
    up(&dtb_d, dtb);
    ASSERT_EQ(cudaMalloc(&S_d, sizeof(float) * S0.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&o_d, sizeof(float) * o_ref.size()), cudaSuccess);
    float* scratch_d = nullptr;
    ASSERT_EQ(cudaMalloc(&scratch_d, sizeof(float) * sc::prefill::deltanet_chunked_scratch_floats(sh.n, sh.nv, sh.dk, sh.dv)),
              cudaSuccess);
    for (bool chunked : {false, true}) {
      const char* form = chunked ? "chunked" : "staged";
      ASSERT_EQ(cudaMemcpy(S_d, S0.data(), sizeof(float) * S0.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemset(o_d, 0xff, sizeof(float) * o_ref.size()), cudaSuccess);
      if (chunked && !sc::prefill::deltanet_chunked_supported(sh.dk, sh.dv, channels)) {
        EXPECT_THROW(sc::prefill::deltanet_scan_chunked(S_d, mixed_d, channels, b_d, al_d, a_d, dtb_d, sh.n, sh.nk,
                                                        sh.nv, sh.dk, sh.dv, o_d, scratch_d, s),
                     strata::Error)
            << "rows of " << channels << " floats";
        continue;
      }
      if (chunked) {
        sc::prefill::deltanet_scan_chunked(S_d, mixed_d, channels, b_d, al_d, a_d, dtb_d, sh.n, sh.nk, sh.nv, sh.dk,
                                           sh.dv, o_d, scratch_d, s);
      } else {
        sc::prefill::deltanet_scan(S_d, mixed_d, channels, b_d, al_d, a_d, dtb_d, sh.n, sh.nk, sh.nv, sh.dk, sh.dv, o_d,
                                   s);
      }
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      std::vector<float> o(o_ref.size()), S1(S0.size());
      ASSERT_EQ(cudaMemcpy(o.data(), o_d, sizeof(float) * o.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(S1.data(), S_d, sizeof(float) * S1.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      auto rel = [](const std::vector<float>& got, const std::vector<double>& want) {
        double num = 0, den = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          if (!std::isfinite(got[i])) return double(INFINITY);
          num = std::max(num, std::fabs(got[i] - want[i]));
          den = std::max(den, std::fabs(want[i]));
        }
        return num / den;
      };
      const double eo = rel(o, o_ref), es = rel(S1, S);
      std::printf("[cuda-prefill] deltanet scan %s dk=%d dv=%d n=%d: output error %.3g, state error %.3g\n", form,
                  sh.dk, sh.dv, sh.n, eo, es);
      EXPECT_LE(eo, 1e-4) << form << " dk=" << sh.dk;
      EXPECT_LE(es, 1e-4) << form << " dk=" << sh.dk;
    }
    // The sequential scan again, recording every token's state.
    const size_t state_floats = S0.size();
    float* steps_d = nullptr;
    ASSERT_EQ(cudaMalloc(&steps_d, sizeof(float) * state_floats * static_cast<size_t>(sh.n)), cudaSuccess);
    ASSERT_EQ(cudaMemset(steps_d, 0xff, sizeof(float) * state_floats * static_cast<size_t>(sh.n)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(S_d, S0.data(), sizeof(float) * S0.size(), cudaMemcpyHostToDevice), cudaSuccess);
    sc::prefill::deltanet_scan(S_d, mixed_d, channels, b_d, al_d, a_d, dtb_d, sh.n, sh.nk, sh.nv, sh.dk, sh.dv, o_d, s,
                               steps_d);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<float> steps(state_floats * static_cast<size_t>(sh.n)), S_final(state_floats);
    ASSERT_EQ(cudaMemcpy(steps.data(), steps_d, sizeof(float) * steps.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(S_final.data(), S_d, sizeof(float) * state_floats, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t p = 0; p < probe.size(); ++p) {
      const std::vector<float> got(steps.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(probe[p]) * state_floats),
                                   steps.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(probe[p] + 1) * state_floats));
      double num = 0, den = 0;
      for (size_t i = 0; i < state_floats; ++i) {
        num = std::max(num, std::isfinite(got[i]) ? std::fabs(got[i] - S_at[p][i]) : double(INFINITY));
        den = std::max(den, std::fabs(S_at[p][i]));
      }
      EXPECT_LE(num / den, 1e-4) << "step record after token " << probe[p] << ", dk=" << sh.dk << " dv=" << sh.dv;
    }
    EXPECT_TRUE(std::equal(S_final.begin(), S_final.end(),
                           steps.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(sh.n - 1) * state_floats)))
        << "the last step record is the final state, dk=" << sh.dk;
    cudaFree(steps_d);
    for (float* p : {mixed_d, b_d, al_d, a_d, dtb_d, S_d, o_d, scratch_d}) cudaFree(p);
  }
  cudaStreamDestroy(s);
}

// The prefill's causal conv with its step windows: window t is the conv state after token t (the last
// K-1 inputs up to t, reaching back into the old state for the first tokens), the outputs and the final
// state are those of the run without windows, and the last window is the final state.
TEST(CudaPrefill, ConvWindowsAreTheStateAfterEachToken) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const int K : {2, 4}) {
    for (const int n : {1, 2, 5}) {
      const int channels = 300;  // more than one block of threads
      const size_t W = static_cast<size_t>(K - 1) * channels;
      std::vector<float> x(static_cast<size_t>(n) * channels), w(static_cast<size_t>(channels) * K), state0(W);
      for (float& v : x) v = nd(rng);
      for (float& v : w) v = nd(rng);
      for (float& v : state0) v = nd(rng);
      float *x_d, *w_d, *state_d, *out_d, *win_d;
      ASSERT_EQ(cudaMalloc(&x_d, sizeof(float) * x.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&w_d, sizeof(float) * w.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&state_d, sizeof(float) * W), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&out_d, sizeof(float) * x.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&win_d, sizeof(float) * W * static_cast<size_t>(n)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(x_d, x.data(), sizeof(float) * x.size(), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(w_d, w.data(), sizeof(float) * w.size(), cudaMemcpyHostToDevice), cudaSuccess);
      std::vector<float> out_plain(x.size()), state_plain(W), out(x.size()), state(W), win(W * static_cast<size_t>(n));
      for (const bool windows : {false, true}) {
        ASSERT_EQ(cudaMemcpy(state_d, state0.data(), sizeof(float) * W, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemset(win_d, 0xff, sizeof(float) * win.size()), cudaSuccess);
        sc::prefill::conv1d_silu_chunk(x_d, w_d, K, channels, n, state_d, out_d, nullptr, windows ? win_d : nullptr);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(cudaMemcpy((windows ? out : out_plain).data(), out_d, sizeof(float) * x.size(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpy((windows ? state : state_plain).data(), state_d, sizeof(float) * W, cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
      ASSERT_EQ(cudaMemcpy(win.data(), win_d, sizeof(float) * win.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(out, out_plain) << "K=" << K << " n=" << n;
      EXPECT_EQ(state, state_plain) << "K=" << K << " n=" << n;
      // in(tau): the input of token tau, or old state row K-1+tau before the chunk.
      auto in = [&](int tau, int c) {
        return tau >= 0 ? x[static_cast<size_t>(tau) * channels + c] : state0[static_cast<size_t>(K - 1 + tau) * channels + c];
      };
      for (int t = 0; t < n; ++t)
        for (int j = 0; j < K - 1; ++j)
          for (int c = 0; c < channels; ++c)
            ASSERT_EQ(win[static_cast<size_t>(t) * W + static_cast<size_t>(j) * channels + c], in(t + 1 - (K - 1) + j, c))
                << "K=" << K << " n=" << n << " window " << t << " row " << j << " channel " << c;
      EXPECT_TRUE(std::equal(state.begin(), state.end(), win.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(n - 1) * W)))
          << "the last window is the final state, K=" << K << " n=" << n;
      for (float* p : {x_d, w_d, state_d, out_d, win_d}) cudaFree(p);
    }
  }
}

// The tiled causal attention on its own against a float64 softmax reference: queries after a cache of
// pos0 earlier positions, GQA, with and without the output gate, head dims 256 and 32; sliding windows
// (of one position, shorter and longer than a 16-key tile, longer than the context) over a plain cache
// and over a ring of window + n - 1 rows that the chunk wraps.
TEST(CudaPrefill, AttentionMatchesFloat64Reference) {
  REQUIRE_GPU();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  struct Shape { int n_head, n_kv, hd, pos0, n; bool gated; int window = 0; bool ring = false; };
  for (const Shape sh : {Shape{4, 2, 256, 37, 50, true}, Shape{4, 2, 32, 0, 20, false}, Shape{2, 1, 64, 5, 33, true},
                         Shape{4, 2, 64, 37, 50, false, 5}, Shape{2, 1, 32, 0, 40, true, 1},
                         Shape{4, 2, 64, 10, 30, false, 100}, Shape{4, 2, 64, 70, 45, true, 21, true},
                         Shape{2, 2, 32, 30, 20, false, 4, true}}) {
    const int qsh = sh.gated ? 2 * sh.hd : sh.hd, qw = sh.n_head * qsh, kvw = sh.n_kv * sh.hd;
    const int ctx = sh.pos0 + sh.n;
    std::vector<float> q(static_cast<size_t>(sh.n) * qw), k(static_cast<size_t>(ctx) * kvw), v(k.size());
    for (float& x : q) x = nd(rng);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    // The cache as the kernel reads it: every position in its own row, or the ring's rows (position p in
    // row p % rows, the latest write winning), where positions no query sees hold other values.
    const int rows = sh.ring ? sh.window + sh.n - 1 : 0;
    std::vector<float> kc = k, vc = v;
    if (sh.ring) {
      kc.assign(static_cast<size_t>(rows) * kvw, 1e4f);
      vc.assign(kc.size(), 1e4f);
      for (int p = 0; p < ctx; ++p)
        for (int i = 0; i < kvw; ++i) {
          kc[static_cast<size_t>(p % rows) * kvw + i] = k[static_cast<size_t>(p) * kvw + i];
          vc[static_cast<size_t>(p % rows) * kvw + i] = v[static_cast<size_t>(p) * kvw + i];
        }
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
    std::vector<double> want(static_cast<size_t>(sh.n) * sh.n_head * sh.hd);
    const int group = sh.n_head / sh.n_kv;
    for (int t = 0; t < sh.n; ++t)
      for (int h = 0; h < sh.n_head; ++h) {
        const float* qh = q.data() + static_cast<size_t>(t) * qw + h * qsh;
        const int g = h / group, pos = sh.pos0 + t, lo = sh.window > 0 ? std::max(0, pos - sh.window + 1) : 0;
        const int n_ctx = pos - lo + 1;
        std::vector<double> p(n_ctx);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n_ctx; ++j) {
          double dot = 0;
          for (int d = 0; d < sh.hd; ++d) dot += double(qh[d]) * k[static_cast<size_t>(lo + j) * kvw + g * sh.hd + d];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int d = 0; d < sh.hd; ++d) {
          double o = 0;
          for (int j = 0; j < n_ctx; ++j) o += p[j] / sum * v[static_cast<size_t>(lo + j) * kvw + g * sh.hd + d];
          if (sh.gated) o *= 1.0 / (1.0 + std::exp(-double(qh[sh.hd + d])));
          want[(static_cast<size_t>(t) * sh.n_head + h) * sh.hd + d] = o;
        }
      }
    float *q_d, *k_d, *v_d, *o_d;
    ASSERT_EQ(cudaMalloc(&q_d, sizeof(float) * q.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&k_d, sizeof(float) * kc.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&v_d, sizeof(float) * vc.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&o_d, sizeof(float) * want.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(q_d, q.data(), sizeof(float) * q.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(k_d, kc.data(), sizeof(float) * kc.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(v_d, vc.data(), sizeof(float) * vc.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(o_d, 0xff, sizeof(float) * want.size()), cudaSuccess);
    sc::prefill::attention_prefill(q_d, qw, qsh, k_d, v_d, kvw, sh.n, sh.n_head, sh.n_kv, sh.hd, scale, sh.gated, sh.pos0,
                                   o_d, s, {}, sh.window, rows);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<float> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), o_d, sizeof(float) * got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num = std::isfinite(got[i]) ? std::max(num, std::fabs(got[i] - want[i])) : INFINITY;
      den = std::max(den, std::fabs(want[i]));
    }
    std::printf("[cuda-prefill] attention hd=%d heads %d/%d pos0=%d n=%d%s window %d%s: error %.3g\n", sh.hd, sh.n_head,
                sh.n_kv, sh.pos0, sh.n, sh.gated ? " gated" : "", sh.window, sh.ring ? " (ring)" : "", num / den);
    EXPECT_LE(num / den, 1e-5) << "hd=" << sh.hd << " window " << sh.window << (sh.ring ? " ring" : "");
    for (float* p : {q_d, k_d, v_d, o_d}) cudaFree(p);
  }
  cudaStreamDestroy(s);
}

const std::string kTiny = (fs::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf").string();

TEST(CudaPrefill, Qwen3MoeFixtureLogits) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "bf16", "q8_0", "q4_k_m"})
    compare_logits(convert_fixture("qwen3_moe", type), std::string("qwen3_moe ") + type, 45);
}

TEST(CudaPrefill, Qwen35MoeFixtureLogits) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "bf16", "q8_0", "q4_k_m"})
    compare_logits(convert_fixture("qwen3_5_moe", type), std::string("qwen3_5_moe ") + type, 45);
}

// 100 tokens x top-4 of 32 experts: several 32-row tiles per expert, several attention tiles. The
// random-token prompt holds expert near-ties at rows 54 and 78 that half precision flips.
TEST(CudaPrefill, TinyModelLogits) {
  REQUIRE_GPU();
  compare_logits(kTiny, "strata-tiny", 100, 2);
  compare_logits(kquant_copy(kTiny), "strata-tiny k-quant copy", 64);
}

// A pass longer than the logits block (kPrefillLogitRows) computes its all-position logits a block at a
// time: every row within float rounding of the same prompt in 512-token passes, and the last row within
// rounding of the last-token-only path.
TEST(CudaPrefill, LongPassLogitsInBlocks) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const size_t vocab = static_cast<size_t>(model->config().n_vocab);
  const int n = 2 * strata::kPrefillLogitRows + 77;
  const std::vector<int32_t> prompt = some_prompt(static_cast<int64_t>(vocab), n, 3);
  const int ctx = n + 4;
  const std::vector<float> one = prefill_logits(*model, prompt, options(sc::PrefillMath::Exact, n), {n}, ctx);
  const std::vector<float> pieces = prefill_logits(*model, prompt, options(sc::PrefillMath::Exact, 512), {n}, ctx);
  size_t nan = 0;
  for (float v : one) nan += std::isnan(v) ? 1 : 0;
  EXPECT_EQ(nan, 0u) << "every row of every logits block is written";
  const double e = max_row_rel_err(one, pieces, vocab);
  std::printf("[cuda-prefill] one %d-token pass vs 512-token passes: all-position logits %.3g\n", n, e);
  EXPECT_LE(e, 1e-4);
  // The last row alone (no all-position buffer) through a GpuSession with the same pass.
  sc::GpuSessionOptions o;
  o.prefill_math = sc::PrefillMath::Exact;
  o.prefill_chunk = n;
  sc::GpuSession g(*model, ctx, o);
  std::vector<float> last(vocab, NAN);
  g.forward(prompt.data(), n, last.data(), false);
  const std::vector<float> want(one.end() - static_cast<std::ptrdiff_t>(vocab), one.end());
  EXPECT_LE(max_row_rel_err(last, want, vocab), 1e-4);
}

TEST(CudaPrefill, GreedyEqualsCpuOnFixtures) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "q4_k_m"}) {
    compare_greedy(convert_fixture("qwen3_moe", type), std::string("qwen3_moe ") + type, 20, 16, sc::PrefillMath::Exact);
    compare_greedy(convert_fixture("qwen3_5_moe", type), std::string("qwen3_5_moe ") + type, 20, 16,
                   sc::PrefillMath::Exact, 6);
  }
}

// ---- laguna: sliding-window layers (rings), YaRN, per-layer heads and rotary, dense FFN layers, the
// softplus output gate, the sigmoid router (soft-cap, selection bias, weight scale), ungated shared expert.

// A synth preset (convert/synth.h) in f32, written once per test program run.
std::string synth_f32(const std::string& preset) {
  strata::convert::SynthOptions o;
  o.preset = preset;
  o.quant = "f32";
  o.seed = 11;
  o.threads = 2;
  o.out_path = (tmp_dir() / ("prefill_" + preset + ".gguf")).string();
  strata::convert::synth_model(o);
  return o.out_path;
}

TEST(CudaPrefill, LagunaFixtureLogits) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "bf16", "q8_0"})
    compare_logits(convert_fixture("laguna", type), std::string("laguna ") + type, 45);
}

// Window 4: every chunk of 7 (compare_logits) crosses window boundaries.
TEST(CudaPrefill, LagunaSlidingWindowFixtureLogits) {
  REQUIRE_GPU();
  for (const char* type : {"f32", "q8_0"})
    compare_logits(convert_fixture("laguna_swa", type), std::string("laguna_swa ") + type, 45);
}

TEST(CudaPrefill, LagunaSynthPresetLogits) {
  REQUIRE_GPU();
  for (const char* preset : {"tiny-laguna", "tiny-laguna-yarn"}) {
    const std::string path = synth_f32(preset);
    if (std::string(preset) == "tiny-laguna-yarn") {
      auto model = strata::Model::load(path);
      ASSERT_TRUE(model->config().layer(0).yarn.on());
    }
    // Both presets (same weights; rotary differs) hold a routing near-tie at the first token of this
    // prompt; another prompt has none, and every row must then be within the bound.
    compare_logits(path, preset, 60, 1);
    compare_logits(path, std::string(preset) + " (other prompt)", 60, 0, 1);
  }
}

TEST(CudaPrefill, LagunaGreedyEqualsCpu) {
  REQUIRE_GPU();
  compare_greedy(convert_fixture("laguna", "f32"), "laguna f32", 20, 16, sc::PrefillMath::Exact);
  compare_greedy(convert_fixture("laguna_swa", "f32"), "laguna_swa f32", 20, 16, sc::PrefillMath::Exact);
  compare_greedy(convert_fixture("laguna_swa", "f32"), "laguna_swa f32", 20, 16, sc::PrefillMath::Exact, 6);
  for (const char* preset : {"tiny-laguna", "tiny-laguna-yarn"}) {
    compare_greedy(synth_f32(preset), preset, 40, 16, sc::PrefillMath::Exact);
    compare_greedy(synth_f32(preset), preset, 40, 16, sc::PrefillMath::Exact, 9);
  }
}

// A prompt longer than the sliding layers' rings (window + 511 rows, shorter than the context): the
// prefill writes the ring as the decode step does, including chunks that wrap it (chunks of 100 cross
// row 515, and the prompt's calls split mid-chunk), and decoding continues on the state it leaves.
// References: the GPU decode step token by token and the CPU engine, logits of every prompt position
// and of the decoded continuation; greedy continuations equal.
TEST(CudaPrefill, LagunaPrefillLongerThanTheRingThenDecode) {
  REQUIRE_GPU();
  strata::set_cpu_kernel_level(strata::CpuKernelLevel::Scalar);
  auto model = strata::Model::load(convert_fixture("laguna_swa", "f32"));
  const strata::ModelConfig& c = model->config();
  const size_t vocab = static_cast<size_t>(c.n_vocab);
  const int n = 540, n_cont = 24, ctx = 600;
  int sliding = -1;
  for (int il = 0; il < c.n_layer && sliding < 0; ++il)
    if (c.layer(il).mixer == strata::LayerKind::SlidingAttention) sliding = il;
  ASSERT_GE(sliding, 0);
  ASSERT_LT(strata::attention_cache_rows(c, sliding, ctx), n) << "the prompt must outgrow the ring";
  ASSERT_EQ(strata::gpu_prefill_unsupported_feature(c), "") << "the sessions would run the prompt token by token";
  const std::vector<int32_t> prompt = some_prompt(static_cast<int64_t>(vocab), n, 4);
  const std::vector<int32_t> cont = some_prompt(static_cast<int64_t>(vocab), n_cont, 5);

  // CPU: the prompt, then the continuation one token at a time.
  std::vector<float> cpu_prompt(static_cast<size_t>(n) * vocab), cpu_cont(static_cast<size_t>(n_cont) * vocab);
  {
    strata::Session cpu(*model, ctx);
    cpu.forward(prompt.data(), n, cpu_prompt.data(), true);
    for (int t = 0; t < n_cont; ++t) cpu.forward(&cont[t], 1, cpu_cont.data() + static_cast<size_t>(t) * vocab, false);
  }
  // GPU sessions: token by token (float GEMVs, the function Exact computes), and batched in several ways.
  struct Way {
    const char* name;
    bool batched;
    int chunk;
    std::vector<int> calls;
  };
  const Way ways[] = {{"per-token", false, 512, {n}},
                      {"batched, chunk 512", true, 512, {n}},
                      {"batched, chunks of 100", true, 100, {n}},
                      {"batched, chunks of 64 in calls of 250 + 290", true, 64, {250, 290}}};
  std::vector<float> ref_prompt, ref_cont;
  std::vector<int32_t> ref_greedy;
  for (const Way& w : ways) {
    sc::GpuSessionOptions o;
    o.batched_prefill = w.batched;
    o.prefill_math = sc::PrefillMath::Exact;
    o.prefill_chunk = w.chunk;
    const sc::GemvMath math = sc::gemv_math();
    sc::set_gemv_math(sc::GemvMath::Float);
    std::vector<float> got_prompt(static_cast<size_t>(n) * vocab, NAN), got_cont(static_cast<size_t>(n_cont) * vocab, NAN);
    sc::GpuSession gpu(*model, ctx, o);
    int off = 0;
    for (int len : w.calls) {
      gpu.forward(prompt.data() + off, len, got_prompt.data() + static_cast<size_t>(off) * vocab, true);
      off += len;
    }
    for (int t = 0; t < n_cont; ++t) gpu.forward(&cont[t], 1, got_cont.data() + static_cast<size_t>(t) * vocab, false);
    const double e_cpu = max_row_rel_err(got_prompt, cpu_prompt, vocab);
    const double e_cpu_cont = max_row_rel_err(got_cont, cpu_cont, vocab);
    EXPECT_LE(e_cpu, 1e-3) << w.name;
    EXPECT_LE(e_cpu_cont, 1e-3) << w.name << " (decode after the prompt)";
    gpu.reset();
    const std::vector<int32_t> greedy = sc::generate_greedy(gpu, prompt, 20);
    sc::set_gemv_math(math);
    if (!w.batched) {
      ref_prompt = got_prompt;
      ref_cont = got_cont;
      ref_greedy = greedy;
      std::printf("[cuda-prefill] laguna_swa %d tokens %s: vs CPU %.3g, continuation %.3g\n", n, w.name, e_cpu,
                  e_cpu_cont);
      continue;
    }
    const double e_gpu = max_row_rel_err(got_prompt, ref_prompt, vocab);
    const double e_gpu_cont = max_row_rel_err(got_cont, ref_cont, vocab);
    std::printf("[cuda-prefill] laguna_swa %d tokens %s: vs per-token GPU %.3g (continuation %.3g), vs CPU %.3g "
                "(continuation %.3g); greedy %s\n",
                n, w.name, e_gpu, e_gpu_cont, e_cpu, e_cpu_cont, greedy == ref_greedy ? "equal" : "DIFFER");
    EXPECT_LE(e_gpu, 1e-4) << w.name;
    EXPECT_LE(e_gpu_cont, 1e-4) << w.name << " (decode after the prompt)";
    EXPECT_EQ(greedy, ref_greedy) << w.name;
  }
  // And the greedy continuation equals the CPU's.
  strata::Session cpu(*model, ctx);
  EXPECT_EQ(strata::generate_greedy(cpu, prompt, 20), ref_greedy);
}

// The default arithmetic (GpuSessionOptions::prefill_math) must keep the tiny model's greedy output equal
// to the CPU's: that is the condition for Fast being the default.
TEST(CudaPrefill, DefaultMathGreedyEqualsCpuOnTinyModel) {
  REQUIRE_GPU();
  const sc::PrefillMath def = sc::GpuSessionOptions{}.prefill_math;
  compare_greedy(kTiny, "strata-tiny", 60, 32, def);
  compare_greedy(kTiny, "strata-tiny", 60, 32, def, 16);
  compare_greedy(kquant_copy(kTiny), "strata-tiny k-quant copy", 40, 24, def);
  compare_greedy(kTiny, "strata-tiny", 60, 32, sc::PrefillMath::Exact);
}

// The hybrid seam: with half the experts cold (GpuSessionOptions::expert_slots), the batched prefill hands
// every layer's MoE FFN to the session's HybridMoe; its logits must match the token-by-token path through
// the same hybrid MoE (the loose bound allows the CPU cold-expert kernels' own rounding).
TEST(CudaPrefill, HybridSessionPrefillMatchesPerTokenPath) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const strata::ModelConfig& c = model->config();
  const size_t vocab = static_cast<size_t>(c.n_vocab);
  std::vector<std::vector<int>> slots(c.n_layer, std::vector<int>(c.n_expert, -1));
  for (auto& layer : slots)
    for (int e = 0; e < c.n_expert; e += 2) layer[e] = e / 2;
  const int n = 40;
  const std::vector<int32_t> prompt = some_prompt(static_cast<int64_t>(vocab), n, 2);
  std::vector<float> want(n * vocab, NAN), got(n * vocab, NAN);
  {
    sc::GpuSessionOptions o;
    o.expert_slots = slots;
    o.batched_prefill = false;
    sc::GpuSession gpu(*model, n + 1, o);
    ASSERT_TRUE(gpu.hybrid());
    gpu.forward(prompt.data(), n, want.data(), true);
  }
  {
    sc::GpuSessionOptions o;
    o.expert_slots = slots;
    o.prefill_math = sc::PrefillMath::Exact;
    sc::GpuSession gpu(*model, n + 1, o);
    gpu.forward(prompt.data(), n, got.data(), true);
    EXPECT_EQ(gpu.n_past(), n);
  }
  const double e = max_row_rel_err(got, want, vocab);
  std::printf("[cuda-prefill] hybrid (half the experts cold): batched vs per-token logits %.3g\n", e);
  EXPECT_LE(e, 1e-2);
}

// Routing statistics (issue 8, --profile): the batched prefill counts its picks per (layer, expert) into
// the session's counters, the same counts as the prompt run token by token through the decode step, and
// a profile sink sees the prompt's tokens.
TEST(CudaPrefill, RoutingCountsIncludeThePrompt) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  const strata::ModelConfig& c = model->config();
  const int n = 37;
  const std::vector<int32_t> prompt = some_prompt(c.n_vocab, n, 3);
  std::vector<uint64_t> counts[2];
  for (int batched = 0; batched < 2; ++batched) {
    sc::GpuSessionOptions o;
    o.batched_prefill = batched == 1;
    o.prefill_math = sc::PrefillMath::Exact;
    o.prefill_chunk = 16;  // three chunks
    sc::GpuSession gpu(*model, n + 1, o);
    gpu.reset_routing_counts();
    std::vector<float> logits(static_cast<size_t>(c.n_vocab));
    gpu.forward(prompt.data(), n, logits.data(), false);
    counts[batched] = gpu.routing_counts();
    ASSERT_EQ(counts[batched].size(), static_cast<size_t>(c.n_layer) * static_cast<size_t>(c.n_expert));
    for (int l = 0; l < c.n_layer; ++l) {
      uint64_t sum = 0;
      for (int e = 0; e < c.n_expert; ++e) sum += counts[batched][static_cast<size_t>(l) * c.n_expert + e];
      EXPECT_EQ(sum, static_cast<uint64_t>(n) * c.n_expert_used) << "batched " << batched << " layer " << l;
    }
  }
  EXPECT_EQ(counts[1], counts[0]);
  // Through a profile sink (Sequence::set_routing_counts): the prompt's tokens and picks arrive.
  sc::GpuSession gpu(*model, n + 1);
  strata::RoutingCounts sink;
  gpu.set_routing_counts(&sink);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  gpu.forward(prompt.data(), n, logits.data(), false);
  gpu.flush_routing_counts();  // the device counts until asked
  EXPECT_EQ(sink.n_tokens, static_cast<uint64_t>(n));
  for (int l = 0; l < c.n_layer; ++l) EXPECT_EQ(sink.layer_total(l), static_cast<uint64_t>(n) * c.n_expert_used);
}

TEST(CudaPrefill, ProfileAccountsForTheRun) {
  REQUIRE_GPU();
  auto model = strata::Model::load(kTiny);
  sc::DeviceModel dm(*model);
  sc::DeviceSequenceState st(model->config(), 300);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  sc::PrefillOptions o;
  o.profile = true;
  sc::GpuPrefill pf(dm, o);
  const std::vector<int32_t> prompt = some_prompt(model->config().n_vocab, 256);
  std::vector<float> logits(static_cast<size_t>(model->config().n_vocab), NAN);
  pf.run(st, prompt.data(), 256, logits.data(), false, s);  // warm-up
  st.reset(s);
  pf.run(st, prompt.data(), 256, logits.data(), false, s);
  const sc::PrefillProfile& p = pf.last_profile();
  std::printf("[cuda-perf] strata-tiny %s\n", p.summary().c_str());
  EXPECT_EQ(p.tokens, 256);
  EXPECT_GT(p.total, 0.0);
  const double parts = p.embed_norm_add + p.projections + p.attention + p.deltanet + p.routing + p.experts +
                       p.combine + p.logits;
  EXPECT_GT(parts, 0.3 * p.total);
  EXPECT_LE(parts, 1.05 * p.total);
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  cudaStreamDestroy(s);
}

// Real shapes (run by hand / the GPU check with STRATA_PREFILL_SYNTH=<file from `strata synth`>): exact
// and fast prefill against the per-token path on a short prompt, then 512-token prefill times per mode.
TEST(CudaPrefill, SynthModelFromEnv) {
  REQUIRE_GPU();
  const char* path = std::getenv("STRATA_PREFILL_SYNTH");
  if (!path || !*path) GTEST_SKIP() << "set STRATA_PREFILL_SYNTH to a synth GGUF file to run";
  auto model = strata::Model::load(path);
  const size_t vocab = static_cast<size_t>(model->config().n_vocab);
  {
    const int n = 40;
    const std::vector<int32_t> prompt = some_prompt(static_cast<int64_t>(vocab), n);
    sc::GpuSessionOptions per_token;
    per_token.batched_prefill = false;
    std::vector<float> want(vocab, NAN);
    {
      sc::GpuSession gpu(*model, n + 1, per_token);
      gpu.forward(prompt.data(), n, want.data(), false);
    }
    for (sc::PrefillMath math : {sc::PrefillMath::Exact, sc::PrefillMath::Fast}) {
      sc::GpuSessionOptions o;
      o.prefill_math = math;
      o.prefill_chunk = 16;  // three chunks
      sc::GpuSession gpu(*model, n + 1, o);
      std::vector<float> got(vocab, NAN);
      gpu.forward(prompt.data(), n, got.data(), false);
      const double e = max_row_rel_err(got, want, vocab);
      std::printf("[cuda-prefill] synth %s: last-token logits vs per-token path %.3g\n", sc::prefill_math_name(math), e);
      EXPECT_LE(e, math == sc::PrefillMath::Exact ? 1e-4 : 3e-2);
    }
  }
  const int n = 512;
  const std::vector<int32_t> prompt = some_prompt(static_cast<int64_t>(vocab), n);
  sc::DeviceModel dm(*model);
  sc::DeviceSequenceState st(model->config(), n);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::vector<float> logits(vocab, NAN);
  for (sc::PrefillMath math : {sc::PrefillMath::Exact, sc::PrefillMath::Fast}) {
    sc::PrefillOptions o;
    o.math = math;
    o.profile = true;
    sc::GpuPrefill pf(dm, o);
    for (int rep = 0; rep < 3; ++rep) {
      st.reset(s);
      pf.run(st, prompt.data(), n, logits.data(), false, s);
      std::printf("[cuda-perf] synth %s %s\n", sc::prefill_math_name(math), pf.last_profile().summary().c_str());
    }
  }
  cudaStreamDestroy(s);
}

}  // namespace

#endif  // STRATA_HAVE_CUDA
