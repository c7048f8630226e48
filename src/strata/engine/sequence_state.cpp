#include "strata/engine/sequence_state.h"

#include <algorithm>

#include "strata/base/error.h"

namespace strata {

SequenceState::SequenceState(const ModelConfig& c, int max_ctx_, KvCacheTypes kv_types_, int sliding_forward)
    : max_ctx(max_ctx_), kv_types(kv_types_) {
  if (max_ctx <= 0) fail("context size must be positive, got ", max_ctx);
  if (sliding_forward < 1) fail("a forward must be allowed at least one token, got ", sliding_forward);
  forward_limit = max_ctx;
  check_kv_types(c, kv_types);
  layers.resize(static_cast<size_t>(c.n_layer));
  for (int il = 0; il < c.n_layer; ++il) {
    LayerState& s = layers[il];
    if (is_attention(c.mixer(il))) {
      const int64_t per_pos = static_cast<int64_t>(c.layer(il).n_head_kv) * c.head_dim;
      s.kv = kv_types;
      s.k_row = kv_row_bytes(kv_types.k, per_pos);
      s.v_row = kv_row_bytes(kv_types.v, per_pos);
      s.rows = max_ctx;
      const LayerSpec& l = c.layer(il);
      if (l.mixer == LayerKind::SlidingAttention && static_cast<int64_t>(l.window) + sliding_forward - 1 < max_ctx) {
        s.rows = static_cast<int64_t>(l.window) + sliding_forward - 1;
        forward_limit = std::min(forward_limit, sliding_forward);
      }
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

}  // namespace strata
