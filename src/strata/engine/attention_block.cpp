// Softmax attention with GQA over the sequence's KV cache, full or sliding-window.
// qwen3moe: plain. qwen35moe: attn_q yields, per head, head_dim query values then head_dim gate values;
// the attention output is multiplied by sigmoid(gate) before attn_output; rotary covers the first
// rope_dims dims only (HF Qwen3_5MoeAttention, apply_rotary_pos_emb with partial rotary).
// laguna: the output is multiplied by softplus(attn_gate . x) per head or per element (HF
// LagunaAttention); heads, rotary dims and base per layer (LayerSpec).
// Token t of a forward writes its key and value at cache row n_past + t. In a chain it sits at position
// n_past + t and attends to rows 0 .. n_past + t; in a token tree at n_past + depth(t), attending to
// rows 0 .. n_past - 1 and then its ancestors' rows, root first (the order a plain run of that path
// has, so the arithmetic is the same). A sliding-window layer drops the rows whose position is not in
// (pos - window, pos], as HF's sliding mask (kv > q - window) does. Cache rows are taken modulo the
// layer's LayerState::rows: a sliding layer keeps only the window and one forward's tokens, as a ring.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "strata/cpu/ops.h"
#include "strata/engine/blocks.h"
#include "strata/quant/quantize.h"

namespace strata {

void attention_block(const ModelConfig& c, const LayerSpec& l, const AttentionWeights& w, LayerState& s, int n_past,
                     const TokenTree* tree, const float* xn, int n, float* out) {
  const int hd = c.head_dim;
  const int q_stride_head = c.attn_output_gate ? 2 * hd : hd;  // query (+ gate) values per head
  const int q_width = l.n_head * q_stride_head;
  const int kv_width = l.n_head_kv * hd;
  const int o_width = l.n_head * hd;

  std::vector<float> Q(static_cast<size_t>(n) * q_width);
  std::vector<float> K(static_cast<size_t>(n) * kv_width);
  std::vector<float> V(static_cast<size_t>(n) * kv_width);
  std::vector<float> G;  // softplus output gate (laguna)
  std::vector<const WeightMatrix*> ms{&w.q, &w.k, &w.v};
  std::vector<float*> ys{Q.data(), K.data(), V.data()};
  if (c.attn_gate != AttnGate::None) {
    G.resize(static_cast<size_t>(n) * w.gate.n_rows);
    ms.push_back(&w.gate), ys.push_back(G.data());
  }

  const bool chain = !tree || tree->is_chain();
  const GgmlType k_type = kv_ggml_type(s.kv.k), v_type = kv_ggml_type(s.kv.v);
  const int64_t window = l.mixer == LayerKind::SlidingAttention ? l.window : 0;
  auto first_visible = [window](int64_t pos) { return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; };
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(n));
  int gate_per_head = 0;  // gate values per head: 1 (per head) or hd (per element)
  std::vector<float> O(static_cast<size_t>(n) * o_width);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int group = l.n_head / l.n_head_kv;

