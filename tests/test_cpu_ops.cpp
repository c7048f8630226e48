// CPU ops against scalar float64 reference implementations written here, independently of ops.cpp
// (different formulation where one exists, e.g. the DeltaNet state kept transposed as in the paper).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "strata/cpu/ops.h"

namespace {

std::vector<float> random_vec(std::mt19937& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(CpuOps, RmsNormMatchesFloat64) {
  std::mt19937 rng(1);
  const int n = 300;
  auto x = random_vec(rng, n, -3, 3), w = random_vec(rng, n, 0.5, 1.5);
  std::vector<float> y(n);
  strata::rmsnorm(x.data(), w.data(), 1e-6f, n, y.data());
  double ms = 0;
  for (float v : x) ms += double(v) * v;
  ms /= n;
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) ref[i] = x[i] / std::sqrt(ms + 1e-6) * w[i];
  EXPECT_LT(max_abs_diff(y, ref), 1e-5);
  // In place gives the same.
  strata::rmsnorm(x.data(), w.data(), 1e-6f, n, x.data());
  EXPECT_EQ(x, y);
}

TEST(CpuOps, L2NormMatchesFloat64) {
  std::mt19937 rng(2);
  auto x = random_vec(rng, 64);
  auto ref_in = x;
  strata::l2norm_inplace(x.data(), 64, 1e-6f);
  double ss = 0;
  for (float v : ref_in) ss += double(v) * v;
  std::vector<double> ref(64);
  for (int i = 0; i < 64; ++i) ref[i] = ref_in[i] / std::sqrt(ss + 1e-6);
  EXPECT_LT(max_abs_diff(x, ref), 1e-6);
}

// Reference NEOX rotary: pair (i, i + rot/2) rotated by pos * base^(-2i/rot); dims >= rot untouched.
std::vector<double> rope_ref(const std::vector<float>& x, int rot, int pos, double base) {
  std::vector<double> y(x.begin(), x.end());
  for (int i = 0; i < rot / 2; ++i) {
    const double th = pos * std::pow(base, -2.0 * i / rot);
    y[i] = x[i] * std::cos(th) - x[i + rot / 2] * std::sin(th);
    y[i + rot / 2] = x[i + rot / 2] * std::cos(th) + x[i] * std::sin(th);
  }
  return y;
}

TEST(CpuOps, RopeNeoxFullAndPartial) {
  std::mt19937 rng(3);
  for (int rot : {32, 8}) {  // full rotary over a 32-dim head, then partial (first 8 dims)
    for (int pos : {0, 1, 7, 300}) {
      auto x = random_vec(rng, 32);
      auto ref = rope_ref(x, rot, pos, 10000.0);
      strata::rope_neox_inplace(x.data(), rot, pos, 10000.0f);
      EXPECT_LT(max_abs_diff(x, ref), 2e-5) << "rot " << rot << " pos " << pos;
      for (int i = rot; i < 32; ++i) EXPECT_EQ(x[i], static_cast<float>(ref[i]));
    }
  }
}

TEST(CpuOps, SoftmaxAndTopK) {
  std::vector<float> x = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  std::vector<float> p = x;
  strata::softmax_inplace(p.data(), 5);
  double z = 0;
  for (float v : x) z += std::exp(double(v));
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(p[i], std::exp(double(x[i])) / z, 1e-7);
  int idx[3];
  strata::top_k(x.data(), 5, 3, idx);
  EXPECT_EQ(idx[0], 1);  // tie with index 3: lower index first
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 0);
}

TEST(CpuOps, SoftplusLikeTorch) {
  for (float x : {-30.0f, -1.0f, 0.0f, 2.5f, 19.0f, 25.0f}) {
    const double ref = x > 20 ? x : std::log1p(std::exp(double(x)));
    EXPECT_NEAR(strata::softplusf(x), ref, 1e-6 * std::max(1.0, std::fabs(ref)));
  }
}

