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
#include <random>
#include <vector>

#include "strata/base/error.h"
#include "strata/cpu/ops.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/kernels.h"
#include "strata/engine/session.h"
#include "strata/quant/quantize.h"

namespace {

using strata::GgmlType;
namespace sc = strata::cuda;

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    if (!sc::device_available()) GTEST_SKIP() << "no CUDA device: " << sc::device_description(); \
  } while (0)

// A device buffer holding a copy of a host vector, poisoned (all bits set: NaN for floats) when empty.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xff, n * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

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

TEST(CudaKernels, RoutedMatvecIndexesExpertsOnTheGpu) {
  REQUIRE_GPU();
  std::mt19937 rng(12);
  const int n_expert = 6, rows = 40, cols = 512;
  const std::vector<int> ids = {4, 1, 5};
  for (GgmlType type : {GgmlType::BF16, GgmlType::Q4_K, GgmlType::Q6_K}) {
    const std::vector<uint8_t> w = make_weights(type, int64_t{rows} * n_expert, cols, rng);
    const size_t stride = strata::row_bytes(type, cols) * rows;
    for (int64_t x_stride : {int64_t{0}, int64_t{cols}}) {
      const std::vector<float> x = randn(static_cast<size_t>(cols) * ids.size(), rng);
      Dev<uint8_t> dw(w);
      Dev<int> did(ids);
      Dev<float> dx(x), dy(ids.size() * rows);
      sc::matvec_routed(dev_matrix(type, dw, rows, cols, n_expert), did.p, static_cast<int>(ids.size()), dx.p, x_stride,
                        dy.p, nullptr);
      std::vector<float> ref;
      for (size_t j = 0; j < ids.size(); ++j) {
        const std::vector<float> r =
            ref_matvec(type, w.data() + stride * static_cast<size_t>(ids[j]), rows, cols, x.data() + j * x_stride);
        ref.insert(ref.end(), r.begin(), r.end());
      }
      EXPECT_LE(rel_err(dy.get(), ref), 1e-5) << strata::type_traits(type).name << " x_stride " << x_stride;
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

  Dev<float> dy(y);
  sc::add_inplace(dx.p, dy.p, n * d, nullptr);
  std::vector<float> sum(x);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += y[i];
  EXPECT_EQ(dx.get(), sum);
}

TEST(CudaKernels, NormRopeHeadsPartialAndFullRotary) {
  REQUIRE_GPU();
  std::mt19937 rng(15);
  for (int rope_dims : {16, 64}) {
    const int heads = 3, hd = 64, stride = 2 * hd, pos = 1234, max_ctx = 1300;
    const std::vector<float> src = randn(heads * stride, rng), w = randn(hd, rng);
    Dev<float> dsrc(src), dw(w), dcache(static_cast<size_t>(max_ctx) * heads * hd);
    Dev<int> dpos(std::vector<int>{pos});
    sc::norm_rope_heads(dsrc.p, stride, dcache.p, hd, heads * hd, heads, hd, dw.p, 1e-6f, rope_dims, 1e6f, dpos.p,
                        nullptr);
    const std::vector<float> cache = dcache.get();
    std::vector<float> got(cache.begin() + static_cast<int64_t>(pos) * heads * hd,
                           cache.begin() + static_cast<int64_t>(pos + 1) * heads * hd);
    std::vector<float> ref(heads * hd);
    for (int h = 0; h < heads; ++h) {
      strata::rmsnorm(src.data() + h * stride, w.data(), 1e-6f, hd, ref.data() + h * hd);
      strata::rope_neox_inplace(ref.data() + h * hd, rope_dims, pos, 1e6f);
    }
    EXPECT_LE(rel_err(got, ref), 1e-6) << "rope_dims " << rope_dims;
  }
}

TEST(CudaKernels, AttentionDecodeMatchesAttendOneHead) {
  REQUIRE_GPU();
  std::mt19937 rng(16);
  for (bool gated : {false, true}) {
    const int n_head = 4, n_kv = 2, hd = 64, max_ctx = 700, pos = 613;
    const int q_stride = gated ? 2 * hd : hd, kv_width = n_kv * hd;
    const std::vector<float> q = randn(n_head * q_stride, rng), k = randn(max_ctx * kv_width, rng),
                             v = randn(max_ctx * kv_width, rng);
    Dev<float> dq(q), dk(k), dv(v), dscores(n_head * max_ctx), dout(n_head * hd);
    Dev<int> dpos(std::vector<int>{pos});
    const float scale = 1.0f / std::sqrt(float(hd));
    sc::attention_decode(dq.p, q_stride, dk.p, dv.p, kv_width, n_head, n_kv, hd, scale, gated, dpos.p, max_ctx,
                         dscores.p, dout.p, nullptr);
    std::vector<float> ref(n_head * hd), scores(pos + 1);
    for (int h = 0; h < n_head; ++h) {
      const int g = h / (n_head / n_kv);
      float* o = ref.data() + h * hd;
      strata::attend_one_head(q.data() + h * q_stride, k.data() + g * hd, v.data() + g * hd, kv_width, pos + 1, hd,
                              scale, scores.data(), o);
      if (gated)
        for (int d = 0; d < hd; ++d) o[d] *= strata::sigmoidf(q[h * q_stride + hd + d]);
    }
    EXPECT_LE(rel_err(dout.get(), ref), 1e-5) << "gated " << gated;
  }
}

TEST(CudaKernels, Conv1dStepAdvancesTheWindow) {
  REQUIRE_GPU();
  std::mt19937 rng(17);
  const int K = 4, ch = 300;
  const std::vector<float> w = randn(ch * K, rng);
  std::vector<float> state = randn((K - 1) * ch, rng);
  Dev<float> dw(w), dstate(state), dout(ch);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> x = randn(ch, rng);
    Dev<float> dx(x);
    cudaMemset(dout.p, 0xff, ch * sizeof(float));
    sc::conv1d_silu_step(dx.p, dw.p, K, ch, dstate.p, dout.p, nullptr);
    std::vector<float> ref(ch);
    strata::conv1d_step(x.data(), w.data(), K, ch, state.data(), ref.data());
    for (float& r : ref) r = strata::siluf(r);
    EXPECT_LE(rel_err(dout.get(), ref), 1e-6) << "step " << step;
    EXPECT_EQ(dstate.get(), state) << "step " << step;
  }
}

TEST(CudaKernels, DeltaNetStepMatchesCpuRecurrence) {
  REQUIRE_GPU();
  std::mt19937 rng(18);
  const int nk = 2, nv = 4, dk = 64, dv = 64;
  const int key_dim = nk * dk, channels = 2 * key_dim + nv * dv;
  const float eps = 1e-6f, q_scale = 1.0f / std::sqrt(float(dk));
  std::vector<float> S = randn(nv * dk * dv, rng, 0.1f);
  const std::vector<float> a = {-0.5f, -1.0f, -0.1f, -2.0f}, dt_bias = randn(nv, rng), norm_w = randn(dv, rng);
  Dev<float> dS(S), da(a), ddt(dt_bias), dnorm(norm_w), dout(nv * dv);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> mixed = randn(channels, rng);
    const std::vector<float> b = randn(nv, rng), alpha = randn(nv, rng, 3.0f), z = randn(nv * dv, rng);
    Dev<float> dmixed(mixed), db(b), dalpha(alpha), dz(z);
    sc::deltanet_qk_norm(dmixed.p, nk, dk, q_scale, nullptr);
    cudaMemset(dout.p, 0xff, nv * dv * sizeof(float));
    sc::deltanet_step_gated(dS.p, dmixed.p, db.p, dalpha.p, da.p, ddt.p, dnorm.p, dz.p, eps, nk, nv, dk, dv, dout.p,
                            nullptr);
    // CPU: the sequence deltanet_block performs for one token.
    float* q = mixed.data();
    float* k = mixed.data() + key_dim;
    for (int h = 0; h < nk; ++h) {
      strata::l2norm_inplace(q + h * dk, dk, 1e-6f);
      strata::l2norm_inplace(k + h * dk, dk, 1e-6f);
      for (int i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
    }
    EXPECT_LE(rel_err(dmixed.get(), mixed), 1e-6) << "q/k norm, step " << step;
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
  for (int n_expert : {32, 128, 256}) {
    for (bool norm : {true, false}) {
      const int k = 8;
      std::vector<float> logits = randn(n_expert, rng, 2.0f);
      logits[3] = logits[n_expert - 1];  // a tie: the lower id must win
      Dev<float> dl(logits), dw(k);
      Dev<int> dids(k);
      sc::route_topk(dl.p, n_expert, k, norm, dids.p, dw.p, nullptr);
      std::vector<float> p(logits);
      strata::softmax_inplace(p.data(), n_expert);
      std::vector<int> idx(k);
      strata::top_k(p.data(), n_expert, k, idx.data());
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += p[idx[j]];
      std::vector<float> wref(k);
      for (int j = 0; j < k; ++j) wref[j] = norm ? static_cast<float>(p[idx[j]] / sum) : p[idx[j]];
      EXPECT_EQ(dids.get(), idx) << n_expert;
      EXPECT_LE(rel_err(dw.get(), wref), 1e-6) << n_expert;
    }
  }
}

TEST(CudaKernels, SwigluAndMoeCombine) {
  REQUIRE_GPU();
  std::mt19937 rng(20);
  const int k = 4, d = 300;
  const std::vector<float> g = randn(k * d, rng), u = randn(k * d, rng);
  Dev<float> dg(g), du(u), dout(k * d);
  sc::swiglu(dg.p, du.p, k * d, dout.p, nullptr);
  std::vector<float> ref(k * d);
  strata::swiglu(g.data(), u.data(), k * d, ref.data());
  EXPECT_LE(rel_err(dout.get(), ref), 1e-6);

  const std::vector<int> ids = {7, 2, 9, 0};
  const std::vector<float> wts = {0.4f, 0.3f, 0.2f, 0.1f}, ys = randn(d, rng), x = randn(d, rng);
  const std::vector<float> gate = {0.7f};
  for (bool shared : {false, true}) {
    Dev<float> dx(x), dye(g), dw(wts), dys(ys), dgate(gate);
    Dev<int> dids(ids);
    sc::moe_combine_add(dx.p, dye.p, dids.p, dw.p, k, d, shared ? dys.p : nullptr, dgate.p, nullptr);
    std::vector<float> want(x);
    const int order[] = {3, 1, 0, 2};  // slots by ascending expert id
    for (int j = 0; j < d; ++j) {
      double acc = 0;
      for (int s : order) acc += double(wts[s]) * g[s * d + j];
      if (shared) acc += double(strata::sigmoidf(gate[0])) * ys[j];
      want[j] += static_cast<float>(acc);
    }
    EXPECT_LE(rel_err(dx.get(), want), 1e-6) << "shared " << shared;
  }
}

TEST(CudaKernels, ArgmaxPicksLowestIndexAmongEquals) {
  REQUIRE_GPU();
  std::mt19937 rng(21);
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{151936}}) {
    std::vector<float> x = randn(static_cast<size_t>(n), rng);
    if (n > 100) {
      const float top = *std::max_element(x.begin(), x.end()) + 1.0f;
      x[n - 5] = top;
      x[77] = top;  // the tie: 77 must win
    }
    Dev<float> dx(x);
    Dev<int> dout(1);
    sc::argmax(dx.p, n, dout.p, nullptr);
    EXPECT_EQ(dout.get()[0], strata::argmax(x.data(), n)) << n;
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

}  // namespace

#endif  // STRATA_HAVE_CUDA
