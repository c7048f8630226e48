// Everything a sequence carries between forward calls: per full-attention layer a KV cache sized to
// the session's context, per DeltaNet layer the conv window and the recurrent state, and the position.
#pragma once

#include <vector>

#include "strata/model/config.h"

namespace strata {

struct LayerState {
  // Full attention: [max_ctx x n_head_kv x head_dim] keys (after norm + rotary) and values.
  std::vector<float> k, v;
  // DeltaNet: the previous (kernel-1) conv inputs [(kernel-1) x channels], oldest first,
  // and the recurrent state [v_heads x head_k x head_v].
  std::vector<float> conv;
  std::vector<float> ssm;
};

struct SequenceState {
  int max_ctx = 0;
  int n_past = 0;  // tokens already processed (the next token's position)
  std::vector<LayerState> layers;

  SequenceState() = default;
  SequenceState(const ModelConfig& config, int max_ctx);
  // Back to an empty sequence (caches zeroed, position 0).
  void reset();
};

}  // namespace strata
