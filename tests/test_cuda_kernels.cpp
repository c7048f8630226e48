// Every CUDA kernel of the decode step against the CPU engine's operation (src/strata/cpu/ops.h) or a
// float64 reference written here, on fresh random inputs, with the output poisoned (NaN) before each
// launch so an unwritten element fails. Skips (with a message) where CUDA is not built or no GPU exists.
#include <gtest/gtest.h>

#ifndef STRATA_HAVE_CUDA
TEST(CudaKernels, Skipped) { GTEST_SKIP() << "built without CUDA (STRATA_HAVE_CUDA undefined)"; }
#else

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "strata/base/error.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/cpu/ops.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/kernels.h"
#include "strata/model/kv_type.h"
#include "strata/cuda/matvec_kernels.h"
#include "strata/cuda/prefill_kernels.h"
#include "strata/engine/session.h"
#include "strata/quant/quantize.h"
#include "strata/sample/sampler.h"
#include "cuda_test_models.h"

namespace {

using strata::GgmlType;
namespace sc = strata::cuda;
using strata::cuda_test::Dev;

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// max_i |a_i - b_i| / max_i |b_i|; NaN anywhere gives infinity.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num = std::max(num, std::fabs(double(a[i]) - b[i]));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

// Random weights encoded in `type`: rows x cols, packed.
std::vector<uint8_t> make_weights(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t rb = strata::row_bytes(type, cols);
  std::vector<uint8_t> w(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> f = randn(static_cast<size_t>(cols), rng, 0.5f);
    strata::quantize_row(type, f.data(), w.data() + static_cast<size_t>(r) * rb, cols);
  }
  return w;
}

// Float64 reference product of the decoded weights with x.
std::vector<float> ref_matvec(GgmlType type, const uint8_t* w, int64_t rows, int64_t cols, const float* x) {
  const size_t rb = strata::row_bytes(type, cols);
  std::vector<float> row(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    strata::dequantize_row(type, w + static_cast<size_t>(r) * rb, row.data(), cols);
    double acc = 0;
    for (int64_t i = 0; i < cols; ++i) acc += double(row[i]) * x[i];
    y[r] = static_cast<float>(acc);
  }
  return y;
}

sc::DevMatrix dev_matrix(GgmlType type, const Dev<uint8_t>& buf, int64_t rows, int64_t cols, int n_expert = 1) {
  sc::DevMatrix m;
  m.type = type;
  m.data = buf.p;
  m.n_rows = rows;
  m.n_cols = cols;
  m.row_bytes = strata::row_bytes(type, cols);
  m.n_expert = n_expert;
  m.expert_stride = n_expert > 1 ? m.row_bytes * static_cast<size_t>(rows) : 0;
  return m;
}

// The CPU engine's routing of logits (route_token: softmax, top-k with ties to the lower id, weights
// renormalised over the k picks in double when norm).
struct CpuRoute {
  std::vector<int> ids;
  std::vector<float> weights;
};
CpuRoute cpu_route(const std::vector<float>& logits, int k, bool norm) {
  std::vector<float> p = logits;
  CpuRoute r;
  r.ids.resize(static_cast<size_t>(k));
  r.weights.resize(static_cast<size_t>(k));
  strata::route_token(p.data(), static_cast<int>(p.size()), k, norm, r.ids.data(), r.weights.data());
  return r;
}

// The kernel tests compare with float64 references of the float arithmetic, so the matvec runs in
// GemvMath::Float for the whole file; the int8 form (the default) has its own tests at the end.
class FloatGemvEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { sc::set_gemv_math(sc::GemvMath::Float); }
};
::testing::Environment* const kFloatGemv = ::testing::AddGlobalTestEnvironment(new FloatGemvEnvironment);

const GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                           GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

TEST(CudaKernels, MatvecEveryTypeMatchesFloat64) {
  REQUIRE_GPU();
  std::mt19937 rng(11);
  for (GgmlType type : kTypes) {
    const bool is_float = type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
    for (int64_t cols : {int64_t{512}, int64_t{is_float ? 300 : 1024}}) {
      const int64_t rows = 77;  // not a multiple of the rows per block
      const std::vector<uint8_t> w = make_weights(type, rows, cols, rng);
      const std::vector<float> x = randn(static_cast<size_t>(cols), rng);
      Dev<uint8_t> dw(w);
      Dev<float> dx(x), dy(static_cast<size_t>(rows));
      sc::matvec(dev_matrix(type, dw, rows, cols), dx.p, dy.p, nullptr);
      const double e = rel_err(dy.get(), ref_matvec(type, w.data(), rows, cols, x.data()));
      EXPECT_LE(e, 1e-5) << strata::type_traits(type).name << " cols " << cols;
    }
  }
}

TEST(CudaKernels, EmbedRowDecodesLikeDequantizeRow) {
  REQUIRE_GPU();
  std::mt19937 rng(13);
  for (GgmlType type : kTypes) {
    const int64_t rows = 9, cols = 512;
    const std::vector<uint8_t> w = make_weights(type, rows, cols, rng);
    Dev<uint8_t> dw(w);
    Dev<int> tok(std::vector<int>{6});
    Dev<float> dx(static_cast<size_t>(cols));
    sc::embed_row(dev_matrix(type, dw, rows, cols), tok.p, dx.p, nullptr);
    std::vector<float> ref(static_cast<size_t>(cols));
    strata::dequantize_row(type, w.data() + 6 * strata::row_bytes(type, cols), ref.data(), cols);
    EXPECT_LE(rel_err(dx.get(), ref), 1e-6) << strata::type_traits(type).name;
  }
}

TEST(CudaKernels, RmsNormAndAdd) {
  REQUIRE_GPU();
  std::mt19937 rng(14);
  const int n = 3, d = 1000;
  const std::vector<float> x = randn(n * d, rng, 3.0f), w = randn(d, rng), y = randn(n * d, rng);
  Dev<float> dx(x), dw(w), dout(n * d);
  sc::rmsnorm_rows(dx.p, dw.p, 1e-6f, n, d, dout.p, nullptr);
  std::vector<float> ref(n * d);
  for (int t = 0; t < n; ++t) strata::rmsnorm(x.data() + t * d, w.data(), 1e-6f, d, ref.data() + t * d);
  EXPECT_LE(rel_err(dout.get(), ref), 1e-6);
  {  // the pair form: both halves of each output row as rmsnorm_rows writes them, the padding untouched
    const std::vector<float> x2 = randn(n * d, rng, 0.5f), w2 = randn(d, rng);
    Dev<float> dx2(x2), dw2(w2), dout2(n * d), dpair(static_cast<size_t>(n) * (2 * d + 3));
    sc::rmsnorm_rows(dx2.p, dw2.p, 1e-6f, n, d, dout2.p, nullptr);
    sc::rmsnorm_rows_pair(dx.p, dw.p, dx2.p, dw2.p, 1e-6f, n, d, dpair.p, 2 * d + 3, nullptr);
    const std::vector<float> a = dout.get(), b = dout2.get(), pair = dpair.get();
    for (int t = 0; t < n; ++t) {
      const float* row = pair.data() + t * (2 * d + 3);
      EXPECT_EQ(0, std::memcmp(row, a.data() + t * d, d * sizeof(float))) << "row " << t;
      EXPECT_EQ(0, std::memcmp(row + d, b.data() + t * d, d * sizeof(float))) << "row " << t;
      for (int i = 2 * d; i < 2 * d + 3; ++i) EXPECT_TRUE(std::isnan(row[i])) << "padding of row " << t;
    }
  }

  Dev<float> dy(y);
  sc::add_inplace(dx.p, dy.p, n * d, nullptr);
  std::vector<float> sum(x);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
  EXPECT_EQ(dx.get(), sum);
}

// deltanet_step_fast at a key-head size its split layout does not take (one thread per value column),
// over several steps (state carried), against the CPU recurrence. The q/k norms are applied on the CPU
// first (conv_qk_norm's job, tested below).
TEST(CudaKernels, DeltaNetStepColumnFormMatchesCpuRecurrence) {
  REQUIRE_GPU();
  std::mt19937 rng(18);
  const int nk = 2, nv = 4, dk = 12, dv = 64;
  ASSERT_FALSE(sc::deltanet_step_fuses_qk_norm(dk));  // the column form
  const int key_dim = nk * dk, channels = 2 * key_dim + nv * dv;
  const float eps = 1e-6f, q_scale = 1.0f / std::sqrt(float(dk));
  std::vector<float> S = randn(nv * dk * dv, rng, 0.1f);
  const std::vector<float> a = {-0.5f, -1.0f, -0.1f, -2.0f}, dt_bias = randn(nv, rng), norm_w = randn(dv, rng);
  Dev<float> dS(S), da(a), ddt(dt_bias), dnorm(norm_w), dout(nv * dv);
  Dev<double> scratch(sc::deltanet_scratch_doubles(nv, dv));
  Dev<unsigned int> counters(std::vector<unsigned int>(nv, 0u));
  for (int step = 0; step < 3; ++step) {
    std::vector<float> mixed = randn(channels, rng);
    const std::vector<float> b = randn(nv, rng), alpha = randn(nv, rng, 3.0f), z = randn(nv * dv, rng);
    // CPU: the sequence deltanet_block performs for one token.
    float* q = mixed.data();
    float* k = mixed.data() + key_dim;
    for (int h = 0; h < nk; ++h) {
      strata::l2norm_inplace(q + h * dk, dk, 1e-6f);
      strata::l2norm_inplace(k + h * dk, dk, 1e-6f);
      for (int i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
    }
    Dev<float> dmixed(mixed), db(b), dalpha(alpha), dz(z);
    cudaMemset(dout.p, 0xff, nv * dv * sizeof(float));
    sc::deltanet_step_fast(dS.p, dmixed.p, db.p, dalpha.p, da.p, ddt.p, dnorm.p, dz.p, eps, nk, nv, dk, dv, scratch.p,
                           counters.p, dout.p, nullptr);
    std::vector<float> ref(nv * dv);
    for (int h = 0; h < nv; ++h) {
      const int kh = h % nk;
      const float beta = strata::sigmoidf(b[h]);
      const float g = a[h] * strata::softplusf(alpha[h] + dt_bias[h]);
      float* o = ref.data() + h * dv;
      strata::deltanet_step(S.data() + h * dk * dv, q + kh * dk, k + kh * dk, mixed.data() + 2 * key_dim + h * dv, g,
                            beta, dk, dv, o);
      strata::rmsnorm(o, norm_w.data(), eps, dv, o);
      for (int j = 0; j < dv; ++j) o[j] *= strata::siluf(z[h * dv + j]);
    }
    EXPECT_LE(rel_err(dout.get(), ref), 1e-5) << "output, step " << step;
    EXPECT_LE(rel_err(dS.get(), S), 1e-5) << "state, step " << step;
  }
}

TEST(CudaKernels, RouterTopKMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(19);
  for (int n_expert : {32, 128, 256, 300, 1000}) {  // registers up to 256, shared memory beyond
    for (bool norm : {true, false}) {
      const int k = 8;
      std::vector<float> logits = randn(n_expert, rng, 2.0f);
      logits[3] = logits[n_expert - 1] = *std::max_element(logits.begin(), logits.end()) + 1.0f;  // a tie at the top: the lower id first
      Dev<float> dl(logits), dw(k);
      Dev<int> dids(k);
      sc::route_topk(dl.p, n_expert, k, norm, dids.p, dw.p, nullptr);
      const CpuRoute want = cpu_route(logits, k, norm);
      EXPECT_EQ(dids.get(), want.ids) << n_expert;
      EXPECT_LE(rel_err(dw.get(), want.weights), 1e-6) << n_expert;
    }
  }
}

// The batched prefill's routing (one warp per token) picks what the CPU picks for every token, and
// exactly what the decode's route_topk picks (the same routine), at both of its forms; under the sigmoid
// rule (soft-cap, selection bias, weight scale) what the CPU's route_token_sigmoid picks.
TEST(CudaKernels, PrefillRoutingRowsEqualTheCpuAndTheDecodeRouting) {
  REQUIRE_GPU();
  std::mt19937 rng(23);
  const int n = 37, k = 8;  // not a whole number of the kernel's four tokens per block
  for (int n_expert : {128, 300}) {
    for (bool norm : {true, false}) {
      std::vector<float> logits = randn(static_cast<size_t>(n) * n_expert, rng, 2.0f);
      for (int t = 0; t < n; t += 5) {  // ties inside the top k: the lower id first
        float* row = logits.data() + static_cast<size_t>(t) * n_expert;
        row[7] = row[2] = *std::max_element(row, row + n_expert) + 0.5f;
      }
      Dev<float> dl(logits), dw(static_cast<size_t>(n) * k), dw1(k);
      Dev<int> dids(static_cast<size_t>(n) * k), dids1(k);
      sc::prefill::route_topk_rows(dl.p, n, n_expert, k, norm, sc::RouteRule{}, dids.p, dw.p, nullptr);
      const std::vector<int> ids = dids.get();
      const std::vector<float> wts = dw.get();
      for (int t = 0; t < n; ++t) {
        const std::vector<float> row(logits.begin() + static_cast<int64_t>(t) * n_expert,
                                     logits.begin() + static_cast<int64_t>(t + 1) * n_expert);
        const CpuRoute want = cpu_route(row, k, norm);
        const std::vector<int> got_ids(ids.begin() + t * k, ids.begin() + (t + 1) * k);
        const std::vector<float> got_w(wts.begin() + t * k, wts.begin() + (t + 1) * k);
        EXPECT_EQ(got_ids, want.ids) << "token " << t << " n_expert " << n_expert;
        EXPECT_LE(rel_err(got_w, want.weights), 1e-6) << "token " << t;
        sc::route_topk(dl.p + static_cast<int64_t>(t) * n_expert, n_expert, k, norm, dids1.p, dw1.p, nullptr);
        EXPECT_EQ(dids1.get(), got_ids) << "token " << t;
        EXPECT_EQ(dw1.get(), got_w) << "token " << t;
      }
    }
  }
}

TEST(CudaKernels, PrefillSigmoidRoutingRowsEqualTheCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(29);
  const int n = 37, k = 4;
  for (int n_expert : {64, 300}) {  // the register form and the shared-memory form
    for (bool with_bias : {false, true}) {
      for (bool norm : {true, false}) {
        const float softcap = with_bias ? 1.5f : 0.0f, scale = 2.5f;
        const std::vector<float> logits = randn(static_cast<size_t>(n) * n_expert, rng, 2.0f);
        const std::vector<float> bias = randn(static_cast<size_t>(n_expert), rng, 0.5f);
        Dev<float> dl(logits), dbias(bias), dw(static_cast<size_t>(n) * k);
        Dev<int> dids(static_cast<size_t>(n) * k);
        sc::RouteRule rule;
        rule.sigmoid = true;
        rule.softcap = softcap;
        rule.bias = with_bias ? dbias.p : nullptr;
        rule.scale = scale;
        sc::prefill::route_topk_rows(dl.p, n, n_expert, k, norm, rule, dids.p, dw.p, nullptr);
        const std::vector<int> ids = dids.get();
        const std::vector<float> wts = dw.get();
        for (int t = 0; t < n; ++t) {
          std::vector<float> row(logits.begin() + static_cast<int64_t>(t) * n_expert,
                                 logits.begin() + static_cast<int64_t>(t + 1) * n_expert);
          std::vector<int> want_ids(static_cast<size_t>(k));
          std::vector<float> want_w(static_cast<size_t>(k));
          strata::route_token_sigmoid(row.data(), with_bias ? bias.data() : nullptr, n_expert, k, softcap, norm,
                                      want_ids.data(), want_w.data());
          for (float& w : want_w) w *= scale;
          const std::vector<int> got_ids(ids.begin() + t * k, ids.begin() + (t + 1) * k);
          const std::vector<float> got_w(wts.begin() + t * k, wts.begin() + (t + 1) * k);
          EXPECT_EQ(got_ids, want_ids) << "token " << t << " n_expert " << n_expert << " bias " << with_bias;
          EXPECT_LE(rel_err(got_w, want_w), 1e-6) << "token " << t << " n_expert " << n_expert;
        }
      }
    }
  }
}

TEST(CudaKernels, UnsupportedTypeFailsLoudly) {
  REQUIRE_GPU();
  sc::DevMatrix m;
  m.type = GgmlType::Q4_0;
  m.n_rows = 1;
  m.n_cols = 32;
  EXPECT_THROW(sc::matvec(m, nullptr, nullptr, nullptr), strata::Error);
}

// ---- fast decode step: batched matvec and fused kernels ----------------------------------------------

// Shapes of the real models (2048/4096 columns, 512-column expert rows) and odd block counts (Q6_K rows of
// 768 columns start at 2 mod 4 bytes every other row), several jobs with different types in one launch.
TEST(CudaKernels, GemvBatchMixedTypesAndShapes) {
  REQUIRE_GPU();
  std::mt19937 rng(31);
  for (int64_t cols : {int64_t{512}, int64_t{768}, int64_t{2048}, int64_t{4096}}) {
    std::vector<GgmlType> types = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0,
                                   GgmlType::F32,  GgmlType::F16,  GgmlType::BF16};
    const std::vector<int64_t> rows = {300, 33, 129, 64, 17, 256, 5};
    const std::vector<float> x = randn(static_cast<size_t>(cols), rng);
    Dev<float> dx(x);
    std::vector<std::vector<uint8_t>> w;
    std::vector<std::unique_ptr<Dev<uint8_t>>> dw;
    std::vector<std::unique_ptr<Dev<float>>> dy;
    std::vector<sc::DevMatrix> m(types.size());
    std::vector<sc::GemvJob> jobs(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      w.push_back(make_weights(types[i], rows[i], cols, rng));
      dw.push_back(std::make_unique<Dev<uint8_t>>(w.back()));
      dy.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(rows[i])));
      m[i] = dev_matrix(types[i], *dw.back(), rows[i], cols);
      jobs[i].w = &m[i];
      jobs[i].x = dx.p;
      jobs[i].y = dy.back()->p;
    }
    sc::gemv_batch(jobs.data(), static_cast<int>(jobs.size()), nullptr);
    for (size_t i = 0; i < types.size(); ++i) {
      const double e = rel_err(dy[i]->get(), ref_matvec(types[i], w[i].data(), rows[i], cols, x.data()));
      EXPECT_LE(e, 1e-5) << strata::type_traits(types[i]).name << " cols " << cols;
    }
  }
}

