// Small float32 CPU operations the forward passes are written in: norms, rotary embedding, attention
// over a KV cache, the gated DeltaNet recurrence, causal conv1d with a rolling state, activations and
// routing. Every function works on one token (or one head) at a time and is plain scalar code the
// compiler vectorises; the heavy products live in matmul.h.
//
// Conventions (checked against Hugging Face transformers, models/qwen3_moe and models/qwen3_5_moe):
// - RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.
// - NEOX rotary: dims i and i + rot/2 form a pair (i < rot/2); frequency base^(-2i/rot); dims >= rot
//   are left as they are (partial rotary).
// - L2 norm (DeltaNet q/k): x / sqrt(sum(x^2) + eps).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/quant/types.h"

namespace strata {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for i < n. out may alias x.
void rmsnorm(const float* x, const float* w, float eps, int64_t n, float* out);

// x /= sqrt(sum(x^2) + eps), in place.
void l2norm_inplace(float* x, int64_t n, float eps);

// Rotates the first `rot_dims` dims of one head vector x (head_dim long) for position `pos`, NEOX pairing.
void rope_neox_inplace(float* x, int rot_dims, int64_t pos, float freq_base);

// YaRN rotary scaling (Peng et al. 2023, "YaRN: Efficient Context Window Extension"): pair i's inverse
// frequency blends the interpolated 1 / (factor * base^(2i/d)) and the original 1 / base^(2i/d) by a
// ramp that is 1 (original) for pairs below `low` and 0 (interpolated) above `high`, where low/high
// are the pairs that turn beta_fast / beta_slow times within the original context (floor / ceil,
// clamped to [0, d/2 - 1]); cos and sin are multiplied by mscale.
struct RopeYarn {
  float factor = 1.0f;  // 1: no scaling (rope_neox_inplace)
  int orig_ctx = 0;     // the context the model was trained at before scaling
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  float mscale = 1.0f;  // 0.1 * ln(factor) + 1 unless the file says otherwise
  bool on() const { return factor != 1.0f; }
};
void rope_neox_yarn_inplace(float* x, int rot_dims, int64_t pos, float freq_base, const RopeYarn& y);

// One position's rotary cos/sin (YaRN-scaled when y.on()), computed once for all the heads at that
// position: rope_apply(x, a) after rope_angles(rot_dims, pos, base, y, a) is bitwise
// rope_neox_yarn_inplace(x, rot_dims, pos, base, y).
struct RopeAngles {
  std::vector<float> cos, sin;  // rot_dims / 2 pairs
};
void rope_angles(int rot_dims, int64_t pos, float freq_base, const RopeYarn& y, RopeAngles& a);
void rope_apply(float* x, const RopeAngles& a);

// In-place softmax over n values.
void softmax_inplace(float* x, int64_t n);

inline float sigmoidf(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }
inline float siluf(float x) { return x / (1.0f + __builtin_expf(-x)); }
// softplus as torch computes it: x for x > 20 (where log1p(exp(x)) == x in float), else log1p(exp(x)).
float softplusf(float x);

// out[i] = silu(gate[i]) * up[i].
void swiglu(const float* gate, const float* up, int64_t n, float* out);

// One KV head's keys or values in a cache: row p's head_dim values start at data + p * row_bytes, stored
// as `type` (F32, F16 or Q8_0; a Q8_0 head starts on a block). F32 rows are read in place; others are
// decoded row by row into float first, so the arithmetic after that is the F32 path's.
struct KvHead {
  const uint8_t* data;
  int64_t row_bytes;
  GgmlType type;
};

// A float32 cache's head: position p's values at base + p * stride floats.
inline KvHead f32_kv_head(const float* base, int64_t stride) {
  return {reinterpret_cast<const uint8_t*>(base), stride * static_cast<int64_t>(sizeof(float)), GgmlType::F32};
}

// One query head against n_ctx cached positions of its KV head.
// scores: scratch of n_ctx floats. out: head_dim floats = sum_p softmax(q.k_p * scale)_p v_p.
void attend_one_head(const float* q, KvHead k, KvHead v, int64_t n_ctx, int head_dim, float scale, float* scores,
                     float* out);

// The same over the cache rows rows[0..n_rows) in that order (a token tree's kept prefix and ancestors);
// equal to attend_one_head when rows[p] == p.
void attend_one_head_rows(const float* q, KvHead k, KvHead v, const int32_t* rows, int64_t n_rows, int head_dim,
                          float scale, float* scores, float* out);

// Causal depthwise conv1d for one token over `channels` channels with kernel length K.
// weight[c * K + j]: tap j of channel c; tap K-1 multiplies the current input.
// state: (K-1) x channels, oldest first; the token's input is appended and the oldest dropped.
// out[c] = sum_j weight[c*K+j] * window_j[c] (no activation here).
void conv1d_step(const float* x, const float* weight, int K, int64_t channels, float* state, float* out);
// The same for channels [c0, c1) only (out and state of the others untouched), so threads can share a
// token's channels.
void conv1d_step_channels(const float* x, const float* weight, int K, int64_t channels, int64_t c0, int64_t c1,
                          float* state, float* out);

// One gated delta-rule step for one value head.
// S: dk x dv (row i = key dim i), updated in place: S = exp(g) * S; S += k (beta * (v - S^T k))^T.
// out (dv) = S^T q (after the update). q must already be L2-normalised and scaled; k L2-normalised.
void deltanet_step(float* S, const float* q, const float* k, const float* v, float g, float beta,
                   int dk, int dv, float* out);

// Indices of the k largest values of x[0..n) in descending order (ties: lower index first).
void top_k(const float* x, int n, int k, int* idx);

// The router's choice for one token: softmax of the n_expert logits (in place: they become the
// probabilities), the k most likely (top_k's order and ties), weights renormalised over the k in double
// when norm_topk.
void route_token(float* logits, int n_expert, int k, bool norm_topk, int* ids, float* weights);

// A sigmoid router's scores in place: sigmoid(softcap * tanh(logit / softcap)), or sigmoid(logit) when
// softcap is 0.
void sigmoid_scores_inplace(float* logits, int n_expert, float softcap);
// A sigmoid router's choice for one token (HF LagunaTopKRouter): scores by sigmoid_scores_inplace (logits
// become the scores), the k best of score + bias (bias may be null; ties: lower index first), weights =
// their scores, renormalised over the k in double when norm_topk.
void route_token_sigmoid(float* logits, const float* bias, int n_expert, int k, float softcap, bool norm_topk, int* ids,
                         float* weights);

}  // namespace strata
