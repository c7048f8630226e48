// The DeltaNet value-head order of GGUF files (as llama.cpp's converter writes them).
// HF groups value heads by key head (head g*r + j is value head j of key head g, r = Hv / Hk);
// GGUF files tile them (position j*Hk + g), so value head p uses key head p % Hk.
#pragma once

#include <cstdint>

namespace strata::convert {

// HF (grouped) value-head index stored at GGUF (tiled) position p.
inline int64_t hf_head_for_gguf_position(int64_t p, int64_t n_k_heads, int64_t n_v_heads) {
  const int64_t r = n_v_heads / n_k_heads;
  return (p % n_k_heads) * r + p / n_k_heads;
}

// Same for an element index along an axis made of n_v_heads blocks of head_len elements.
inline int64_t hf_index_for_gguf_index(int64_t i, int64_t head_len, int64_t n_k_heads, int64_t n_v_heads) {
  return hf_head_for_gguf_position(i / head_len, n_k_heads, n_v_heads) * head_len + i % head_len;
}

}  // namespace strata::convert