// Large enough that the grid loops over tiles (the lm_head case), with Accumulate into a random y.
TEST(CudaKernels, GemvAccumulateOverManyTiles) {
  REQUIRE_GPU();
  std::mt19937 rng(32);
  const int64_t rows = 40000, cols = 256;
  for (GgmlType type : {GgmlType::Q6_K, GgmlType::Q4_K}) {
    const std::vector<uint8_t> w = make_weights(type, rows, cols, rng);
    const std::vector<float> x = randn(cols, rng), y0 = randn(rows, rng);
    Dev<uint8_t> dw(w);
    Dev<float> dx(x), dy(y0);
    const sc::DevMatrix m = dev_matrix(type, dw, rows, cols);
    sc::GemvJob j;
    j.w = &m, j.x = dx.p, j.y = dy.p, j.mode = sc::GemvMode::Accumulate;
    sc::gemv_batch(&j, 1, nullptr);
    std::vector<float> ref = ref_matvec(type, w.data(), rows, cols, x.data());
    for (int64_t r = 0; r < rows; ++r) ref[r] += y0[r];
    EXPECT_LE(rel_err(dy.get(), ref), 1e-5) << strata::type_traits(type).name;
  }
}

// Routed gate+up+SwiGLU pairs and a routed down projection with per-slot inputs, through a slot map
// that leaves one picked expert out (its output must be zero) and moves the others.
TEST(CudaKernels, GemvRoutedPairsThroughSlotMap) {
  REQUIRE_GPU();
  std::mt19937 rng(33);
  const int n_res = 4, ff = 256, d = 512;  // 6 experts, 4 resident
  const std::vector<int> ids = {4, 1, 5, 3};
  const std::vector<int> slot_of = {-1, 3, 0, -1, 1, 2};  // expert -> slot; experts 0 and 3 not resident
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::BF16}) {
    // Resident stacks: slot s holds expert e with slot_of[e] == s.
    const std::vector<uint8_t> gate = make_weights(type, int64_t{ff} * n_res, d, rng);
    const std::vector<uint8_t> up = make_weights(type, int64_t{ff} * n_res, d, rng);
    const std::vector<uint8_t> down = make_weights(type, int64_t{d} * n_res, ff, rng);
    const std::vector<float> x = randn(d, rng);
    Dev<uint8_t> dg(gate), du(up), dd(down);
    Dev<int> did(ids), dslot(slot_of);
    Dev<float> dx(x), dh(ids.size() * ff), dy(ids.size() * d);
    const sc::DevMatrix mg = dev_matrix(type, dg, ff, d, n_res), mu = dev_matrix(type, du, ff, d, n_res),
                        md = dev_matrix(type, dd, d, ff, n_res);
    std::vector<sc::GemvJob> pair(ids.size()), dn(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      pair[j].w = &mg, pair[j].w2 = &mu, pair[j].x = dx.p, pair[j].y = dh.p + j * ff;
      pair[j].mode = sc::GemvMode::SwigluPair, pair[j].ids = did.p, pair[j].slot = static_cast<int>(j);
      pair[j].slot_of_expert = dslot.p;
      dn[j].w = &md, dn[j].x = dh.p + j * ff, dn[j].y = dy.p + j * d, dn[j].ids = did.p;
      dn[j].slot = static_cast<int>(j), dn[j].slot_of_expert = dslot.p;
    }
    sc::gemv_batch(pair.data(), static_cast<int>(pair.size()), nullptr);
    sc::gemv_batch(dn.data(), static_cast<int>(dn.size()), nullptr);
    const std::vector<float> h = dh.get(), y = dy.get();
    const size_t gstride = strata::row_bytes(type, d) * ff, dstride = strata::row_bytes(type, ff) * d;
    for (size_t j = 0; j < ids.size(); ++j) {
      const int s = slot_of[ids[j]];
      std::vector<float> href(ff, 0.0f), yref(d, 0.0f);
      if (s >= 0) {
        const std::vector<float> gv = ref_matvec(type, gate.data() + gstride * s, ff, d, x.data());
        const std::vector<float> uv = ref_matvec(type, up.data() + gstride * s, ff, d, x.data());
        for (int r = 0; r < ff; ++r) href[r] = strata::siluf(gv[r]) * uv[r];
        // The down reference reads the GPU's h (the pair stage is checked separately above).
        yref = ref_matvec(type, down.data() + dstride * s, d, ff, h.data() + j * ff);
      }
      const std::vector<float> hg(h.begin() + j * ff, h.begin() + (j + 1) * ff);
      const std::vector<float> yg(y.begin() + j * d, y.begin() + (j + 1) * d);
      if (s < 0) {
        EXPECT_EQ(hg, href) << "non-resident expert must give zeros";
        EXPECT_EQ(yg, yref) << "non-resident expert must give zeros";
      } else {
        EXPECT_LE(rel_err(hg, href), 1e-5) << strata::type_traits(type).name << " slot " << j;
        EXPECT_LE(rel_err(yg, yref), 1e-5) << strata::type_traits(type).name << " slot " << j;
      }
    }
  }
}

// Partial and full rotary.
TEST(CudaKernels, AttnPrepEqualsNormRopeAndStore) {
  REQUIRE_GPU();
  std::mt19937 rng(34);
  for (int rope_dims : {32, 64}) {
    const int n_head = 4, n_kv = 2, hd = 64, pos = 77, max_ctx = 90;
    const int q_stride = 2 * hd, kv_width = n_kv * hd;
    const std::vector<float> q = randn(n_head * q_stride, rng), k = randn(kv_width, rng), v = randn(kv_width, rng),
                             qn = randn(hd, rng), kn = randn(hd, rng);
    Dev<float> dq(q), dk(k), dv(v), dqn(qn), dkn(kn), kc(max_ctx * kv_width), vc(max_ctx * kv_width);
    Dev<int> dpos(std::vector<int>{pos});
    sc::attn_prep(dq.p, q_stride, dk.p, dv.p, kc.p, vc.p, kv_width, n_head, n_kv, hd, dqn.p, dkn.p, 1e-6f, rope_dims,
                  1e7f, dpos.p, nullptr);
    std::vector<float> qref(q), kref(kv_width);
    for (int h = 0; h < n_head; ++h) {
      strata::rmsnorm(q.data() + h * q_stride, qn.data(), 1e-6f, hd, qref.data() + h * q_stride);
      strata::rope_neox_inplace(qref.data() + h * q_stride, rope_dims, pos, 1e7f);
    }
    for (int h = 0; h < n_kv; ++h) {
      strata::rmsnorm(k.data() + h * hd, kn.data(), 1e-6f, hd, kref.data() + h * hd);
      strata::rope_neox_inplace(kref.data() + h * hd, rope_dims, pos, 1e7f);
    }
    EXPECT_LE(rel_err(dq.get(), qref), 1e-6) << "rope_dims " << rope_dims;
    const std::vector<float> kcache = kc.get(), vcache = vc.get();
    EXPECT_LE(rel_err(std::vector<float>(kcache.begin() + pos * kv_width, kcache.begin() + (pos + 1) * kv_width), kref),
              1e-6)
        << "rope_dims " << rope_dims;
    EXPECT_EQ(std::vector<float>(vcache.begin() + pos * kv_width, vcache.begin() + (pos + 1) * kv_width), v);
  }
}

// The fused conv + q/k norm and the wide DeltaNet step against the CPU sequence, at the real head sizes
// (dk = dv = 128) and at small ones, over several steps (state carried).
TEST(CudaKernels, ConvQkNormAndWideDeltaNetStepMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(35);
  struct Shape {
    int nk, nv, dk, dv;
  };
  for (const Shape sh : {Shape{2, 4, 128, 128}, Shape{2, 2, 64, 32}, Shape{1, 2, 16, 48}}) {
    const int nk = sh.nk, nv = sh.nv, dk = sh.dk, dv = sh.dv, K = 4;
    const int key_dim = nk * dk, channels = 2 * key_dim + nv * dv;
    const float eps = 1e-6f, q_scale = 1.0f / std::sqrt(float(dk));
    std::vector<float> S = randn(static_cast<size_t>(nv) * dk * dv, rng, 0.1f);
    std::vector<float> conv_state = randn(static_cast<size_t>(K - 1) * channels, rng);
    const std::vector<float> convw = randn(static_cast<size_t>(channels) * K, rng, 0.5f);
    std::vector<float> a(nv);
    for (float& v : a) v = -std::fabs(randn(1, rng)[0]);
    const std::vector<float> dt_bias = randn(nv, rng), norm_w = randn(dv, rng);
    Dev<float> dS(S), dcs(conv_state), dcw(convw), da(a), ddt(dt_bias), dnorm(norm_w), dmixed(channels),
        dout(static_cast<size_t>(nv) * dv);
    Dev<double> dscratch(sc::deltanet_scratch_doubles(nv, dv));
    Dev<unsigned int> dcounters(std::vector<unsigned int>(nv, 0u));
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> x = randn(channels, rng), b = randn(nv, rng), alpha = randn(nv, rng, 3.0f),
                               z = randn(static_cast<size_t>(nv) * dv, rng);
      Dev<float> dx(x), db(b), dalpha(alpha), dz(z);
      sc::conv_qk_norm(dx.p, dcw.p, K, dcs.p, dmixed.p, nk, nv, dk, dv, q_scale, nullptr);
      sc::deltanet_step_fast(dS.p, dmixed.p, db.p, dalpha.p, da.p, ddt.p, dnorm.p, dz.p, eps, nk, nv, dk, dv,
                             dscratch.p, dcounters.p, dout.p, nullptr);
      std::vector<float> mixed(channels);
      strata::conv1d_step(x.data(), convw.data(), K, channels, conv_state.data(), mixed.data());
      for (float& m : mixed) m = strata::siluf(m);
      float* q = mixed.data();
      float* k = mixed.data() + key_dim;
      for (int h = 0; h < nk; ++h) {
        strata::l2norm_inplace(q + h * dk, dk, 1e-6f);
        strata::l2norm_inplace(k + h * dk, dk, 1e-6f);
        for (int i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
      }
      EXPECT_LE(rel_err(dmixed.get(), mixed), 1e-6) << "mixed, dk " << dk << " step " << step;
      EXPECT_EQ(dcs.get(), conv_state) << "conv state, step " << step;
      std::vector<float> ref(static_cast<size_t>(nv) * dv);
      for (int h = 0; h < nv; ++h) {
        const int kh = h % nk;
        const float beta = strata::sigmoidf(b[h]);
        const float g = a[h] * strata::softplusf(alpha[h] + dt_bias[h]);
        float* o = ref.data() + static_cast<size_t>(h) * dv;
        strata::deltanet_step(S.data() + static_cast<size_t>(h) * dk * dv, q + kh * dk, k + kh * dk,
                              mixed.data() + 2 * key_dim + h * dv, g, beta, dk, dv, o);
        strata::rmsnorm(o, norm_w.data(), eps, dv, o);
        for (int j = 0; j < dv; ++j) o[j] *= strata::siluf(z[static_cast<size_t>(h) * dv + j]);
      }
      EXPECT_LE(rel_err(dout.get(), ref), 2e-5) << "output, dk " << dk << " step " << step;
      EXPECT_LE(rel_err(dS.get(), S), 2e-5) << "state, dk " << dk << " step " << step;
      EXPECT_EQ(dcounters.get(), std::vector<unsigned int>(nv, 0u)) << "counters must be left at zero";
    }
  }
}

