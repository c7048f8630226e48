// Gated DeltaNet linear attention (qwen35moe), one token at a time through the recurrence
// (HF Qwen3_5MoeGatedDeltaNet + torch_recurrent_gated_delta_rule; facts in model-spec.md):
//   qkv = conv1d_causal(W_qkv x) -> silu -> split q | k | v
//   q, k L2-normalised per head, q scaled by 1/sqrt(head_k)
//   beta = sigmoid(W_b x), g = A * softplus(W_a x + dt_bias) with A = -exp(A_log) (stored as ssm_a)
//   S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q
//   o = rmsnorm(o) * norm_w * silu(z), z = W_z x; out = W_out o
// Value-head order: GGUF files store value heads tiled (value head j of every key group in turn), so
// value head h reads key head h % n_k_heads. With equal head counts the two orders coincide.
#include <omp.h>

#include <cmath>
#include <vector>

#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"

namespace strata {

void deltanet_block(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const float* xn, int n,
                    float* out) {
  const int nk = c.ssm_k_heads, nv = c.ssm_v_heads, dk = c.ssm_head_k, dv = c.ssm_head_v;
  const int channels = c.ssm_conv_channels();
  const int key_dim = nk * dk;
  const int v_dim = nv * dv;

  std::vector<float> QKV(static_cast<size_t>(n) * channels);
  std::vector<float> Z(static_cast<size_t>(n) * v_dim);
  std::vector<float> B(static_cast<size_t>(n) * nv);
  std::vector<float> A(static_cast<size_t>(n) * nv);
  project(w.qkv, xn, n, QKV.data());
  project(w.gate, xn, n, Z.data());
  project(w.beta, xn, n, B.data());
  project(w.alpha, xn, n, A.data());

  std::vector<float> mixed(static_cast<size_t>(channels));
  std::vector<float> O(static_cast<size_t>(n) * v_dim);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int t = 0; t < n; ++t) {
    conv1d_step(QKV.data() + static_cast<int64_t>(t) * channels, w.conv.data(), c.ssm_conv_kernel, channels,
                s.conv.data(), mixed.data());
    for (float& x : mixed) x = siluf(x);
    float* q = mixed.data();
    float* k = mixed.data() + key_dim;
    const float* v = mixed.data() + 2 * key_dim;
    for (int h = 0; h < nk; ++h) {
      l2norm_inplace(q + h * dk, dk, 1e-6f);
      l2norm_inplace(k + h * dk, dk, 1e-6f);
      for (int i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
    }
#pragma omp parallel for schedule(static)
    for (int h = 0; h < nv; ++h) {
      const int kh = h % nk;
      const float beta = sigmoidf(B[static_cast<size_t>(t) * nv + h]);
      const float g = w.a[h] * softplusf(A[static_cast<size_t>(t) * nv + h] + w.dt_bias[h]);
      float* o = O.data() + static_cast<int64_t>(t) * v_dim + h * dv;
      deltanet_step(s.ssm.data() + static_cast<int64_t>(h) * dk * dv, q + kh * dk, k + kh * dk, v + h * dv, g,
                    beta, dk, dv, o);
      // Gated RMSNorm: normalise, scale by the weight, multiply by silu(z).
      rmsnorm(o, w.norm.data(), c.rms_eps, dv, o);
      const float* z = Z.data() + static_cast<int64_t>(t) * v_dim + h * dv;
      for (int j = 0; j < dv; ++j) o[j] *= siluf(z[j]);
    }
  }
  project(w.out, O.data(), n, out);
}

}  // namespace strata
