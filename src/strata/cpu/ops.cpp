#include "strata/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "strata/quant/quantize.h"

namespace strata {

void rmsnorm(const float* x, const float* w, float eps, int64_t n, float* out) {
  // Accumulate in double: a row of 2048+ floats summed in float loses a few bits we want to keep
  // when comparing against the HF reference at 1e-4.
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void l2norm_inplace(float* x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss + eps));
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void rope_angles(int rot_dims, int64_t pos, float freq_base, const RopeYarn& y, RopeAngles& a) {
  const int half = rot_dims / 2;
  a.cos.resize(static_cast<size_t>(half));
  a.sin.resize(static_cast<size_t>(half));
  if (!y.on()) {
    for (int i = 0; i < half; ++i) {
      // The angle is computed in double so large positions keep their precision.
      // Like HF: inverse frequency and angle rounded to float32, cos/sin of that angle.
      const float inv_freq = static_cast<float>(std::pow(static_cast<double>(freq_base), -2.0 * i / rot_dims));
      const double angle = static_cast<float>(static_cast<float>(pos) * inv_freq);
      a.cos[static_cast<size_t>(i)] = static_cast<float>(std::cos(angle));
      a.sin[static_cast<size_t>(i)] = static_cast<float>(std::sin(angle));
    }
    return;
  }
  auto corr_pair = [&](float rotations) {
    return static_cast<double>(rot_dims) * std::log(y.orig_ctx / (rotations * 2.0 * M_PI)) /
           (2.0 * std::log(static_cast<double>(freq_base)));
  };
  const double low = std::max(0.0, std::floor(corr_pair(y.beta_fast)));
  const double high = std::min(static_cast<double>(half - 1), std::ceil(corr_pair(y.beta_slow)));
  const double span = std::max(0.001, high - low);
  for (int i = 0; i < half; ++i) {
    // As without YaRN: the inverse frequency and the angle rounded to float32.
    const float pos_freq = static_cast<float>(std::pow(static_cast<double>(freq_base), 2.0 * i / rot_dims));
    const float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / (y.factor * pos_freq);
    const float keep = static_cast<float>(1.0 - std::clamp((i - low) / span, 0.0, 1.0));
    const float inv_freq = interpolated * (1.0f - keep) + extrapolated * keep;
    const double angle = static_cast<float>(static_cast<float>(pos) * inv_freq);
    a.cos[static_cast<size_t>(i)] = static_cast<float>(std::cos(angle)) * y.mscale;
    a.sin[static_cast<size_t>(i)] = static_cast<float>(std::sin(angle)) * y.mscale;
  }
}

void rope_apply(float* x, const RopeAngles& a) {
  const size_t half = a.cos.size();
  for (size_t i = 0; i < half; ++i) {
    const float c = a.cos[i], s = a.sin[i];
    const float u = x[i];
    const float v = x[i + half];
    x[i] = u * c - v * s;
    x[i + half] = v * c + u * s;
  }
}

void rope_neox_inplace(float* x, int rot_dims, int64_t pos, float freq_base) {
  rope_neox_yarn_inplace(x, rot_dims, pos, freq_base, RopeYarn{});
}

void rope_neox_yarn_inplace(float* x, int rot_dims, int64_t pos, float freq_base, const RopeYarn& y) {
  RopeAngles a;
  rope_angles(rot_dims, pos, freq_base, y, a);
  rope_apply(x, a);
}

void softmax_inplace(float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float softplusf(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = siluf(gate[i]) * up[i];
}

namespace {

// Softmax attention of one query head over n_ctx cached rows, row p at cache offset row(p) * stride.
// One body for contiguous caches and for a token tree's ancestor rows, so both round alike.
template <typename Row>
void attend_rows(const float* q, KvHead kc, KvHead vc, int64_t n_ctx, int head_dim, float scale, float* scores,
                 float* out, Row row) {
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(head_dim));
  // Row r of a head as floats: in place for F32, else decoded into buf (valid until the next call).
  auto floats = [&](const KvHead& h, int64_t r) -> const float* {
    const uint8_t* src = h.data + r * h.row_bytes;
    if (h.type == GgmlType::F32) return reinterpret_cast<const float*>(src);
    dequantize_row(h.type, src, buf.data(), head_dim);
    return buf.data();
  };
  for (int64_t p = 0; p < n_ctx; ++p) {
    const float* k = floats(kc, row(p));
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot += q[d] * k[d];
    scores[p] = dot * scale;
  }
  softmax_inplace(scores, n_ctx);
  std::fill(out, out + head_dim, 0.0f);
  for (int64_t p = 0; p < n_ctx; ++p) {
    const float* v = floats(vc, row(p));
    const float a = scores[p];
    for (int d = 0; d < head_dim; ++d) out[d] += a * v[d];
  }
}

}  // namespace

void attend_one_head(const float* q, KvHead k, KvHead v, int64_t n_ctx, int head_dim, float scale, float* scores,
                     float* out) {
  attend_rows(q, k, v, n_ctx, head_dim, scale, scores, out, [](int64_t p) { return p; });
}

void attend_one_head_rows(const float* q, KvHead k, KvHead v, const int32_t* rows, int64_t n_rows, int head_dim,
                          float scale, float* scores, float* out) {
  attend_rows(q, k, v, n_rows, head_dim, scale, scores, out, [rows](int64_t p) { return static_cast<int64_t>(rows[p]); });
}

void conv1d_step(const float* x, const float* weight, int K, int64_t channels, float* state, float* out) {
  conv1d_step_channels(x, weight, K, channels, 0, channels, state, out);
}

void conv1d_step_channels(const float* x, const float* weight, int K, int64_t channels, int64_t c0, int64_t c1,
                          float* state, float* out) {
  for (int64_t c = c0; c < c1; ++c) {
    const float* w = weight + c * K;
    float acc = w[K - 1] * x[c];
    for (int j = 0; j < K - 1; ++j) acc += w[j] * state[j * channels + c];
    out[c] = acc;
    // Shift the window: drop the oldest row, append this token's input.
    for (int j = 0; j + 1 < K - 1; ++j) state[j * channels + c] = state[(j + 1) * channels + c];
    if (K > 1) state[(K - 2) * channels + c] = x[c];
  }
}

void deltanet_step(float* S, const float* q, const float* k, const float* v, float g, float beta,
                   int dk, int dv, float* out) {
  const float decay = std::exp(g);
  // Pass 1 only reads: what the decayed state predicts for k, mem = (decay S)^T k. Pass 2 forms the
  // decayed rows again (the same products, so the same values) and stores each row once.
  thread_local std::vector<float> delta;
  delta.assign(static_cast<size_t>(dv), 0.0f);
  for (int i = 0; i < dk; ++i) {
    const float* row = S + static_cast<int64_t>(i) * dv;
    const float ki = k[i];
    for (int j = 0; j < dv; ++j) delta[j] += row[j] * decay * ki;
  }
  // The delta rule writes only the part of v the state does not already predict, scaled by beta.
  for (int j = 0; j < dv; ++j) delta[j] = beta * (v[j] - delta[j]);
  // Pass 2: S = decay S + k delta^T, and the output o = S^T q from the updated rows.
  for (int j = 0; j < dv; ++j) out[j] = 0.0f;
  for (int i = 0; i < dk; ++i) {
    float* row = S + static_cast<int64_t>(i) * dv;
    const float ki = k[i];
    const float qi = q[i];
    for (int j = 0; j < dv; ++j) {
      row[j] = row[j] * decay + ki * delta[j];
      out[j] += row[j] * qi;
    }
  }
}

void top_k(const float* x, int n, int k, int* idx) {
  // k is small (8): repeated selection is simplest and keeps torch.topk's first-index tie order.
  std::vector<char> taken(static_cast<size_t>(n), 0);
  for (int r = 0; r < k; ++r) {
    int best = -1;
    for (int i = 0; i < n; ++i) {
      if (taken[i]) continue;
      if (best < 0 || x[i] > x[best]) best = i;
    }
    taken[best] = 1;
    idx[r] = best;
  }
}

namespace {

// The chosen experts' weights: their scores, renormalised over the k in double when norm_topk.
void chosen_weights(const float* scores, const int* ids, int k, bool norm_topk, float* weights) {
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += scores[ids[j]];
  for (int j = 0; j < k; ++j) weights[j] = norm_topk ? static_cast<float>(scores[ids[j]] / sum) : scores[ids[j]];
}

}  // namespace

void route_token(float* logits, int n_expert, int k, bool norm_topk, int* ids, float* weights) {
  softmax_inplace(logits, n_expert);
  top_k(logits, n_expert, k, ids);
  chosen_weights(logits, ids, k, norm_topk, weights);
}

void sigmoid_scores_inplace(float* logits, int n_expert, float softcap) {
  for (int e = 0; e < n_expert; ++e) {
    float l = logits[e];
    if (softcap > 0.0f) l = std::tanh(l / softcap) * softcap;
    logits[e] = sigmoidf(l);
  }
}

void route_token_sigmoid(float* logits, const float* bias, int n_expert, int k, float softcap, bool norm_topk, int* ids,
                         float* weights) {
  sigmoid_scores_inplace(logits, n_expert, softcap);
  if (bias) {
    std::vector<float> select(logits, logits + n_expert);
    for (int e = 0; e < n_expert; ++e) select[static_cast<size_t>(e)] += bias[e];
    top_k(select.data(), n_expert, k, ids);
  } else {
    top_k(logits, n_expert, k, ids);
  }
  chosen_weights(logits, ids, k, norm_topk, weights);
}

}  // namespace strata