// The fused DeltaNet input: conv1d + SiLU per row of the qkv projection (GemvJob::conv_w) and the q/k
// L2 norms inside the step (qk_norm), against the CPU's projection -> conv -> norms -> step.
TEST(CudaKernels, FusedConvProjectionAndQkNormStepMatchCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(44);
  struct Shape {
    int nk, nv, dk, dv;
  };
  for (const Shape sh : {Shape{2, 4, 128, 128}, Shape{2, 2, 64, 32}, Shape{1, 2, 16, 48}}) {
    const int nk = sh.nk, nv = sh.nv, dk = sh.dk, dv = sh.dv, K = 4, cols = 512;
    ASSERT_TRUE(sc::deltanet_step_fuses_qk_norm(dk));
    const int key_dim = nk * dk, channels = 2 * key_dim + nv * dv;
    const float eps = 1e-6f, q_scale = 1.0f / std::sqrt(float(dk));
    std::vector<float> S = randn(static_cast<size_t>(nv) * dk * dv, rng, 0.1f);
    std::vector<float> conv_state = randn(static_cast<size_t>(K - 1) * channels, rng);
    const std::vector<float> convw = randn(static_cast<size_t>(channels) * K, rng, 0.5f);
    const std::vector<uint8_t> wq = make_weights(GgmlType::Q4_K, channels, cols, rng);
    std::vector<float> a(nv);
    for (float& v : a) v = -std::fabs(randn(1, rng)[0]);
    const std::vector<float> dt_bias = randn(nv, rng), norm_w = randn(dv, rng);
    Dev<uint8_t> dwq(wq);
    Dev<float> dS(S), dcs(conv_state), dcw(convw), da(a), ddt(dt_bias), dnorm(norm_w), dmixed(channels),
        dout(static_cast<size_t>(nv) * dv);
    Dev<double> dscratch(sc::deltanet_scratch_doubles(nv, dv));
    Dev<unsigned int> dcounters(std::vector<unsigned int>(nv, 0u));
    const sc::DevMatrix mq = dev_matrix(GgmlType::Q4_K, dwq, channels, cols);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> xin = randn(cols, rng), b = randn(nv, rng), alpha = randn(nv, rng, 3.0f),
                               z = randn(static_cast<size_t>(nv) * dv, rng);
      Dev<float> dxin(xin), db(b), dalpha(alpha), dz(z);
      sc::GemvJob j;
      j.w = &mq, j.x = dxin.p, j.y = dmixed.p, j.conv_w = dcw.p, j.conv_state = dcs.p, j.conv_k = K;
      j.conv_channels = channels;
      sc::gemv_batch(&j, 1, nullptr);
      sc::deltanet_step_fast(dS.p, dmixed.p, db.p, dalpha.p, da.p, ddt.p, dnorm.p, dz.p, eps, nk, nv, dk, dv,
                             dscratch.p, dcounters.p, dout.p, nullptr, true, q_scale);
      const std::vector<float> x = ref_matvec(GgmlType::Q4_K, wq.data(), channels, cols, xin.data());
      std::vector<float> mixed(channels);
      strata::conv1d_step(x.data(), convw.data(), K, channels, conv_state.data(), mixed.data());
      for (float& m : mixed) m = strata::siluf(m);
      EXPECT_LE(rel_err(dmixed.get(), mixed), 1e-5) << "conv output, dk " << dk << " step " << step;
      EXPECT_LE(rel_err(dcs.get(), conv_state), 1e-5) << "conv state, step " << step;
      float* q = mixed.data();
      float* k = mixed.data() + key_dim;
      for (int h = 0; h < nk; ++h) {
        strata::l2norm_inplace(q + h * dk, dk, 1e-6f);
        strata::l2norm_inplace(k + h * dk, dk, 1e-6f);
        for (int i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
      }
      std::vector<float> ref(static_cast<size_t>(nv) * dv);
      for (int h = 0; h < nv; ++h) {
        const int kh = h % nk;
        const float beta = strata::sigmoidf(b[h]);
        const float g = a[h] * strata::softplusf(alpha[h] + dt_bias[h]);
        float* o = ref.data() + static_cast<size_t>(h) * dv;
        strata::deltanet_step(S.data() + static_cast<size_t>(h) * dk * dv, q + kh * dk, k + kh * dk,
                              mixed.data() + 2 * key_dim + h * dv, g, beta, dk, dv, o);
        strata::rmsnorm(o, norm_w.data(), eps, dv, o);
        for (int jj = 0; jj < dv; ++jj) o[jj] *= strata::siluf(z[static_cast<size_t>(h) * dv + jj]);
      }
      EXPECT_LE(rel_err(dout.get(), ref), 1e-4) << "output, dk " << dk << " step " << step;
      EXPECT_LE(rel_err(dS.get(), S), 1e-4) << "state, dk " << dk << " step " << step;
      // Carry the GPU's state on so that rounding differences do not pile up over the steps.
      S = dS.get();
      conv_state = dcs.get();
    }
  }
}