TEST(CpuOps, GqaAttentionMatchesFloat64) {
  // 4 query heads sharing 2 KV heads, 5 cached positions, head_dim 16, cache rows interleave KV heads.
  std::mt19937 rng(4);
  const int hd = 16, n_kv = 2, n_head = 4, n_ctx = 5;
  const int stride = n_kv * hd;
  auto K = random_vec(rng, n_ctx * stride), V = random_vec(rng, n_ctx * stride), Q = random_vec(rng, n_head * hd);
  const double scale = 1.0 / std::sqrt(double(hd));
  std::vector<float> scores(n_ctx), out(hd);
  for (int h = 0; h < n_head; ++h) {
    const int g = h / (n_head / n_kv);
    strata::attend_one_head(Q.data() + h * hd, strata::f32_kv_head(K.data() + g * hd, stride),
                            strata::f32_kv_head(V.data() + g * hd, stride), n_ctx, hd, static_cast<float>(scale),
                            scores.data(), out.data());
    std::vector<double> s(n_ctx);
    double mx = -1e300, z = 0;
    for (int p = 0; p < n_ctx; ++p) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += double(Q[h * hd + i]) * K[p * stride + g * hd + i];
      s[p] = d * scale;
      mx = std::max(mx, s[p]);
    }
    for (double& v : s) z += (v = std::exp(v - mx));
    std::vector<double> ref(hd, 0.0);
    for (int p = 0; p < n_ctx; ++p)
      for (int i = 0; i < hd; ++i) ref[i] += s[p] / z * V[p * stride + g * hd + i];
    EXPECT_LT(max_abs_diff(out, ref), 1e-6) << "head " << h;
  }
}

TEST(CpuOps, Conv1dStateMatchesDirectConvolution) {
  // Stream 7 tokens through the rolling state; compare with a direct causal convolution over the
  // whole (zero-padded) history.
  std::mt19937 rng(5);
  const int K = 4, C = 6, T = 7;
  auto w = random_vec(rng, C * K), xs = random_vec(rng, T * C);
  std::vector<float> state((K - 1) * C, 0.0f), out(C);
  for (int t = 0; t < T; ++t) {
    strata::conv1d_step(xs.data() + t * C, w.data(), K, C, state.data(), out.data());
    std::vector<double> ref(C, 0.0);
    for (int c = 0; c < C; ++c)
      for (int j = 0; j < K; ++j) {
        const int src = t - (K - 1) + j;
        if (src >= 0) ref[c] += double(w[c * K + j]) * xs[src * C + c];
      }
    EXPECT_LT(max_abs_diff(out, ref), 1e-6) << "token " << t;
  }
}

TEST(CpuOps, DeltaNetStepsMatchPaperRecurrence) {
  // Reference in the paper's form with the state as M (dv x dk):
  //   M_t = M_{t-1} * exp(g) * (I - beta k k^T) + beta v k^T,   o_t = M_t q.
  std::mt19937 rng(6);
  const int dk = 8, dv = 12, T = 6;
  std::vector<float> S(dk * dv, 0.0f), out(dv);
  std::vector<double> M(dv * dk, 0.0);
  for (int t = 0; t < T; ++t) {
    auto q = random_vec(rng, dk), k = random_vec(rng, dk), v = random_vec(rng, dv);
    strata::l2norm_inplace(q.data(), dk, 1e-6f);
    strata::l2norm_inplace(k.data(), dk, 1e-6f);
    const float g = -0.3f * (t + 1) / T, beta = 0.2f + 0.1f * t;
    strata::deltanet_step(S.data(), q.data(), k.data(), v.data(), g, beta, dk, dv, out.data());

    std::vector<double> A(dk * dk);  // exp(g) (I - beta k k^T)
    for (int i = 0; i < dk; ++i)
      for (int j = 0; j < dk; ++j) A[i * dk + j] = std::exp(double(g)) * ((i == j) - double(beta) * k[i] * k[j]);
    std::vector<double> Mn(dv * dk, 0.0);
    for (int r = 0; r < dv; ++r)
      for (int j = 0; j < dk; ++j) {
        double acc = double(beta) * v[r] * k[j];
        for (int i = 0; i < dk; ++i) acc += M[r * dk + i] * A[i * dk + j];
        Mn[r * dk + j] = acc;
      }
    M = Mn;
    std::vector<double> ref(dv, 0.0);
    for (int r = 0; r < dv; ++r)
      for (int j = 0; j < dk; ++j) ref[r] += M[r * dk + j] * q[j];
    EXPECT_LT(max_abs_diff(out, ref), 1e-5) << "token " << t;
    // The state itself matches too (ours is the transpose).
    double sd = 0;
    for (int i = 0; i < dk; ++i)
      for (int r = 0; r < dv; ++r) sd = std::max(sd, std::fabs(S[i * dv + r] - M[r * dk + i]));
    EXPECT_LT(sd, 1e-5);
  }
}

}  // namespace
