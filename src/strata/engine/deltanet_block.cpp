// Gated DeltaNet linear attention (qwen35moe), one token at a time through the recurrence
// (HF Qwen3_5MoeGatedDeltaNet + torch_recurrent_gated_delta_rule; facts in model-spec.md):
//   qkv = conv1d_causal(W_qkv x) -> silu -> split q | k | v
//   q, k L2-normalised per head, q scaled by 1/sqrt(head_k)
//   beta = sigmoid(W_b x), g = A * softplus(W_a x + dt_bias) with A = -exp(A_log) (stored as ssm_a)
//   S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q
//   o = rmsnorm(o) * norm_w * silu(z), z = W_z x; out = W_out o
// Value-head order: GGUF files store value heads tiled (value head j of every key group in turn), so
// value head h reads key head h % n_k_heads. With equal head counts the two orders coincide.
// Pending tokens (a token tree) run each from its parent's state: the running state continues along a
// chain and is rebuilt from the state before the tree (conv0/ssm0) by replaying the stored inputs of
// the token's ancestors otherwise. deltanet_keep replays the kept path the same way, so the state
// equals a plain run of that path.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"

namespace strata {
namespace {

// One token through the conv window and the recurrence, from its raw conv input row and its beta /
// alpha pre-activations, as two loops of the calling team (every thread must call it): per key head
// the conv window and silu of its q and k channels and their norms, then per value head the conv and
// silu of its v channels and the recurrence (every value computed as in one pass over them). With
// z_row, o_all receives the head outputs after the gated RMSNorm (z_row: the gate).
void token_steps(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const float* qkv_row,
                 const float* b_row, const float* a_row, const float* z_row, float* o_all, float* mixed) {
  const int nk = c.ssm_k_heads, nv = c.ssm_v_heads, dk = c.ssm_head_k, dv = c.ssm_head_v;
  const int channels = c.ssm_conv_channels();
  const int key_dim = nk * dk;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  float* q = mixed;
  float* k = mixed + key_dim;
  const float* v = mixed + 2 * key_dim;
  const auto conv_silu = [&](int c0, int c1) {
    conv1d_step_channels(qkv_row, w.conv.data(), c.ssm_conv_kernel, channels, c0, c1, s.conv.data(), mixed);
    for (int i = c0; i < c1; ++i) mixed[i] = siluf(mixed[i]);
  };
#pragma omp for schedule(static)
  for (int h = 0; h < nk; ++h) {
    conv_silu(h * dk, (h + 1) * dk);
    conv_silu(key_dim + h * dk, key_dim + (h + 1) * dk);
    l2norm_inplace(q + h * dk, dk, 1e-6f);
    l2norm_inplace(k + h * dk, dk, 1e-6f);
    for (int i = 0; i < dk; ++i) q[h * dk + i] *= q_scale;
  }
#pragma omp for schedule(static)
  for (int h = 0; h < nv; ++h) {
    conv_silu(2 * key_dim + h * dv, 2 * key_dim + (h + 1) * dv);
    const int kh = h % nk;
    const float beta = sigmoidf(b_row[h]);
    const float g = w.a[h] * softplusf(a_row[h] + w.dt_bias[h]);
    float* o = o_all + static_cast<int64_t>(h) * dv;
    deltanet_step(s.ssm.data() + static_cast<int64_t>(h) * dk * dv, q + kh * dk, k + kh * dk, v + h * dv, g, beta, dk,
                  dv, o);
    if (!z_row) continue;
    // Gated RMSNorm: normalise, scale by the weight, multiply by silu(z).
    rmsnorm(o, w.norm.data(), c.rms_eps, dv, o);
    const float* z = z_row + static_cast<int64_t>(h) * dv;
    for (int j = 0; j < dv; ++j) o[j] *= siluf(z[j]);
  }
}

// token_steps in a parallel region of its own. Without out, the head outputs are discarded.
void deltanet_token(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const float* qkv_row,
                    const float* b_row, const float* a_row, const float* z_row, float* out, std::vector<float>& mixed) {
  mixed.resize(static_cast<size_t>(c.ssm_conv_channels()));
  std::vector<float> discard;
  if (!out) discard.resize(static_cast<size_t>(c.ssm_v_heads) * c.ssm_head_v);
  float* o_all = out ? out : discard.data();
#pragma omp parallel
  token_steps(c, w, s, qkv_row, b_row, a_row, z_row, o_all, mixed.data());
}

// Advances the state by pending token t's stored inputs (no output).
void replay_token(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, int t, std::vector<float>& mixed) {
  const size_t channels = static_cast<size_t>(c.ssm_conv_channels()), nv = static_cast<size_t>(c.ssm_v_heads);
  const size_t i = static_cast<size_t>(t);
  deltanet_token(c, w, s, s.qkv_in.data() + i * channels, s.beta_in.data() + i * nv, s.alpha_in.data() + i * nv,
                 nullptr, nullptr, mixed);
}

}  // namespace

void deltanet_block(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const TokenTree* pending,
                    const float* xn, int n, float* out) {
  const int nv = c.ssm_v_heads, dv = c.ssm_head_v;
  const int channels = c.ssm_conv_channels();
  const int v_dim = nv * dv;

  std::vector<float> QKV(static_cast<size_t>(n) * channels);
  std::vector<float> Z(static_cast<size_t>(n) * v_dim);
  std::vector<float> B(static_cast<size_t>(n) * nv);
  std::vector<float> A(static_cast<size_t>(n) * nv);
  std::vector<float> mixed(static_cast<size_t>(channels));
  std::vector<float> O(static_cast<size_t>(n) * v_dim);
  const WeightMatrix* ms[] = {&w.qkv, &w.gate, &w.beta, &w.alpha};
  float* ys[] = {QKV.data(), Z.data(), B.data(), A.data()};
  if (n == 1 && !pending) {  // decode: the products and the token's steps in one region
    project_around(
        ms, ys, 4, xn, [&] { token_steps(c, w, s, QKV.data(), B.data(), A.data(), Z.data(), O.data(), mixed.data()); },
        w.out, O.data(), out);
    return;
  }
  project_many(ms, ys, 4, xn, n);

  if (pending) {  // deltanet_keep restores and replays: keep the state before and every token's inputs
    s.conv0 = s.conv;
    s.ssm0 = s.ssm;
    s.qkv_in = QKV;
    s.beta_in = B;
    s.alpha_in = A;
    s.last = -1;
  }
  for (int t = 0; t < n; ++t) {
    if (pending && pending->parent(t) != s.last) {  // another branch: rebuild the parent's state
      s.conv = s.conv0;
      s.ssm = s.ssm0;
      const int p = pending->parent(t);
      if (p >= 0)
        for (int a : pending->path_to(p)) replay_token(c, w, s, a, mixed);
    }
    const int64_t i = t;
    deltanet_token(c, w, s, QKV.data() + i * channels, B.data() + i * nv, A.data() + i * nv, Z.data() + i * v_dim,
                   O.data() + i * v_dim, mixed);
    if (pending) s.last = t;
  }
  project(w.out, O.data(), n, out);
}

void deltanet_keep(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const int* path, int m) {
  if (m > 0 && s.last == path[m - 1]) return;  // the state holds that token's root path already
  s.conv = s.conv0;
  s.ssm = s.ssm0;
  std::vector<float> mixed;
  for (int j = 0; j < m; ++j) replay_token(c, w, s, path[j], mixed);
  s.last = m > 0 ? path[m - 1] : -1;
}

}  // namespace strata