  // Between the products, run by every thread of a team: one thread prepares, then the heads are shared.
  const auto heads = [&] {
#pragma omp single
    {
      // Normalise and rotate the queries (in place, gate values untouched) and the keys, then append
      // the keys and values to the cache at their positions, in the cache's types.
      std::vector<float> k_row(static_cast<size_t>(kv_width));
      RopeAngles angles;  // the token's position's, shared by its heads
      for (int t = 0; t < n; ++t) {
        const int64_t pos = n_past + (chain ? t : tree->depth(t));
        const int64_t row = (n_past + t) % s.rows;
        rope_angles(l.rope_dims, pos, l.rope_freq_base, l.yarn, angles);
        for (int h = 0; h < l.n_head; ++h) {
          float* q = Q.data() + static_cast<int64_t>(t) * q_width + h * q_stride_head;
          rmsnorm(q, w.q_norm.data(), c.rms_eps, hd, q);
          rope_apply(q, angles);
        }
        for (int g = 0; g < l.n_head_kv; ++g) {
          const float* k = K.data() + static_cast<int64_t>(t) * kv_width + g * hd;
          rmsnorm(k, w.k_norm.data(), c.rms_eps, hd, k_row.data() + g * hd);
          rope_apply(k_row.data() + g * hd, angles);
        }
        quantize_row(k_type, k_row.data(), s.k.data() + row * static_cast<int64_t>(s.k_row), kv_width);
        quantize_row(v_type, V.data() + static_cast<int64_t>(t) * kv_width,
                     s.v.data() + row * static_cast<int64_t>(s.v_row), kv_width);
      }

      // Causal attention: token t sees positions 0 .. n_past+t (a tree: the kept rows, then its
      // ancestors), a sliding layer only the last `window` of them. The cache rows a token reads,
      // listed where they are not one run: a tree token's (the kept rows, then its ancestors) and a
      // chain token's whose window wraps around the ring. Empty: the chain token reads rows
      // first_row .. first_row + pos - from, through the same code as rows 0..pos.
      for (int t = 0; t < n; ++t) {
        std::vector<int32_t>& r = rows[static_cast<size_t>(t)];
        if (chain) {
          const int64_t pos = n_past + t, from = first_visible(pos);
          if (from % s.rows + (pos - from) >= s.rows)
            for (int64_t p = from; p <= pos; ++p) r.push_back(static_cast<int32_t>(p % s.rows));
          continue;
        }
        const std::vector<int> path = tree->path_to(t);
        // Kept rows sit at their own positions, ancestor a of depth d at n_past + d.
        const int64_t from = first_visible(n_past + static_cast<int64_t>(path.size()) - 1);
        for (int64_t p = from; p < n_past; ++p) r.push_back(static_cast<int32_t>(p % s.rows));
        for (size_t d = 0; d < path.size(); ++d)
          if (n_past + static_cast<int64_t>(d) >= from) r.push_back(static_cast<int32_t>((n_past + path[d]) % s.rows));
      }
      if (c.attn_gate != AttnGate::None) {
        for (float& g : G) g = softplusf(g);
        gate_per_head = c.attn_gate == AttnGate::SoftplusPerHead ? 1 : hd;
      }
    }
    std::vector<float> scores(static_cast<size_t>(n_past + n));
#pragma omp for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < l.n_head; ++h) {
        const int g = h / group;  // GQA: consecutive query heads share a KV head
        const float* q = Q.data() + static_cast<int64_t>(t) * q_width + h * q_stride_head;
        float* o = O.data() + static_cast<int64_t>(t) * o_width + h * hd;
        // Head g's values start g * hd values into a row (check_kv_types keeps them on a block).
        const KvHead kh{s.k.data() + kv_row_bytes(s.kv.k, static_cast<int64_t>(g) * hd),
                        static_cast<int64_t>(s.k_row), k_type};
        const KvHead vh{s.v.data() + kv_row_bytes(s.kv.v, static_cast<int64_t>(g) * hd),
                        static_cast<int64_t>(s.v_row), v_type};
        const std::vector<int32_t>& r = rows[static_cast<size_t>(t)];
        if (r.empty()) {  // the head views moved to the run's first row
          const int64_t pos = n_past + t, from = first_visible(pos), first_row = from % s.rows;
          const KvHead kw{kh.data + first_row * kh.row_bytes, kh.row_bytes, kh.type};
          const KvHead vw{vh.data + first_row * vh.row_bytes, vh.row_bytes, vh.type};
          attend_one_head(q, kw, vw, pos - from + 1, hd, scale, scores.data(), o);
        } else {
          attend_one_head_rows(q, kh, vh, r.data(), static_cast<int64_t>(r.size()), hd, scale, scores.data(), o);
        }
        if (c.attn_output_gate) {
          const float* gate = q + hd;
          for (int d = 0; d < hd; ++d) o[d] *= sigmoidf(gate[d]);
        }
        if (gate_per_head) {
          const float* g = G.data() + static_cast<size_t>(t) * w.gate.n_rows + static_cast<size_t>(h) * gate_per_head;
          for (int d = 0; d < hd; ++d) o[d] *= g[gate_per_head == 1 ? 0 : d];
        }
      }
    }
  };
  if (n == 1) {  // decode: the products and the heads in one region
    project_around(ms.data(), ys.data(), static_cast<int>(ms.size()), xn, heads, w.o, O.data(), out);
    return;
  }
  project_many(ms.data(), ys.data(), static_cast<int>(ms.size()), xn, n);
#pragma omp parallel
  heads();
  project(w.o, O.data(), n, out);
}

void attention_keep(const ModelConfig& c, LayerState& s, int n_past, const int* path, int m) {
  // path is increasing (parents precede children), so row j never overwrites a later source row.
  auto move_row = [&](std::vector<uint8_t>& cache, size_t row_bytes, int j) {
    const size_t from = static_cast<size_t>((n_past + path[j]) % s.rows) * row_bytes;
    const size_t to = static_cast<size_t>((n_past + j) % s.rows) * row_bytes;
    std::copy_n(cache.begin() + static_cast<std::ptrdiff_t>(from), row_bytes, cache.begin() + static_cast<std::ptrdiff_t>(to));
  };
  for (int j = 0; j < m; ++j) {
    if (path[j] == j) continue;
    move_row(s.k, s.k_row, j);
    move_row(s.v, s.v_row, j);
  }
}

}  // namespace strata