// With and without the shared expert, with and without the norm (the decode's down-job fallback).
TEST(CudaKernels, MoeCombineAddNormEqualsCombineThenRmsNorm) {
  REQUIRE_GPU();
  std::mt19937 rng(36);
  const int k = 8, d = 2048;
  const std::vector<float> ye = randn(k * d, rng), ys = randn(d, rng), x = randn(d, rng), nw = randn(d, rng);
  const std::vector<int> ids = {200, 3, 17, 99, 4, 250, 0, 31};
  const std::vector<float> wts = randn(k, rng, 0.3f), gate = {-0.4f};
  std::vector<int> order(k);
  for (int i = 0; i < k; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
  for (bool shared : {false, true}) {
    for (bool norm : {false, true}) {
      Dev<float> dx(x), dye(ye), dys(ys), dw(wts), dg(gate), dnw(nw), dxn(d);
      Dev<int> dids(ids);
      sc::moe_combine_add_norm(dx.p, dye.p, dids.p, dw.p, k, d, shared ? dys.p : nullptr, dg.p, norm ? dnw.p : nullptr,
                               1e-6f, dxn.p, nullptr);
      std::vector<float> want(x), wn(d);
      for (int j = 0; j < d; ++j) {
        double acc = 0;
        for (int s : order) acc += double(wts[s]) * ye[s * d + j];
        if (shared) acc += double(strata::sigmoidf(gate[0])) * ys[j];
        want[j] += static_cast<float>(acc);
      }
      EXPECT_LE(rel_err(dx.get(), want), 1e-6) << "shared " << shared << " norm " << norm;
      if (!norm) continue;
      strata::rmsnorm(want.data(), nw.data(), 1e-6f, d, wn.data());
      EXPECT_LE(rel_err(dxn.get(), wn), 1e-5) << "shared " << shared;
    }
  }
}

TEST(CudaKernels, ArgmaxWideAndRouteCounts) {
  REQUIRE_GPU();
  std::mt19937 rng(37);
  const int64_t n = 248320;
  Dev<unsigned long long> part(static_cast<size_t>(sc::argmax_wide_blocks(n)));
  Dev<unsigned int> counter(std::vector<unsigned int>{0u});
  for (int rep = 0; rep < 3; ++rep) {  // the counter must be left at zero for the next call
    std::vector<float> x = randn(static_cast<size_t>(n), rng);
    const float top = *std::max_element(x.begin(), x.end()) + 1.0f;
    x[n - 3 - rep] = top;
    x[1000 + rep] = top;  // tie: the lower index wins
    if (rep == 2) std::fill(x.begin(), x.end(), -1e30f), x[n - 1] = -1e29f;
    x[77] = NAN;  // never wins, as the host's argmax_logit skips it
    x[78] = -INFINITY;
    Dev<float> dx(x);
    Dev<int> out(1);
    sc::argmax_wide(dx.p, n, part.p, counter.p, out.p, nullptr);
    EXPECT_EQ(out.get()[0], strata::argmax_logit(x.data(), static_cast<int32_t>(n))) << rep;
  }
  {  // +inf wins unless finite_only; nothing finite: -1
    std::vector<float> x(5000, -INFINITY);
    x[10] = 1.0f, x[20] = INFINITY, x[30] = NAN;
    Dev<float> dx(x);
    Dev<int> out(1);
    sc::argmax_wide(dx.p, 5000, part.p, counter.p, out.p, nullptr);
    EXPECT_EQ(out.get()[0], 20);
    sc::argmax_wide(dx.p, 5000, part.p, counter.p, out.p, nullptr, true);
    EXPECT_EQ(out.get()[0], 10);
    std::vector<float> none(5000, NAN);
    none[3] = -INFINITY;
    Dev<float> dn(none);
    sc::argmax_wide(dn.p, 5000, part.p, counter.p, out.p, nullptr);
    EXPECT_EQ(out.get()[0], -1);
  }

  {  // rows: each row its own pick (ties, NaN, a row with nothing finite), twice (counters back at zero)
    const int rows = 5;
    const int64_t w = 70000, stride = 70003;
    Dev<unsigned long long> rpart(static_cast<size_t>(rows) * sc::argmax_wide_blocks(w));
    Dev<unsigned int> rcounter(std::vector<unsigned int>(rows, 0u));
    for (int rep = 0; rep < 2; ++rep) {
      std::vector<float> x = randn(static_cast<size_t>(rows * stride), rng);
      for (int r = 0; r < rows; ++r) {
        float* row = x.data() + r * stride;
        const float top = *std::max_element(row, row + w) + 1.0f;
        row[(r * 9973 + rep) % w] = top;
        row[(r * 7919 + 5) % w] = top;
        row[w + 1] = top + 5.0f;  // past the row: never read
      }
      std::fill(x.begin() + 3 * stride, x.begin() + 3 * stride + w, NAN);
      Dev<float> dx(x);
      Dev<int> out(rows);
      sc::argmax_wide(dx.p, w, rpart.p, rcounter.p, out.p, nullptr, false, nullptr, nullptr, rows, stride);
      const std::vector<int> got = out.get();
      for (int r = 0; r < rows; ++r) {
        int want = -1;
        if (r != 3) want = strata::argmax_logit(x.data() + r * stride, static_cast<int32_t>(w));
        EXPECT_EQ(got[r], want) << "row " << r << " rep " << rep;
      }
    }
  }

  const int n_expert = 64, k = 4;
  std::vector<unsigned long long> counts(n_expert, 0);
  Dev<unsigned long long> dcounts(counts);
  for (int t = 0; t < 5; ++t) {
    const std::vector<float> logits = randn(n_expert, rng);
    Dev<float> dl(logits), dw(k);
    Dev<int> dids(k);
    sc::route_topk(dl.p, n_expert, k, true, dids.p, dw.p, nullptr, dcounts.p);
    for (int id : dids.get()) ++counts[id];
  }
  EXPECT_EQ(dcounts.get(), counts);
}

// copy_batch: packed and strided copies, more of them than one launch takes, against the host's copy;
// bytes outside the destinations untouched.
TEST(CudaKernels, CopyBatchMatchesHostCopies) {
  REQUIRE_GPU();
  std::mt19937 rng(41);
  const size_t words = 1 << 16;
  std::vector<uint32_t> src(words);
  for (uint32_t& v : src) v = static_cast<uint32_t>(rng());
  Dev<uint32_t> dsrc(src);
  Dev<uint32_t> ddst(std::vector<uint32_t>(words, 0xabcdef01u));
  std::vector<uint32_t> want(words, 0xabcdef01u);
  std::vector<sc::DeviceCopy> copies;
  size_t at = 0;
  for (int i = 0; i < sc::kMaxDeviceCopies + 9; ++i) {
    const size_t row = 1 + static_cast<size_t>(rng() % 37), rows = 1 + static_cast<size_t>(rng() % 4);
    const size_t sp = row + static_cast<size_t>(rng() % 5), dp = row + static_cast<size_t>(rng() % 3);
    const size_t from = static_cast<size_t>(rng() % (words - sp * rows));
    sc::DeviceCopy c;
    c.dst = ddst.p + at;
    c.src = dsrc.p + from;
    c.row_bytes = row * 4;
    c.rows = rows;
    c.src_pitch = i % 3 == 0 ? 0 : sp * 4;
    c.dst_pitch = i % 2 == 0 ? 0 : dp * 4;
    const size_t s_step = c.src_pitch ? sp : row, d_step = c.dst_pitch ? dp : row;
    for (size_t r = 0; r < rows; ++r)
      for (size_t j = 0; j < row; ++j) want[at + r * d_step + j] = src[from + r * s_step + j];
    copies.push_back(c);
    at += d_step * rows + 1;
  }
  ASSERT_LT(at, words);
  sc::copy_batch(copies, nullptr);
  EXPECT_EQ(ddst.get(), want);
  sc::DeviceCopy odd;
  odd.dst = ddst.p;
  odd.src = reinterpret_cast<const char*>(dsrc.p) + 2;
  odd.row_bytes = 8;
  EXPECT_THROW(sc::copy_batch(&odd, 1, nullptr), strata::Error);
}

// Split attention at a short context (one chunk), a long one (many chunks merged by the last block)
// and again (the per-head counters must be left at zero), against attend_one_head.
TEST(CudaKernels, AttentionDecodeSplitMatchesAttendOneHead) {
  REQUIRE_GPU();
  std::mt19937 rng(38);
  struct Case {
    int hd, max_ctx, pos;
  };
  // Long and short caches (chunks of 32+ positions: one, several, a partial last one), and a head width
  // that is not a multiple of the warp.
  const Case cases[] = {{256, 3000, 5}, {256, 3000, 2999}, {256, 3000, 1700}, {256, 144, 0},
                        {256, 144, 31},  {256, 144, 32},   {256, 144, 143},  {80, 200, 150}};
  for (bool gated : {false, true}) {
    for (const Case& cs : cases) {
      const int n_head = 4, n_kv = 2, hd = cs.hd, max_ctx = cs.max_ctx, pos = cs.pos;
      const int q_stride = gated ? 2 * hd : hd, kv_width = n_kv * hd;
      const std::vector<float> q = randn(n_head * q_stride, rng),
                               k = randn(static_cast<size_t>(max_ctx) * kv_width, rng, 0.2f),
                               v = randn(static_cast<size_t>(max_ctx) * kv_width, rng);
      Dev<float> dq(q), dk(k), dv(v), dout(n_head * hd),
          scratch(sc::attention_scratch_floats(n_head, hd, max_ctx));
      Dev<unsigned int> counters(std::vector<unsigned int>(n_head, 0u));
      Dev<int> dpos(std::vector<int>{pos});
      const float scale = 1.0f / std::sqrt(float(hd));
      std::vector<float> ref(n_head * hd), scores(pos + 1);
      for (int h = 0; h < n_head; ++h) {
        const int g = h / (n_head / n_kv);
        float* o = ref.data() + h * hd;
        strata::attend_one_head(q.data() + h * q_stride, strata::f32_kv_head(k.data() + g * hd, kv_width),
                                strata::f32_kv_head(v.data() + g * hd, kv_width), pos + 1, hd, scale, scores.data(), o);
        if (gated)
          for (int d = 0; d < hd; ++d) o[d] *= strata::sigmoidf(q[h * q_stride + hd + d]);
      }
      for (int rep = 0; rep < 2; ++rep) {
        cudaMemset(dout.p, 0xff, n_head * hd * sizeof(float));
        sc::AttnOutGate og;
        if (gated) og.kind = sc::AttnOutGate::SigmoidAfterQuery;
        sc::attention_decode_split(dq.p, q_stride, dk.p, dv.p, kv_width, n_head, n_kv, hd, scale, og, dpos.p,
                                   max_ctx, scratch.p, counters.p, dout.p, nullptr);
        EXPECT_LE(rel_err(dout.get(), ref), 1e-5) << "gated " << gated << " pos " << pos << " rep " << rep;
      }
      EXPECT_EQ(counters.get(), std::vector<unsigned int>(n_head, 0u));
    }
  }
}

// Laguna's softplus output gates (one value per head, or per element), applied by the attention kernel
// where it writes its output: the ungated output times softplusf of the gate, at one chunk and many.
TEST(CudaKernels, AttentionDecodeSplitAppliesSoftplusGates) {
  REQUIRE_GPU();
  std::mt19937 rng(41);
  const int n_head = 4, n_kv = 2, hd = 128, max_ctx = 3000, kv_width = n_kv * hd;
  const std::vector<float> q = randn(n_head * hd, rng), k = randn(static_cast<size_t>(max_ctx) * kv_width, rng, 0.2f),
                           v = randn(static_cast<size_t>(max_ctx) * kv_width, rng),
                           gate = randn(n_head * hd, rng, 3.0f);
  Dev<float> dq(q), dk(k), dv(v), dg(gate), dout(n_head * hd), scratch(sc::attention_scratch_floats(n_head, hd, max_ctx));
  Dev<unsigned int> counters(std::vector<unsigned int>(n_head, 0u));
  const float scale = 1.0f / std::sqrt(float(hd));
  for (int pos : {7, 2500}) {
    Dev<int> dpos(std::vector<int>{pos});
    std::vector<float> plain(n_head * hd), scores(pos + 1);
    for (int h = 0; h < n_head; ++h) {
      const int g = h / (n_head / n_kv);
      strata::attend_one_head(q.data() + h * hd, strata::f32_kv_head(k.data() + g * hd, kv_width),
                              strata::f32_kv_head(v.data() + g * hd, kv_width), pos + 1, hd, scale, scores.data(),
                              plain.data() + h * hd);
    }
    for (auto kind : {sc::AttnOutGate::SoftplusPerHead, sc::AttnOutGate::SoftplusPerElement}) {
      std::vector<float> ref = plain;
      for (int h = 0; h < n_head; ++h)
        for (int d = 0; d < hd; ++d)
          ref[h * hd + d] *= strata::softplusf(kind == sc::AttnOutGate::SoftplusPerHead ? gate[h] : gate[h * hd + d]);
      sc::AttnOutGate og;
      og.kind = kind;
      og.g = dg.p;
      sc::attention_decode_split(dq.p, hd, dk.p, dv.p, kv_width, n_head, n_kv, hd, scale, og, dpos.p, max_ctx, scratch.p,
                                 counters.p, dout.p, nullptr);
      EXPECT_LE(rel_err(dout.get(), ref), 1e-5) << "kind " << kind << " pos " << pos;
    }
  }
  EXPECT_EQ(counters.get(), std::vector<unsigned int>(n_head, 0u));
}

// f16 caches (keys, values or both): the split decode attention reads the same half values the CPU's
// attend_one_head decodes, so it matches that reference as closely as the f32 kernel does.
TEST(CudaKernels, AttentionDecodeSplitReadsF16Caches) {
  REQUIRE_GPU();
  std::mt19937 rng(40);
  const int n_head = 4, n_kv = 2, hd = 128, max_ctx = 600, kv_width = n_kv * hd;
  for (const strata::KvCacheTypes kv : {strata::KvCacheTypes{strata::KvType::F16, strata::KvType::F16},
                                        strata::KvCacheTypes{strata::KvType::F16, strata::KvType::F32},
                                        strata::KvCacheTypes{strata::KvType::F32, strata::KvType::F16}}) {
    for (int pos : {0, 40, 599}) {
      const std::vector<float> q = randn(n_head * hd, rng), k = randn(static_cast<size_t>(max_ctx) * kv_width, rng, 0.2f),
                               v = randn(static_cast<size_t>(max_ctx) * kv_width, rng);
      // The caches as stored: rows converted by the CPU's own row conversion.
      auto store = [&](const std::vector<float>& x, strata::KvType t) {
        std::vector<uint8_t> b(strata::kv_row_bytes(t, static_cast<int64_t>(x.size())));
        strata::quantize_row(strata::kv_ggml_type(t), x.data(), b.data(), static_cast<int64_t>(x.size()));
        return b;
      };
      const std::vector<uint8_t> kb = store(k, kv.k), vb = store(v, kv.v);
      Dev<float> dq(q), dout(n_head * hd), scratch(sc::attention_scratch_floats(n_head, hd, max_ctx));
      Dev<uint8_t> dk(kb), dv(vb);
      Dev<unsigned int> counters(std::vector<unsigned int>(n_head, 0u));
      Dev<int> dpos(std::vector<int>{pos});
      const float scale = 1.0f / std::sqrt(float(hd));
      std::vector<float> ref(n_head * hd), scores(pos + 1);
      const int64_t k_row = static_cast<int64_t>(strata::kv_row_bytes(kv.k, kv_width));
      const int64_t v_row = static_cast<int64_t>(strata::kv_row_bytes(kv.v, kv_width));
      for (int h = 0; h < n_head; ++h) {
        const int g = h / (n_head / n_kv);
        const strata::KvHead kh{kb.data() + strata::kv_row_bytes(kv.k, g * hd), k_row, strata::kv_ggml_type(kv.k)};
        const strata::KvHead vh{vb.data() + strata::kv_row_bytes(kv.v, g * hd), v_row, strata::kv_ggml_type(kv.v)};
        strata::attend_one_head(q.data() + h * hd, kh, vh, pos + 1, hd, scale, scores.data(), ref.data() + h * hd);
      }
      sc::attention_decode_split(dq.p, hd, dk.p, dv.p, kv_width, n_head, n_kv, hd, scale, sc::AttnOutGate{}, dpos.p,
                                 max_ctx, scratch.p, counters.p, dout.p, nullptr, kv);
      EXPECT_LE(rel_err(dout.get(), ref), 1e-5) << strata::kv_type_name(kv.k) << "/" << strata::kv_type_name(kv.v)
                                                 << " pos " << pos;
    }
  }
}

// The RMSNorm epilogue of a batched launch sees every block's Accumulate output.
TEST(CudaKernels, GemvNormEpilogueNormalisesTheAccumulatedRow) {
  REQUIRE_GPU();
  std::mt19937 rng(39);
  const int64_t rows = 2048, cols = 4096;
  const std::vector<uint8_t> w = make_weights(GgmlType::Q4_K, rows, cols, rng);
  const std::vector<float> o = randn(cols, rng), x0 = randn(rows, rng, 4.0f), nw = randn(rows, rng);
  Dev<uint8_t> dw(w);
  Dev<float> dop(o), dx(x0), dnw(nw), dxn(rows);
  Dev<unsigned int> counter(std::vector<unsigned int>{0u});
  const sc::DevMatrix m = dev_matrix(GgmlType::Q4_K, dw, rows, cols);
  sc::GemvJob j;
  j.w = &m, j.x = dop.p, j.y = dx.p, j.mode = sc::GemvMode::Accumulate;
  sc::GemvNorm nm;
  nm.x = dx.p, nm.w = dnw.p, nm.out = dxn.p, nm.eps = 1e-6f, nm.n = static_cast<int>(rows), nm.counter = counter.p;
  sc::gemv_batch(&j, 1, nullptr, &nm);
  std::vector<float> want = ref_matvec(GgmlType::Q4_K, w.data(), rows, cols, o.data());
  for (int64_t r = 0; r < rows; ++r) want[r] += x0[r];
  std::vector<float> wn(rows);
  strata::rmsnorm(want.data(), nw.data(), 1e-6f, rows, wn.data());
  EXPECT_LE(rel_err(dx.get(), want), 1e-5);
  EXPECT_LE(rel_err(dxn.get(), wn), 1e-5);
  EXPECT_EQ(counter.get()[0], 0u);
}

// The router epilogue: softmax + top-k of the logits the same launch computed, with counts, next to a
// second job (the shared expert's gate) in the same launch.
TEST(CudaKernels, GemvRouteEpilogueMatchesCpuTopK) {
  REQUIRE_GPU();
  std::mt19937 rng(40);
  const int n_expert = 128, k = 8, cols = 1024;
  const std::vector<uint8_t> w = make_weights(GgmlType::F32, n_expert, cols, rng);
  const std::vector<uint8_t> w2 = make_weights(GgmlType::Q4_K, 300, cols, rng);
  Dev<uint8_t> dw(w), dw2(w2);
  Dev<float> dlog(n_expert), dy2(300), dwts(k);
  Dev<int> dids(k);
  Dev<unsigned int> counter(std::vector<unsigned int>{0u});
  Dev<unsigned long long> counts(std::vector<unsigned long long>(n_expert, 0ull));
  const sc::DevMatrix m = dev_matrix(GgmlType::F32, dw, n_expert, cols), m2 = dev_matrix(GgmlType::Q4_K, dw2, 300, cols);
  std::vector<unsigned long long> want_counts(n_expert, 0ull);
  for (bool norm : {true, false}) {
    const std::vector<float> x = randn(cols, rng);
    Dev<float> dx(x);
    sc::GemvJob jobs[2];
    jobs[0].w = &m, jobs[0].x = dx.p, jobs[0].y = dlog.p;
    jobs[1].w = &m2, jobs[1].x = dx.p, jobs[1].y = dy2.p;
    sc::GemvRoute rt;
    rt.logits = dlog.p, rt.n_expert = n_expert, rt.k = k, rt.norm_topk = norm, rt.ids = dids.p, rt.weights = dwts.p;
    rt.counts = counts.p, rt.counter = counter.p;
    sc::gemv_batch(jobs, 2, nullptr, nullptr, &rt);
    std::vector<float> p = dlog.get();
    EXPECT_LE(rel_err(p, ref_matvec(GgmlType::F32, w.data(), n_expert, cols, x.data())), 1e-5);
    const CpuRoute want = cpu_route(p, k, norm);
    const std::vector<int>& idx = want.ids;
    EXPECT_EQ(dids.get(), idx) << norm;
    EXPECT_LE(rel_err(dwts.get(), want.weights), 1e-6) << norm;
    for (int id : idx) ++want_counts[id];
    EXPECT_EQ(counter.get()[0], 0u);
  }
  EXPECT_EQ(counts.get(), want_counts);
}

// The down projections of k routed experts + the shared expert with the combine + next-norm epilogue.
TEST(CudaKernels, GemvCombineEpilogueMatchesCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(41);
  const int n_expert = 10, k = 4, ff = 256, d = 512;
  const std::vector<int> ids = {7, 2, 9, 0};
  const std::vector<uint8_t> down = make_weights(GgmlType::Q4_K, int64_t{d} * n_expert, ff, rng);
  const std::vector<uint8_t> sdown = make_weights(GgmlType::Q6_K, d, ff, rng);
  const std::vector<float> h = randn(static_cast<size_t>(k) * ff, rng), hs = randn(ff, rng), x = randn(d, rng, 2.0f),
                           nw = randn(d, rng), wts = {0.4f, 0.3f, 0.2f, 0.1f}, gate = {0.3f};
  Dev<uint8_t> dd(down), dsd(sdown);
  Dev<float> dh(h), dhs(hs), dx(x), dnw(nw), dw(wts), dg(gate), dye(static_cast<size_t>(k) * d), dys(d), dxn(d);
  Dev<int> dids(ids);
  Dev<unsigned int> counter(std::vector<unsigned int>{0u});
  const sc::DevMatrix md = dev_matrix(GgmlType::Q4_K, dd, d, ff, n_expert), ms = dev_matrix(GgmlType::Q6_K, dsd, d, ff);
  std::vector<sc::GemvJob> jobs(k + 1);
  for (int j = 0; j < k; ++j) {
    jobs[j].w = &md, jobs[j].x = dh.p + j * ff, jobs[j].y = dye.p + j * d, jobs[j].ids = dids.p, jobs[j].slot = j;
  }
  jobs[k].w = &ms, jobs[k].x = dhs.p, jobs[k].y = dys.p;
  sc::GemvCombine cb;
  cb.x = dx.p, cb.ye = dye.p, cb.ids = dids.p, cb.weights = dw.p, cb.k = k, cb.d = d, cb.ys = dys.p;
  cb.shared_gate = dg.p, cb.norm_w = dnw.p, cb.eps = 1e-6f, cb.xn = dxn.p, cb.counter = counter.p;
  sc::gemv_batch(jobs.data(), k + 1, nullptr, nullptr, nullptr, &cb);
  const size_t stride = strata::row_bytes(GgmlType::Q4_K, ff) * d;
  std::vector<std::vector<float>> ye(k);
  for (int j = 0; j < k; ++j) ye[j] = ref_matvec(GgmlType::Q4_K, down.data() + stride * ids[j], d, ff, h.data() + j * ff);
  const std::vector<float> ys = ref_matvec(GgmlType::Q6_K, sdown.data(), d, ff, hs.data());
  const int order[] = {3, 1, 0, 2};  // slots by ascending expert id
  std::vector<float> want(x), wn(d);
  for (int i = 0; i < d; ++i) {
    double acc = 0;
    for (int s : order) acc += double(wts[s]) * ye[s][i];
    acc += double(strata::sigmoidf(gate[0])) * ys[i];
    want[i] += static_cast<float>(acc);
  }
  strata::rmsnorm(want.data(), nw.data(), 1e-6f, d, wn.data());
  EXPECT_LE(rel_err(dx.get(), want), 1e-5);
  EXPECT_LE(rel_err(dxn.get(), wn), 1e-5);
  EXPECT_EQ(counter.get()[0], 0u);
}

// Jobs whose input is rmsnorm(x) * norm_w, normalised by every block as it stages x: several types and
// two norm weights over one x (the staged vector must change with the norm), next to a plain job.
TEST(CudaKernels, GemvNormedInputEqualsRmsNormThenMatvec) {
  REQUIRE_GPU();
  std::mt19937 rng(42);
  const int64_t cols = 2048;
  const std::vector<float> x = randn(cols, rng, 3.0f), n1 = randn(cols, rng), n2 = randn(cols, rng);
  std::vector<float> x1(cols), x2(cols);
  strata::rmsnorm(x.data(), n1.data(), 1e-6f, cols, x1.data());
  strata::rmsnorm(x.data(), n2.data(), 1e-6f, cols, x2.data());
  Dev<float> dx(x), dn1(n1), dn2(n2);
  const std::vector<GgmlType> types = {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F32, GgmlType::Q4_K};
  const std::vector<int64_t> rows = {1000, 77, 256, 40};
  const std::vector<const float*> norms = {dn1.p, dn1.p, dn2.p, nullptr};
  std::vector<std::vector<uint8_t>> w;
  std::vector<std::unique_ptr<Dev<uint8_t>>> dw;
  std::vector<std::unique_ptr<Dev<float>>> dy;
  std::vector<sc::DevMatrix> m(types.size());
  std::vector<sc::GemvJob> jobs(types.size());
  for (size_t i = 0; i < types.size(); ++i) {
    w.push_back(make_weights(types[i], rows[i], cols, rng));
    dw.push_back(std::make_unique<Dev<uint8_t>>(w.back()));
    dy.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(rows[i])));
    m[i] = dev_matrix(types[i], *dw.back(), rows[i], cols);
    jobs[i].w = &m[i], jobs[i].x = dx.p, jobs[i].y = dy.back()->p, jobs[i].norm_w = norms[i], jobs[i].norm_eps = 1e-6f;
  }
  sc::gemv_batch(jobs.data(), static_cast<int>(jobs.size()), nullptr);
  const std::vector<const float*> inputs = {x1.data(), x1.data(), x2.data(), x.data()};
  for (size_t i = 0; i < types.size(); ++i) {
    const double e = rel_err(dy[i]->get(), ref_matvec(types[i], w[i].data(), rows[i], cols, inputs[i]));
    EXPECT_LE(e, 1e-5) << "job " << i << " " << strata::type_traits(types[i]).name;
  }
}

