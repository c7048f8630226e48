#include "strata/engine/sequence_state.h"

#include <algorithm>

#include "strata/base/error.h"

namespace strata {

int64_t attention_cache_rows(const ModelConfig& c, int il, int max_ctx, int sliding_forward) {
  const LayerSpec& l = c.layer(il);
  if (l.mixer != LayerKind::SlidingAttention) return max_ctx;
  return std::min<int64_t>(max_ctx, static_cast<int64_t>(l.window) + sliding_forward - 1);
}

int forward_token_limit(const ModelConfig& c, int max_ctx, int sliding_forward) {
  for (int il = 0; il < c.n_layer; ++il)
    if (attention_cache_rows(c, il, max_ctx, sliding_forward) < max_ctx) return std::min(max_ctx, sliding_forward);
  return max_ctx;
}

uint64_t kv_cache_bytes(const ModelConfig& c, const KvCacheTypes& types, int max_ctx, int sliding_forward) {
  uint64_t n = 0;
  for (int il = 0; il < c.n_layer; ++il) {
    if (!is_attention(c.mixer(il))) continue;
    const auto rows = static_cast<uint64_t>(attention_cache_rows(c, il, max_ctx, sliding_forward));
    n += kv_layer_row_bytes(c, il, types) * rows;
  }
  return n;
}

SequenceState::SequenceState(const ModelConfig& c, int max_ctx_, KvCacheTypes kv_types_, int sliding_forward)
    : max_ctx(max_ctx_), kv_types(kv_types_) {
  if (max_ctx <= 0) fail("context size must be positive, got ", max_ctx);
  if (sliding_forward < 1) fail("a forward must be allowed at least one token, got ", sliding_forward);
  forward_limit = forward_token_limit(c, max_ctx, sliding_forward);
  check_kv_types(c, kv_types);
  layers.resize(static_cast<size_t>(c.n_layer));
  for (int il = 0; il < c.n_layer; ++il) {
    LayerState& s = layers[il];
    if (is_attention(c.mixer(il))) {
      const int64_t per_pos = static_cast<int64_t>(c.layer(il).n_head_kv) * c.head_dim;
      s.kv = kv_types;
      s.k_row = kv_row_bytes(kv_types.k, per_pos);
      s.v_row = kv_row_bytes(kv_types.v, per_pos);
      s.rows = attention_cache_rows(c, il, max_ctx, sliding_forward);
      s.k.assign(s.k_row * static_cast<size_t>(s.rows), 0);
      s.v.assign(s.v_row * static_cast<size_t>(s.rows), 0);
    } else {
      s.conv.assign(static_cast<size_t>(c.ssm_conv_kernel - 1) * c.ssm_conv_channels(), 0.0f);
      s.ssm.assign(static_cast<size_t>(c.ssm_v_heads) * c.ssm_head_k * c.ssm_head_v, 0.0f);
    }
  }
}

void SequenceState::reset() {
  n_past = 0;
  has_pending = false;
  // The KV cache needs no clearing: positions >= n_past are never read before being written.
  for (LayerState& s : layers) {
    std::fill(s.conv.begin(), s.conv.end(), 0.0f);
    std::fill(s.ssm.begin(), s.ssm.end(), 0.0f);
    s.last = -1;
  }
}

namespace {
// A layer whose ring is shorter than the context: its rows are reused, so a span keeps the whole ring.
bool is_ring(const LayerState& s, int max_ctx) { return s.rows > 0 && s.rows < max_ctx; }
}  // namespace

void SequenceState::save_span(int begin, StateSpan& out) const {
  if (has_pending) fail("cannot save a sequence's state while tokens are pending");
  if (begin < 0 || begin > n_past) fail("a saved span must begin within 0..", n_past, ", got ", begin);
  out.begin = begin;
  out.end = n_past;
  out.layers.assign(layers.size(), {});
  for (size_t il = 0; il < layers.size(); ++il) {
    const LayerState& s = layers[il];
    StateSpan::Layer& o = out.layers[il];
    if (s.rows > 0) {
      o.first = is_ring(s, max_ctx) ? static_cast<int>(std::max<int64_t>(0, n_past - s.rows)) : begin;
      for (int pos = o.first; pos < n_past; ++pos) {
        const size_t row = static_cast<size_t>(pos % s.rows);
        o.k.insert(o.k.end(), s.k.begin() + row * s.k_row, s.k.begin() + (row + 1) * s.k_row);
        o.v.insert(o.v.end(), s.v.begin() + row * s.v_row, s.v.begin() + (row + 1) * s.v_row);
      }
    } else {
      o.conv = s.conv;
      o.ssm = s.ssm;
    }
  }
}

void SequenceState::restore(const StateSpan* const* spans, int n) {
  if (has_pending) fail("cannot restore a sequence's state while tokens are pending");
  if (n < 1) fail("restoring a sequence needs at least one span");
  int at = 0;
  for (int i = 0; i < n; ++i) {
    const StateSpan& sp = *spans[i];
    if (sp.begin != at || sp.end < sp.begin) fail("restored spans must follow each other from position 0");
    if (sp.layers.size() != layers.size()) fail("a restored span has ", sp.layers.size(), " layers, the sequence ", layers.size());
    for (size_t il = 0; il < layers.size(); ++il) {
      const LayerState& s = layers[il];
      const StateSpan::Layer& o = sp.layers[il];
      const size_t rows = static_cast<size_t>(sp.end - o.first);
      const bool shaped = s.rows > 0 ? (o.first >= 0 && o.first <= sp.end && o.k.size() == rows * s.k_row &&
                                        o.v.size() == rows * s.v_row)
                                     : (o.conv.size() == s.conv.size() && o.ssm.size() == s.ssm.size());
      if (!shaped) fail("a restored span does not fit layer ", il, " of this sequence");
    }
    at = sp.end;
  }
  if (at > max_ctx) fail("restored spans hold ", at, " tokens, more than the context of ", max_ctx);
  for (int i = 0; i < n; ++i) {
    const StateSpan& sp = *spans[i];
    const bool last = i == n - 1;
    for (size_t il = 0; il < layers.size(); ++il) {
      LayerState& s = layers[il];
      const StateSpan::Layer& o = sp.layers[il];
      if (s.rows > 0) {
        // A ring's rows all come from the last span (it holds the whole ring as of the end).
        if (is_ring(s, max_ctx) && !last) continue;
        for (int pos = o.first; pos < sp.end; ++pos) {
          const size_t row = static_cast<size_t>(pos % s.rows), j = static_cast<size_t>(pos - o.first);
          std::copy_n(o.k.begin() + j * s.k_row, s.k_row, s.k.begin() + row * s.k_row);
          std::copy_n(o.v.begin() + j * s.v_row, s.v_row, s.v.begin() + row * s.v_row);
        }
      } else if (last) {
        s.conv = o.conv;
        s.ssm = o.ssm;
      }
    }
  }
  for (LayerState& s : layers) s.last = -1;
  n_past = at;
}

}  // namespace strata