// route_in: the expert launch computes softmax + top-k itself (every block) from logits an earlier
// launch wrote, runs the picked experts' gate/up pairs, and its first block writes ids, weights and
// counts once per launch; a plain job shares the launch.
TEST(CudaKernels, GemvRouteInPicksExpertsLikeCpuTopK) {
  REQUIRE_GPU();
  std::mt19937 rng(43);
  // 64 and 256 experts take the register form of the routing (up to 256), 300 the shared-memory form.
  for (const int n_expert : {64, 256, 300}) {
    const int k = 8, ff = 128, d = 512;
    const std::vector<uint8_t> gate = make_weights(GgmlType::Q4_K, int64_t{ff} * n_expert, d, rng);
    const std::vector<uint8_t> up = make_weights(GgmlType::Q4_K, int64_t{ff} * n_expert, d, rng);
    const std::vector<uint8_t> plain = make_weights(GgmlType::Q6_K, 300, d, rng);
    Dev<uint8_t> dg(gate), du(up), dp(plain);
    const sc::DevMatrix mg = dev_matrix(GgmlType::Q4_K, dg, ff, d, n_expert), mu = dev_matrix(GgmlType::Q4_K, du, ff, d, n_expert),
                        mp = dev_matrix(GgmlType::Q6_K, dp, 300, d);
    Dev<unsigned long long> counts(std::vector<unsigned long long>(n_expert, 0ull));
    std::vector<unsigned long long> want_counts(n_expert, 0ull);
    for (bool norm : {true, false}) {
      std::vector<float> logits = randn(n_expert, rng, 2.0f);
      logits[5] = logits[9] = *std::max_element(logits.begin(), logits.end()) + 1.0f;  // a tie at the top: id 5 first
      const std::vector<float> x = randn(d, rng);
      Dev<float> dlog(logits), dx(x), dh(static_cast<size_t>(k) * ff), dyp(300), dwts(k);
      Dev<int> dids(k);
      std::vector<sc::GemvJob> jobs(k + 1);
      for (int j = 0; j < k; ++j) {
        jobs[j].w = &mg, jobs[j].w2 = &mu, jobs[j].x = dx.p, jobs[j].y = dh.p + j * ff;
        jobs[j].mode = sc::GemvMode::SwigluPair, jobs[j].ids = dids.p, jobs[j].slot = j;
      }
      jobs[k].w = &mp, jobs[k].x = dx.p, jobs[k].y = dyp.p;
      sc::GemvRoute rt;
      rt.logits = dlog.p, rt.n_expert = n_expert, rt.k = k, rt.norm_topk = norm, rt.ids = dids.p, rt.weights = dwts.p;
      rt.counts = counts.p;
      sc::gemv_batch(jobs.data(), k + 1, nullptr, nullptr, nullptr, nullptr, &rt);
      const CpuRoute want = cpu_route(logits, k, norm);
      const std::vector<int>& idx = want.ids;
      EXPECT_EQ(dids.get(), idx) << norm << " " << n_expert;
      EXPECT_LE(rel_err(dwts.get(), want.weights), 1e-6) << norm << " " << n_expert;
      for (int id : idx) ++want_counts[id];
      const std::vector<float> h = dh.get();
      const size_t stride = strata::row_bytes(GgmlType::Q4_K, d) * ff;
      for (int j = 0; j < k; ++j) {
        const std::vector<float> gv = ref_matvec(GgmlType::Q4_K, gate.data() + stride * idx[j], ff, d, x.data());
        const std::vector<float> uv = ref_matvec(GgmlType::Q4_K, up.data() + stride * idx[j], ff, d, x.data());
        std::vector<float> href(ff);
        for (int r = 0; r < ff; ++r) href[r] = strata::siluf(gv[r]) * uv[r];
        EXPECT_LE(rel_err(std::vector<float>(h.begin() + j * ff, h.begin() + (j + 1) * ff), href), 1e-5) << "slot " << j;
      }
      EXPECT_LE(rel_err(dyp.get(), ref_matvec(GgmlType::Q6_K, plain.data(), 300, d, x.data())), 1e-5);
    }
    EXPECT_EQ(counts.get(), want_counts);
  }
}

// ---- the int8 activation path (GemvMath::Int8, the default) ---------------------------------------

// Switches the matvec to the int8 path for one test.
struct Int8Gemv {
  Int8Gemv() { sc::set_gemv_math(sc::GemvMath::Int8); }
  ~Int8Gemv() { sc::set_gemv_math(sc::GemvMath::Float); }
};

// x as the int8 path sees it: quantised by the CPU engine's own function (cpu_kernels.h), then d32 * q.
std::vector<float> quantised_input(const std::vector<float>& x) {
  const size_t n = x.size();
  std::vector<int8_t> q(n);
  std::vector<float> d32(n / 32), s16(n / 16), xq(n);
  strata::quantize_activations_i8_scalar(x.data(), static_cast<int64_t>(n), q.data(), d32.data(), s16.data());
  for (size_t i = 0; i < n; ++i) xq[i] = d32[i / 32] * static_cast<float>(q[i]);
  return xq;
}

// Every K-quant type and the real models' widths: the int8 path equals the float64 product of the decoded
// weights with the quantised input (the dots are exact integers; only the per-block float scaling rounds).
TEST(CudaKernels, GemvInt8EqualsFloat64OnTheQuantisedInput) {
  REQUIRE_GPU();
  Int8Gemv int8;
  std::mt19937 rng(41);
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    for (int64_t cols : {int64_t{256}, int64_t{512}, int64_t{2048}, int64_t{4096}}) {
      const int64_t rows = 301;
      const std::vector<uint8_t> w = make_weights(type, rows, cols, rng);
      const std::vector<float> x = randn(static_cast<size_t>(cols), rng), y0 = randn(rows, rng);
      Dev<uint8_t> dw(w);
      Dev<float> dx(x), dy(static_cast<size_t>(rows)), dacc(y0);
      const sc::DevMatrix m = dev_matrix(type, dw, rows, cols);
      sc::GemvJob j[2];
      j[0].w = &m, j[0].x = dx.p, j[0].y = dy.p;
      j[1].w = &m, j[1].x = dx.p, j[1].y = dacc.p, j[1].mode = sc::GemvMode::Accumulate;
      sc::gemv_batch(j, 2, nullptr);
      const std::vector<float> ref = ref_matvec(type, w.data(), rows, cols, quantised_input(x).data());
      std::vector<float> ref_acc = ref;
      for (int64_t r = 0; r < rows; ++r) ref_acc[r] += y0[r];
      EXPECT_LE(rel_err(dy.get(), ref), 1e-5) << strata::type_traits(type).name << " cols " << cols;
      EXPECT_LE(rel_err(dacc.get(), ref_acc), 1e-5) << strata::type_traits(type).name << " cols " << cols;
    }
  }
}

// Routed gate+up+SwiGLU pairs on the int8 path equal the float64 pair on the quantised input; a float
// job in the same launch (F32 router rows) keeps the float arithmetic.
TEST(CudaKernels, GemvInt8RoutedPairsBesideAFloatJob) {
  REQUIRE_GPU();
  Int8Gemv int8;
  std::mt19937 rng(42);
  const int n_exp = 5, ff = 512, d = 2048;
  const std::vector<int> ids = {3, 0, 4};
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    const std::vector<uint8_t> gate = make_weights(type, int64_t{ff} * n_exp, d, rng);
    const std::vector<uint8_t> up = make_weights(type, int64_t{ff} * n_exp, d, rng);
    const std::vector<uint8_t> router = make_weights(GgmlType::F32, 64, d, rng);
    const std::vector<float> x = randn(d, rng);
    Dev<uint8_t> dg(gate), du(up), dr(router);
    Dev<int> did(ids);
    Dev<float> dx(x), dh(ids.size() * ff), dlog(64);
    const sc::DevMatrix mg = dev_matrix(type, dg, ff, d, n_exp), mu = dev_matrix(type, du, ff, d, n_exp),
                        mr = dev_matrix(GgmlType::F32, dr, 64, d);
    std::vector<sc::GemvJob> jobs(ids.size() + 1);
    for (size_t j = 0; j < ids.size(); ++j) {
      jobs[j].w = &mg, jobs[j].w2 = &mu, jobs[j].x = dx.p, jobs[j].y = dh.p + j * ff;
      jobs[j].mode = sc::GemvMode::SwigluPair, jobs[j].ids = did.p, jobs[j].slot = static_cast<int>(j);
    }
    jobs.back().w = &mr, jobs.back().x = dx.p, jobs.back().y = dlog.p;
    sc::gemv_batch(jobs.data(), static_cast<int>(jobs.size()), nullptr);
    const std::vector<float> xq = quantised_input(x), h = dh.get();
    const size_t stride = strata::row_bytes(type, d) * ff;
    for (size_t j = 0; j < ids.size(); ++j) {
      const std::vector<float> gv = ref_matvec(type, gate.data() + stride * ids[j], ff, d, xq.data());
      const std::vector<float> uv = ref_matvec(type, up.data() + stride * ids[j], ff, d, xq.data());
      std::vector<float> href(ff);
      for (int r = 0; r < ff; ++r) href[r] = strata::siluf(gv[r]) * uv[r];
      EXPECT_LE(rel_err(std::vector<float>(h.begin() + j * ff, h.begin() + (j + 1) * ff), href), 1e-5)
          << strata::type_traits(type).name << " slot " << j;
    }
    EXPECT_LE(rel_err(dlog.get(), ref_matvec(GgmlType::F32, router.data(), 64, d, x.data())), 1e-5);
  }
}

// With the RMSNorm done in-block, the int8 result stays within the activation-rounding bound of the
// exact float64 product: |error_r| <= sum_i |W_ri| * d32(i) / 2 (cpu_kernels.h's bound) + float slack.
// The expert launch's production shape: int8 arithmetic, the input normalised in the block (2048 wide)
// and route_in, where warp 0 routes while the other seven warps stage and quantise x: every routed row
// (the CPU's picks, 256 experts) stays within the activation-rounding bound of the float64 product on
// rmsnorm(x), and the ids / weights are the CPU's.
TEST(CudaKernels, GemvInt8RouteInWithNormedInputAtModelWidth) {
  REQUIRE_GPU();
  Int8Gemv int8;
  std::mt19937 rng(46);
  const int n_expert = 256, k = 8, ff = 64, cols = 2048;
  const GgmlType type = GgmlType::Q4_K;
  const std::vector<uint8_t> w = make_weights(type, int64_t{ff} * n_expert, cols, rng);
  const std::vector<float> x = randn(cols, rng, 3.0f), nw = randn(cols, rng), logits = randn(n_expert, rng, 2.0f);
  Dev<uint8_t> dw(w);
  Dev<float> dx(x), dn(nw), dlog(logits), dy(static_cast<size_t>(k) * ff), dwts(k);
  Dev<int> dids(k);
  const sc::DevMatrix m = dev_matrix(type, dw, ff, cols, n_expert);
  std::vector<sc::GemvJob> jobs(k);
  for (int j = 0; j < k; ++j) {
    jobs[j].w = &m, jobs[j].x = dx.p, jobs[j].y = dy.p + j * ff, jobs[j].ids = dids.p, jobs[j].slot = j;
    jobs[j].norm_w = dn.p, jobs[j].norm_eps = 1e-6f;
  }
  sc::GemvRoute rt;
  rt.logits = dlog.p, rt.n_expert = n_expert, rt.k = k, rt.norm_topk = true, rt.ids = dids.p, rt.weights = dwts.p;
  sc::gemv_batch(jobs.data(), k, nullptr, nullptr, nullptr, nullptr, &rt);
  const CpuRoute want = cpu_route(logits, k, true);
  EXPECT_EQ(dids.get(), want.ids);
  EXPECT_LE(rel_err(dwts.get(), want.weights), 1e-6);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double inv = 1.0 / std::sqrt(ss / cols + 1e-6);
  std::vector<float> xn(cols), d32(cols / 32, 0.0f), row(cols);
  for (int i = 0; i < cols; ++i) xn[i] = static_cast<float>(x[i] * inv * nw[i]);
  for (int i = 0; i < cols; ++i) d32[i / 32] = std::max(d32[i / 32], std::fabs(xn[i]) / 127.0f);
  const std::vector<float> got = dy.get();
  const size_t stride = strata::row_bytes(type, cols) * ff;
  for (int j = 0; j < k; ++j) {
    const uint8_t* ew = w.data() + stride * want.ids[j];
    const std::vector<float> ref = ref_matvec(type, ew, ff, cols, xn.data());
    double ymax = 0;
    for (float v : ref) ymax = std::max(ymax, std::fabs(double(v)));
    for (int r = 0; r < ff; ++r) {
      strata::dequantize_row(type, ew + r * strata::row_bytes(type, cols), row.data(), cols);
      double bound = 1e-5 * ymax;
      for (int i = 0; i < cols; ++i) bound += std::fabs(double(row[i])) * d32[i / 32] * 0.5 * 1.001;
      ASSERT_LE(std::fabs(double(got[j * ff + r]) - ref[r]), bound) << "slot " << j << " row " << r;
    }
  }
}

// The decode matvec keeps everything in registers: no stack frame, no spills (a frame around a called
// routing function once slowed the decode; docs/PERF.md).
TEST(CudaKernels, GemvKernelUsesNoLocalMemory) {
  REQUIRE_GPU();
  EXPECT_EQ(sc::gemv_local_bytes(), 0u);
}

// gemv_down_sum (the down projection fused with the combine): the float path equals the float64 sum of
// the picked experts' products (Q4_K stack, Q6_K shared expert: two types in one launch, 300 rows: a
// partial last block); the int8 path equals the down jobs + combine epilogue it replaces to float
// rounding (the same quantised inputs); without the shared expert too; shapes it cannot take are refused.
TEST(CudaKernels, GemvDownSumEqualsDownJobsPlusCombine) {
  REQUIRE_GPU();
  std::mt19937 rng(48);
  const int n_expert = 16, k = 8, ff = 512, d = 300;
  const std::vector<int> ids = {11, 2, 9, 0, 15, 4, 7, 13};
  const std::vector<uint8_t> down = make_weights(GgmlType::Q4_K, int64_t{d} * n_expert, ff, rng);
  const std::vector<uint8_t> sdown = make_weights(GgmlType::Q6_K, d, ff, rng);
  const std::vector<float> h = randn(static_cast<size_t>(k) * ff, rng), hs = randn(ff, rng), x = randn(d, rng, 2.0f),
                           wts = {0.2f, 0.15f, 0.14f, 0.13f, 0.12f, 0.1f, 0.09f, 0.07f}, gate = {-0.4f};
  Dev<uint8_t> dd(down), dsd(sdown);
  Dev<float> dh(h), dhs(hs), dw(wts), dg(gate);
  Dev<int> dids(ids);
  const sc::DevMatrix md = dev_matrix(GgmlType::Q4_K, dd, d, ff, n_expert), ms = dev_matrix(GgmlType::Q6_K, dsd, d, ff);
  const size_t stride = strata::row_bytes(GgmlType::Q4_K, ff) * d;
  for (bool shared : {true, false}) {
    sc::GemvDownSum a;
    a.down = &md, a.ids = dids.p, a.weights = dw.p, a.k = k, a.g = dh.p;
    if (shared) a.shared = &ms, a.gs = dhs.p, a.shared_gate = dg.p;
    // Float path against float64.
    Dev<float> dx(x);
    a.x = dx.p;
    ASSERT_TRUE(sc::gemv_down_sum_fits(a));
    sc::gemv_down_sum(a, nullptr);
    std::vector<float> want(x);
    for (int j = 0; j < k; ++j) {
      const std::vector<float> ye = ref_matvec(GgmlType::Q4_K, down.data() + stride * ids[j], d, ff, h.data() + j * ff);
      for (int i = 0; i < d; ++i) want[i] += wts[j] * ye[i];
    }
    if (shared) {
      const std::vector<float> ys = ref_matvec(GgmlType::Q6_K, sdown.data(), d, ff, hs.data());
      for (int i = 0; i < d; ++i) want[i] += strata::sigmoidf(gate[0]) * ys[i];
    }
    EXPECT_LE(rel_err(dx.get(), want), 1e-5) << "shared " << shared;
    // Int8 path against the launch it replaces.
    Int8Gemv int8;
    Dev<float> dx8(x), dxc(x), dye(static_cast<size_t>(k) * d), dys(d);
    a.x = dx8.p;
    sc::gemv_down_sum(a, nullptr);
    std::vector<sc::GemvJob> jobs(k + 1);
    for (int j = 0; j < k; ++j)
      jobs[j].w = &md, jobs[j].x = dh.p + j * ff, jobs[j].y = dye.p + j * d, jobs[j].ids = dids.p, jobs[j].slot = j;
    jobs[k].w = &ms, jobs[k].x = dhs.p, jobs[k].y = dys.p;
    Dev<unsigned int> counter(std::vector<unsigned int>{0u});
    sc::GemvCombine cb;
    cb.x = dxc.p, cb.ye = dye.p, cb.ids = dids.p, cb.weights = dw.p, cb.k = k, cb.d = d, cb.counter = counter.p;
    if (shared) cb.ys = dys.p, cb.shared_gate = dg.p;
    sc::gemv_batch(jobs.data(), shared ? k + 1 : k, nullptr, nullptr, nullptr, &cb);
    EXPECT_LE(rel_err(dx8.get(), dxc.get()), 1e-5) << "shared " << shared;
    EXPECT_GT(rel_err(dx8.get(), x), 1e-3);  // the experts did add something
  }
  // A width the padded staging cannot put side by side (F32 rows of 96) is refused, loudly when forced.
  const std::vector<uint8_t> f32 = make_weights(GgmlType::F32, int64_t{d} * n_expert, 96, rng);
  Dev<uint8_t> df(f32);
  const sc::DevMatrix mf = dev_matrix(GgmlType::F32, df, d, 96, n_expert);
  Dev<float> dx(x);
  sc::GemvDownSum bad;
  bad.down = &mf, bad.ids = dids.p, bad.weights = dw.p, bad.k = k, bad.g = dh.p, bad.x = dx.p;
  EXPECT_FALSE(sc::gemv_down_sum_fits(bad));
  EXPECT_THROW(sc::gemv_down_sum(bad, nullptr), strata::Error);
}

TEST(CudaKernels, GemvInt8NormedInputWithinTheRoundingBound) {
  REQUIRE_GPU();
  Int8Gemv int8;
  std::mt19937 rng(43);
  const int64_t rows = 200, cols = 2048;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const std::vector<uint8_t> w = make_weights(type, rows, cols, rng);
    const std::vector<float> x = randn(cols, rng, 3.0f), nw = randn(cols, rng);
    Dev<uint8_t> dw(w);
    Dev<float> dx(x), dn(nw), dy(static_cast<size_t>(rows));
    const sc::DevMatrix m = dev_matrix(type, dw, rows, cols);
    sc::GemvJob j;
    j.w = &m, j.x = dx.p, j.y = dy.p, j.norm_w = dn.p, j.norm_eps = 1e-6f;
    sc::gemv_batch(&j, 1, nullptr);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / cols + 1e-6);
    std::vector<float> xn(cols);
    for (int64_t i = 0; i < cols; ++i) xn[i] = static_cast<float>(x[i] * inv * nw[i]);
    const std::vector<float> ref = ref_matvec(type, w.data(), rows, cols, xn.data());
    std::vector<float> d32(cols / 32, 0.0f);
    for (int64_t i = 0; i < cols; ++i) d32[i / 32] = std::max(d32[i / 32], std::fabs(xn[i]) / 127.0f);
    const std::vector<float> got = dy.get();
    std::vector<float> row(cols);
    double ymax = 0;
    for (float v : ref) ymax = std::max(ymax, std::fabs(double(v)));
    for (int64_t r = 0; r < rows; ++r) {
      strata::dequantize_row(type, w.data() + r * strata::row_bytes(type, cols), row.data(), cols);
      double bound = 1e-5 * ymax;
      for (int64_t i = 0; i < cols; ++i) bound += std::fabs(double(row[i])) * d32[i / 32] * 0.5 * 1.001;
      ASSERT_LE(std::fabs(double(got[r]) - ref[r]), bound) << strata::type_traits(type).name << " row " << r;
    }
    // And it is not the float path: the rounding shows (the error is above float noise somewhere).
    EXPECT_GT(rel_err(got, ref), 1e-5) << strata::type_traits(type).name;
  }
}

// Whether two float vectors are equal bit for bit.
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The token grid (gemv_batch / gemv_down_sum with n_tokens > 1) is T single-token launches, bit for bit,
// in both arithmetics: a launch of normed dense jobs (one of many tiles) beside the router, a routed
// gate/up launch that routes itself from each token's logits (route_in), an Accumulate launch, and the
// fused MoE down + combine; the routing counts are every token's picks.
TEST(CudaKernels, GemvTokenGridEqualsSingleTokenLaunchesBitwise) {
  REQUIRE_GPU();
  std::mt19937 rng(50);
  const int T = 5, d = 2048, n_expert = 64, k = 8, ff = 256, big = 3000;
  const std::vector<uint8_t> wbig = make_weights(GgmlType::Q4_K, big, d, rng);
  const std::vector<uint8_t> wrouter = make_weights(GgmlType::F32, n_expert, d, rng);
  const std::vector<uint8_t> wgate = make_weights(GgmlType::Q4_K, int64_t{ff} * n_expert, d, rng);
  const std::vector<uint8_t> wup = make_weights(GgmlType::Q5_K, int64_t{ff} * n_expert, d, rng);
  const std::vector<uint8_t> wacc = make_weights(GgmlType::F16, d, d, rng);
  const std::vector<uint8_t> wdown = make_weights(GgmlType::Q4_K, int64_t{d} * n_expert, ff, rng);
  const std::vector<uint8_t> wsdown = make_weights(GgmlType::Q6_K, d, ff, rng);
  // The shared expert's gate/up pair rides in the routed launch, as in the decode step: a token grid's block
  // may run it after routed tiles of the same input.
  const std::vector<uint8_t> wsgate = make_weights(GgmlType::Q4_K, ff, d, rng);
  const std::vector<uint8_t> wsup = make_weights(GgmlType::Q4_K, ff, d, rng);
  Dev<uint8_t> dbig(wbig), drouter(wrouter), dgate(wgate), dup(wup), dacc(wacc), ddown(wdown), dsdown(wsdown);
  Dev<uint8_t> dsgate(wsgate), dsup(wsup);
  const sc::DevMatrix mbig = dev_matrix(GgmlType::Q4_K, dbig, big, d);
  const sc::DevMatrix mrouter = dev_matrix(GgmlType::F32, drouter, n_expert, d);
  const sc::DevMatrix mgate = dev_matrix(GgmlType::Q4_K, dgate, ff, d, n_expert);
  const sc::DevMatrix mup = dev_matrix(GgmlType::Q5_K, dup, ff, d, n_expert);
  const sc::DevMatrix macc = dev_matrix(GgmlType::F16, dacc, d, d);
  const sc::DevMatrix mdown = dev_matrix(GgmlType::Q4_K, ddown, d, ff, n_expert);
  const sc::DevMatrix msdown = dev_matrix(GgmlType::Q6_K, dsdown, d, ff);
  const sc::DevMatrix msgate = dev_matrix(GgmlType::Q4_K, dsgate, ff, d);
  const sc::DevMatrix msup = dev_matrix(GgmlType::Q4_K, dsup, ff, d);
  const std::vector<float> x = randn(static_cast<size_t>(T) * d, rng, 3.0f), nw = randn(d, rng);
  const std::vector<float> res = randn(static_cast<size_t>(T) * d, rng), hs = randn(static_cast<size_t>(T) * ff, rng);
  const std::vector<float> sg = randn(T, rng);
  Dev<float> dx(x), dn(nw), dhs(hs), dsg(sg);
  for (const bool i8 : {false, true}) {
    std::unique_ptr<Int8Gemv> int8;
    if (i8) int8 = std::make_unique<Int8Gemv>();
    // Outputs of the token grid (grid) and of T single launches (one).
    struct Out {
      Dev<float> ybig, logits, g, wts, res, xs, gsh;
      Dev<int> ids;
      Dev<unsigned long long> counts;
      Out(int T_, int big_, int ne, int k_, int ff_, const std::vector<float>& r)
          : ybig(static_cast<size_t>(T_) * big_), logits(static_cast<size_t>(T_) * ne),
            g(static_cast<size_t>(T_) * k_ * ff_), wts(static_cast<size_t>(T_) * k_), res(r), xs(r),
            gsh(static_cast<size_t>(T_) * ff_),
            ids(static_cast<size_t>(T_) * k_), counts(std::vector<unsigned long long>(static_cast<size_t>(ne), 0)) {}
    };
    Out grid(T, big, n_expert, k, ff, res), one(T, big, n_expert, k, ff, res);
    // The launches for token t (t < 0: the token grid over all T).
    auto launch = [&](Out& o, int t) {
      const int n_tok = t < 0 ? T : 1;
      const int64_t at = t < 0 ? 0 : t;
      sc::GemvJob first[2];
      first[0].w = &mbig, first[0].x = dx.p + at * d, first[0].y = o.ybig.p + at * big;
      first[1].w = &mrouter, first[1].x = dx.p + at * d, first[1].y = o.logits.p + at * n_expert;
      for (sc::GemvJob& j : first) j.norm_w = dn.p, j.norm_eps = 1e-6f, j.x_token_stride = d;
      first[0].y_token_stride = big, first[1].y_token_stride = n_expert;
      sc::gemv_batch(first, 2, nullptr, nullptr, nullptr, nullptr, nullptr, n_tok);
      sc::GemvRoute rt;
      rt.logits = o.logits.p + at * n_expert, rt.logits_token_stride = n_expert, rt.n_expert = n_expert, rt.k = k;
      rt.norm_topk = true, rt.ids = o.ids.p + at * k, rt.weights = o.wts.p + at * k, rt.counts = o.counts.p;
      std::vector<sc::GemvJob> up(k);
      for (int j = 0; j < k; ++j) {
        sc::GemvJob& a = up[j];
        a.w = &mgate, a.w2 = &mup, a.mode = sc::GemvMode::SwigluPair, a.ids = rt.ids, a.slot = j;
        a.x = dx.p + at * d, a.norm_w = dn.p, a.norm_eps = 1e-6f, a.y = o.g.p + (at * k + j) * ff;
        a.x_token_stride = d, a.y_token_stride = int64_t{k} * ff, a.ids_token_stride = k;
      }
      sc::GemvJob shared;
      shared.w = &msgate, shared.w2 = &msup, shared.mode = sc::GemvMode::SwigluPair;
      shared.x = dx.p + at * d, shared.norm_w = dn.p, shared.norm_eps = 1e-6f, shared.y = o.gsh.p + at * ff;
      shared.x_token_stride = d, shared.y_token_stride = ff;
      up.push_back(shared);
      sc::gemv_batch(up.data(), k + 1, nullptr, nullptr, nullptr, nullptr, &rt, n_tok);
      sc::GemvJob acc;
      acc.w = &macc, acc.x = dx.p + at * d, acc.y = o.res.p + at * d, acc.mode = sc::GemvMode::Accumulate;
      acc.x_token_stride = d, acc.y_token_stride = d;
      sc::gemv_batch(&acc, 1, nullptr, nullptr, nullptr, nullptr, nullptr, n_tok);
      sc::GemvDownSum ds;
      ds.down = &mdown, ds.ids = rt.ids, ds.weights = rt.weights, ds.k = k, ds.g = o.g.p + at * k * ff;
      ds.shared = &msdown, ds.gs = dhs.p + at * ff, ds.shared_gate = dsg.p + at, ds.x = o.xs.p + at * d;
      ds.n_tokens = n_tok, ds.g_token_stride = int64_t{k} * ff, ds.gs_token_stride = ff, ds.x_token_stride = d;
      sc::gemv_down_sum(ds, nullptr);
    };
    launch(grid, -1);
    for (int t = 0; t < T; ++t) launch(one, t);
    EXPECT_TRUE(bitwise_equal(grid.ybig.get(), one.ybig.get())) << "int8 " << i8;
    EXPECT_TRUE(bitwise_equal(grid.logits.get(), one.logits.get())) << "int8 " << i8;
    EXPECT_EQ(grid.ids.get(), one.ids.get()) << "int8 " << i8;
    EXPECT_TRUE(bitwise_equal(grid.wts.get(), one.wts.get())) << "int8 " << i8;
    EXPECT_TRUE(bitwise_equal(grid.g.get(), one.g.get())) << "int8 " << i8;
    EXPECT_TRUE(bitwise_equal(grid.gsh.get(), one.gsh.get())) << "int8 " << i8;
    EXPECT_TRUE(bitwise_equal(grid.res.get(), one.res.get())) << "int8 " << i8;
    EXPECT_TRUE(bitwise_equal(grid.xs.get(), one.xs.get())) << "int8 " << i8;
    EXPECT_EQ(grid.counts.get(), one.counts.get()) << "int8 " << i8;
    // The tokens differ (each block read its own token's rows), and every pick was counted.
    const std::vector<float> yb = grid.ybig.get();
    EXPECT_NE(std::memcmp(yb.data(), yb.data() + big, big * sizeof(float)), 0);
    unsigned long long picks = 0;
    for (unsigned long long c : grid.counts.get()) picks += c;
    EXPECT_EQ(picks, static_cast<unsigned long long>(T) * k);
  }
  // What a token grid cannot take is refused.
  Dev<float> dy(static_cast<size_t>(T) * big);
  sc::GemvJob j;
  j.w = &mbig, j.x = dx.p, j.y = dy.p;
  EXPECT_THROW(sc::gemv_batch(&j, 1, nullptr, nullptr, nullptr, nullptr, nullptr, sc::kMaxGemvTokens + 1),
               strata::Error);
  Dev<unsigned int> counter(std::vector<unsigned int>{0u});
  sc::GemvNorm nm;
  nm.x = dx.p, nm.w = dn.p, nm.out = dy.p, nm.n = d, nm.counter = counter.p;
  EXPECT_THROW(sc::gemv_batch(&j, 1, nullptr, &nm, nullptr, nullptr, nullptr, 2), strata::Error);
}

// The token-shared launch (a token grid of unrouted K-quant jobs on the int8 path: each block stages
// several tokens and reads each weight once for all of them) is T single-token launches, bit for bit:
// normed jobs sharing one input (one of many tiles), gate/up pairs of one type and of two, an Accumulate
// job beside a narrower one, a row too wide for a full block's tokens' staging, a normed 4096-column input,
// normed token rows mostly not 16-byte aligned, at token counts that split unevenly (the size threshold
// lowered so that small matrices take it); launches it cannot take go to the token grid.
TEST(CudaKernels, GemvTokenSharedEqualsSingleTokenLaunchesBitwise) {
  REQUIRE_GPU();
  std::mt19937 rng(51);
  const int d = 2048, wide = 4096, huge = 16384;
  struct W {
    GgmlType type;
    int64_t rows, cols;
  };
  const std::vector<W> shapes = {{GgmlType::Q4_K, 3000, d}, {GgmlType::Q5_K, 512, d}, {GgmlType::Q6_K, 256, d},
                                 {GgmlType::Q4_K, 768, d},  {GgmlType::Q4_K, 768, d}, {GgmlType::Q4_K, 256, d},
                                 {GgmlType::Q6_K, 256, d},  {GgmlType::Q6_K, d, wide}, {GgmlType::Q5_K, 320, huge},
                                 {GgmlType::Q8_0, 256, d},  {GgmlType::Q4_K, 512, wide}};
  std::vector<std::unique_ptr<Dev<uint8_t>>> bufs;
  std::vector<sc::DevMatrix> m;
  for (const W& w : shapes) {
    bufs.push_back(std::make_unique<Dev<uint8_t>>(make_weights(w.type, w.rows, w.cols, rng)));
    m.push_back(dev_matrix(w.type, *bufs.back(), w.rows, w.cols));
  }
  const int kMaxT = sc::kMaxGemvTokens;
  const std::vector<float> x = randn(static_cast<size_t>(kMaxT) * huge, rng, 3.0f), nw = randn(wide, rng);
  const std::vector<float> res = randn(static_cast<size_t>(kMaxT) * d, rng);
  Dev<float> dx(x), dn(nw);
  Int8Gemv int8;
  struct AnySize {  // the token-shared form for matrices of any size
    AnySize() { sc::set_gemv_tokens_min_bytes(0); }
    ~AnySize() { sc::set_gemv_tokens_min_bytes(sc::kGemvTokensMinBytes); }
  } any_size;
  // The launches' jobs, writing into outputs o, for tokens from `at` on (token stride = the row's width
  // unless given).
  using Outs = std::vector<std::unique_ptr<Dev<float>>>;
  auto jobs_of = [&](int launch, Outs& o, int at) {
    std::vector<sc::GemvJob> j;
    auto job = [&](int wi, int out, int64_t cols, int64_t stride = 0) {
      if (stride == 0) stride = cols;
      sc::GemvJob g;
      g.w = &m[static_cast<size_t>(wi)], g.x = dx.p + at * stride, g.x_token_stride = stride;
      g.y = o[static_cast<size_t>(out)]->p + at * m[static_cast<size_t>(wi)].n_rows;
      g.y_token_stride = m[static_cast<size_t>(wi)].n_rows;
      return g;
    };
    if (launch == 0) {  // q/k/v-like: three normed jobs on one input
      for (int i = 0; i < 3; ++i) {
        j.push_back(job(i, i, d));
        j.back().norm_w = dn.p, j.back().norm_eps = 1e-6f;
      }
    } else if (launch == 1) {  // gate/up pairs: one type, and two types
      j.push_back(job(3, 3, d));
      j.back().w2 = &m[4], j.back().mode = sc::GemvMode::SwigluPair, j.back().norm_w = dn.p, j.back().norm_eps = 1e-5f;
      j.push_back(job(5, 5, d));
      j.back().w2 = &m[6], j.back().mode = sc::GemvMode::SwigluPair;
    } else if (launch == 2) {  // an Accumulate job on a wider input beside a narrower job
      j.push_back(job(7, 7, wide));
      j.back().mode = sc::GemvMode::Accumulate;
      j.push_back(job(2, 2, d));
    } else if (launch == 3) {  // a 16384-column row
      j.push_back(job(8, 8, huge));
    } else if (launch == 4) {  // a normed job on a 4096-column input
      j.push_back(job(10, 10, wide));
      j.back().norm_w = dn.p, j.back().norm_eps = 1e-6f;
    } else {  // normed inputs, three token rows in four not 16-byte aligned (staged element by element)
      j.push_back(job(0, 0, d, d + 1));
      j.back().norm_w = dn.p, j.back().norm_eps = 1e-6f;
    }
    return j;
  };
  auto outputs = [&]() {
    Outs o;
    for (size_t i = 0; i < shapes.size(); ++i)
      o.push_back(i == 7 ? std::make_unique<Dev<float>>(res)
                         : std::make_unique<Dev<float>>(static_cast<size_t>(kMaxT) * shapes[i].rows));
    return o;
  };
  for (const int T : {2, 5, 9, 10, 16, 20, 32}) {
    for (int launch = 0; launch < 6; ++launch) {
      Outs shared = outputs(), one = outputs();
      std::vector<sc::GemvJob> js = jobs_of(launch, shared, 0);
      const int per = sc::gemv_tokens_per_block(js.data(), static_cast<int>(js.size()), T);
      EXPECT_GE(per, 1) << "T " << T << " launch " << launch << ": not token-shared";
      EXPECT_LE(per, sc::kGemvSharedTokens);
      sc::gemv_batch(js.data(), static_cast<int>(js.size()), nullptr, nullptr, nullptr, nullptr, nullptr, T);
      for (int t = 0; t < T; ++t) {
        std::vector<sc::GemvJob> jt = jobs_of(launch, one, t);
        sc::gemv_batch(jt.data(), static_cast<int>(jt.size()), nullptr);
      }
      for (const sc::GemvJob& j : js) {
        const size_t oi = static_cast<size_t>(&*j.w - m.data());
        const size_t rows = static_cast<size_t>(j.w->n_rows);
        const std::vector<float> a = shared[oi]->get(), b = one[oi]->get();
        const std::vector<float> a_t(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(T * rows));
        const std::vector<float> b_t(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(T * rows));
        EXPECT_TRUE(bitwise_equal(a_t, b_t)) << "T " << T << " launch " << launch << " job " << oi;
        // Every token was computed: token T - 1's rows differ from token 0's.
        EXPECT_NE(std::memcmp(a.data(), a.data() + (T - 1) * rows, rows * sizeof(float)), 0) << "T " << T;
      }
    }
  }
  // Launches the token-shared form does not take.
  Outs o = outputs();
  std::vector<sc::GemvJob> q8 = {jobs_of(0, o, 0)[0]};
  q8[0].w = &m[9], q8[0].y_token_stride = m[9].n_rows;
  EXPECT_EQ(sc::gemv_tokens_per_block(q8.data(), 1, 4), 0) << "Q8_0 has no int8 form";
  std::vector<sc::GemvJob> plain = jobs_of(0, o, 0);
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 1), 0) << "one token";
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 4, true), 0) << "a routing launch";
  sc::set_gemv_math(sc::GemvMath::Float);
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 4), 0) << "float arithmetic";
  sc::set_gemv_math(sc::GemvMath::Int8);
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 9), 9) << "nine tokens in one block";
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 10), sc::kGemvSharedTokens) << "a full block";
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 20), sc::kGemvSharedTokens) << "two full blocks";
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 17), 9) << "17 tokens in two blocks of nine and eight";
  sc::set_gemv_tokens_min_bytes(sc::kGemvTokensMinBytes);
  EXPECT_EQ(sc::gemv_tokens_per_block(plain.data(), 3, 9), 0) << "a launch of a few MB keeps the token grid";
}

// The multi-token step's DeltaNet input: the projection over a token grid without the conv, then
// conv_silu_tokens walking the tokens, is bit for bit the decode step's projection with the conv fused
// in (GemvJob::conv_w) run token by token: the conv outputs, the state each token leaves (the records)
// and the final state, in both arithmetics, the input normalised in the block as the session's is.
TEST(CudaKernels, ConvSiluTokensEqualsFusedConvProjectionPerToken) {
  REQUIRE_GPU();
  std::mt19937 rng(51);
  const int T = 6, K = 4, channels = 384, cols = 512;
  const std::vector<uint8_t> w = make_weights(GgmlType::Q4_K, channels, cols, rng);
  const std::vector<float> x = randn(static_cast<size_t>(T) * cols, rng, 2.0f), nw = randn(cols, rng);
  const std::vector<float> convw = randn(static_cast<size_t>(channels) * K, rng, 0.5f);
  const std::vector<float> state0 = randn(static_cast<size_t>(K - 1) * channels, rng);
  const size_t win = static_cast<size_t>(K - 1) * channels;
  Dev<uint8_t> dw(w);
  Dev<float> dx(x), dn(nw), dcw(convw);
  const sc::DevMatrix m = dev_matrix(GgmlType::Q4_K, dw, channels, cols);
  for (const bool i8 : {false, true}) {
    std::unique_ptr<Int8Gemv> int8;
    if (i8) int8 = std::make_unique<Int8Gemv>();
    // The decode step's form, token by token: the state after each token kept aside.
    Dev<float> dstate(state0), dmixed(static_cast<size_t>(T) * channels);
    std::vector<float> states;
    for (int t = 0; t < T; ++t) {
      sc::GemvJob j;
      j.w = &m, j.x = dx.p + static_cast<size_t>(t) * cols, j.y = dmixed.p + static_cast<size_t>(t) * channels;
      j.norm_w = dn.p, j.norm_eps = 1e-6f;
      j.conv_w = dcw.p, j.conv_state = dstate.p, j.conv_k = K, j.conv_channels = channels;
      sc::gemv_batch(&j, 1, nullptr);
      const std::vector<float> st = dstate.get();
      states.insert(states.end(), st.begin(), st.end());
    }
    // The multi-token form.
    Dev<float> dstate2(state0), draw(static_cast<size_t>(T) * channels), dmixed2(static_cast<size_t>(T) * channels),
        drec(static_cast<size_t>(T) * win);
    sc::GemvJob j;
    j.w = &m, j.x = dx.p, j.y = draw.p, j.norm_w = dn.p, j.norm_eps = 1e-6f;
    j.x_token_stride = cols, j.y_token_stride = channels;
    sc::gemv_batch(&j, 1, nullptr, nullptr, nullptr, nullptr, nullptr, T);
    sc::conv_silu_tokens(draw.p, T, dcw.p, K, channels, dstate2.p, drec.p, dmixed2.p, nullptr);
    EXPECT_TRUE(bitwise_equal(dmixed2.get(), dmixed.get())) << "conv outputs, int8 " << i8;
    EXPECT_TRUE(bitwise_equal(drec.get(), states)) << "state after each token, int8 " << i8;
    EXPECT_TRUE(bitwise_equal(dstate2.get(), dstate.get())) << "final state, int8 " << i8;
  }
}

// The token grid of the multi-token step's attention and embedding: attn_prep + attention_decode_split
// over T tokens at consecutive positions (one launch each; a sliding window, softplus gates per element,
// a cache long enough for several chunks) equal, bit for bit, the two launches token by token; the
// prefill's embed_rows of T tokens (the multi-token step's embedding) equals T embed_row launches.
TEST(CudaKernels, AttentionTokenGridEqualsOneTokenLaunchesBitwise) {
  REQUIRE_GPU();
  std::mt19937 rng(52);
  const int T = 5, n_head = 4, n_kv = 2, hd = 64, max_ctx = 600, base = 300, window = 128;
  const int q_stride = hd, kv_width = n_kv * hd, qw = n_head * q_stride, ow = n_head * hd;
  const std::vector<float> q = randn(static_cast<size_t>(T) * qw, rng), kk = randn(static_cast<size_t>(T) * kv_width, rng),
                           vv = randn(static_cast<size_t>(T) * kv_width, rng), qn = randn(hd, rng), kn = randn(hd, rng),
                           gate = randn(static_cast<size_t>(T) * ow, rng),
                           kc0 = randn(static_cast<size_t>(max_ctx) * kv_width, rng, 0.2f),
                           vc0 = randn(static_cast<size_t>(max_ctx) * kv_width, rng);
  std::vector<int> pos(T);
  for (int t = 0; t < T; ++t) pos[t] = base + t;
  Dev<float> dqn(qn), dkn(kn), dg(gate);
  Dev<int> dpos(pos);
  const float scale = 1.0f / std::sqrt(float(hd));
  struct Run {
    Dev<float> q, kc, vc, out, scratch;
    Dev<unsigned int> counters;
    Run(const std::vector<float>& q0, const std::vector<float>& k0, const std::vector<float>& v0, size_t outn,
        size_t scratch_n, size_t n_counters)
        : q(q0), kc(k0), vc(v0), out(outn), scratch(scratch_n), counters(std::vector<unsigned int>(n_counters, 0u)) {}
  };
  const size_t per = sc::attention_scratch_floats(n_head, hd, max_ctx);
  Run grid(q, kc0, vc0, static_cast<size_t>(T) * ow, T * per, static_cast<size_t>(T) * n_head);
  Run one(q, kc0, vc0, static_cast<size_t>(T) * ow, per, n_head);
  Dev<float> dkk(kk), dvv(vv);
  sc::AttnOutGate og;
  og.kind = sc::AttnOutGate::SoftplusPerElement, og.g = dg.p;
  sc::AttnTokens tk;
  tk.n = T, tk.q = qw, tk.kv = kv_width, tk.out = ow, tk.gate = ow, tk.scratch = static_cast<int64_t>(per);
  tk.counters = n_head;
  sc::attn_prep(grid.q.p, q_stride, dkk.p, dvv.p, grid.kc.p, grid.vc.p, kv_width, n_head, n_kv, hd, dqn.p, dkn.p, 1e-6f,
                hd, 1e4f, dpos.p, nullptr, {}, 0, nullptr, tk);
  sc::attention_decode_split(grid.q.p, q_stride, grid.kc.p, grid.vc.p, kv_width, n_head, n_kv, hd, scale, og, dpos.p,
                             max_ctx, grid.scratch.p, grid.counters.p, grid.out.p, nullptr, {}, window, 0, tk);
  for (int t = 0; t < T; ++t) {
    sc::attn_prep(one.q.p + t * qw, q_stride, dkk.p + t * kv_width, dvv.p + t * kv_width, one.kc.p, one.vc.p, kv_width,
                  n_head, n_kv, hd, dqn.p, dkn.p, 1e-6f, hd, 1e4f, dpos.p + t, nullptr);
    sc::AttnOutGate g1 = og;
    g1.g = dg.p + t * ow;
    sc::attention_decode_split(one.q.p + t * qw, q_stride, one.kc.p, one.vc.p, kv_width, n_head, n_kv, hd, scale, g1,
                               dpos.p + t, max_ctx, one.scratch.p, one.counters.p, one.out.p + t * ow, nullptr, {},
                               window);
  }
  EXPECT_TRUE(bitwise_equal(grid.q.get(), one.q.get())) << "normalised, rotated queries";
  EXPECT_TRUE(bitwise_equal(grid.kc.get(), one.kc.get())) << "key cache";
  EXPECT_TRUE(bitwise_equal(grid.vc.get(), one.vc.get())) << "value cache";
  EXPECT_TRUE(bitwise_equal(grid.out.get(), one.out.get())) << "attention outputs";
  EXPECT_EQ(grid.counters.get(), std::vector<unsigned int>(static_cast<size_t>(T) * n_head, 0u));
  // Embedding rows.
  const int V = 40, d = 96;
  const std::vector<uint8_t> table = make_weights(GgmlType::Q8_0, V, d, rng);
  Dev<uint8_t> dt(table);
  const sc::DevMatrix mt = dev_matrix(GgmlType::Q8_0, dt, V, d);
  Dev<int> dtok(std::vector<int>{3, 39, 0, 17, 3});
  Dev<float> eg(static_cast<size_t>(T) * d), e1(static_cast<size_t>(T) * d);
  sc::prefill::embed_rows(mt, dtok.p, T, eg.p, nullptr);
  for (int t = 0; t < T; ++t) sc::embed_row(mt, dtok.p + t, e1.p + t * d, nullptr);
  EXPECT_TRUE(bitwise_equal(eg.get(), e1.get())) << "embedding rows";
}

// The multi-token step's recurrence: T steps chained through separate state buffers (token t reads
// the state token t - 1 wrote, launched after the previous kernel completes) equal, bit for bit, T steps
// updating one state in place, in every output and state.
TEST(CudaKernels, DeltaNetStepChainedThroughRecordsEqualsInPlaceSteps) {
  REQUIRE_GPU();
  std::mt19937 rng(53);
  const int T = 4, nk = 2, nv = 4, dk = 64, dv = 64;
  const int key_dim = nk * dk, channels = 2 * key_dim + nv * dv, vd = nv * dv;
  const size_t ssm = static_cast<size_t>(nv) * dk * dv;
  const float eps = 1e-6f, q_scale = 1.0f / std::sqrt(float(dk));
  const std::vector<float> S0 = randn(ssm, rng, 0.1f), mixed = randn(static_cast<size_t>(T) * channels, rng),
                           b = randn(static_cast<size_t>(T) * nv, rng), alpha = randn(static_cast<size_t>(T) * nv, rng),
                           z = randn(static_cast<size_t>(T) * vd, rng), dt_bias = randn(nv, rng), norm_w = randn(dv, rng);
  std::vector<float> a(nv);
  for (float& v : a) v = -std::fabs(randn(1, rng)[0]);
  Dev<float> dmixed(mixed), db(b), dalpha(alpha), dz(z), da(a), ddt(dt_bias), dnorm(norm_w);
  Dev<double> dscratch(sc::deltanet_scratch_doubles(nv, dv));
  Dev<unsigned int> dcounters(std::vector<unsigned int>(nv, 0u));
  // In place, the state copied after each step.
  Dev<float> dS(S0), dout(static_cast<size_t>(T) * vd);
  std::vector<float> states;
  for (int t = 0; t < T; ++t) {
    sc::deltanet_step_fast(dS.p, dmixed.p + t * channels, db.p + t * nv, dalpha.p + t * nv, da.p, ddt.p, dnorm.p,
                           dz.p + t * vd, eps, nk, nv, dk, dv, dscratch.p, dcounters.p, dout.p + t * vd, nullptr, true,
                           q_scale);
    const std::vector<float> st = dS.get();
    states.insert(states.end(), st.begin(), st.end());
  }
  // Chained: records 0 .. T-2, the last step into the live state.
  Dev<float> dlive(S0), drec(static_cast<size_t>(T) * ssm), dout2(static_cast<size_t>(T) * vd);
  for (int t = 0; t < T; ++t) {
    float* in = t == 0 ? dlive.p : drec.p + (t - 1) * ssm;
    float* out = t + 1 < T ? drec.p + t * ssm : dlive.p;
    sc::deltanet_step_fast(in, dmixed.p + t * channels, db.p + t * nv, dalpha.p + t * nv, da.p, ddt.p, dnorm.p,
                           dz.p + t * vd, eps, nk, nv, dk, dv, dscratch.p, dcounters.p, dout2.p + t * vd, nullptr, true,
                           q_scale, out, true);
  }
  EXPECT_TRUE(bitwise_equal(dout2.get(), dout.get())) << "outputs";
  const std::vector<float> rec = drec.get();
  EXPECT_TRUE(bitwise_equal(std::vector<float>(rec.begin(), rec.begin() + static_cast<std::ptrdiff_t>((T - 1) * ssm)),
                            std::vector<float>(states.begin(), states.begin() + static_cast<std::ptrdiff_t>((T - 1) * ssm))))
      << "recorded states";
  EXPECT_TRUE(bitwise_equal(dlive.get(), std::vector<float>(states.end() - static_cast<std::ptrdiff_t>(ssm), states.end())))
      << "final state";
}

}  // namespace

#endif  // STRATA_HAVE_CUDA
