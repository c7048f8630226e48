// Everything a sequence carries between forward calls: per attention layer a KV cache (full attention:
// sized to the session's context; sliding window: a ring of the window plus one forward's tokens), per
// DeltaNet layer the conv window and the recurrent state, and the position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/engine/state_span.h"
#include "strata/engine/token_tree.h"
#include "strata/model/config.h"
#include "strata/model/kv_type.h"

namespace strata {

struct LayerState {
  // Attention (full or sliding): `rows` rows of the layer's n_head_kv x head_dim keys (after norm +
  // rotary) and values, each row k_row / v_row bytes in the sequence's cache types (kv, as
  // SequenceState::kv_types). The token at cache index i (its position, or n_past + t while pending)
  // is row i % rows: full attention has max_ctx rows, a sliding layer min(max_ctx, window +
  // SequenceState::forward_limit - 1), enough for a forward's tokens and the window behind them.
  std::vector<uint8_t> k, v;
  size_t k_row = 0, v_row = 0;
  int64_t rows = 0;
  KvCacheTypes kv;
  // DeltaNet: the previous (kernel-1) conv inputs [(kernel-1) x channels], oldest first,
  // and the recurrent state [v_heads x head_k x head_v].
  std::vector<float> conv;
  std::vector<float> ssm;
  // DeltaNet, while tokens are pending: conv and ssm as they were before them, each pending token's
  // inputs to the recurrence (raw conv input row, beta and alpha pre-activations), and which pending
  // token's root path conv/ssm hold now (-1: none, they equal conv0/ssm0). keep() restores and replays.
  std::vector<float> conv0, ssm0, qkv_in, beta_in, alpha_in;
  int last = -1;
};

// Tokens one forward may add to a sequence of a model with sliding-window layers by default: their
// rings hold the window plus this many tokens (longer prompts run in pieces of this size).
constexpr int kSlidingForwardTokens = 512;

// Cache rows of attention layer il, on every backend: max_ctx, or for a sliding layer whose ring is
// shorter than the context, window + sliding_forward - 1 (position p in row p % rows).
int64_t attention_cache_rows(const ModelConfig& c, int il, int max_ctx, int sliding_forward = kSlidingForwardTokens);
// The most tokens one forward may add: max_ctx, or sliding_forward when some layer is such a ring.
int forward_token_limit(const ModelConfig& c, int max_ctx, int sliding_forward = kSlidingForwardTokens);
// K and V bytes of one sequence's attention caches for a context of max_ctx tokens, as the backends
// allocate them: attention_cache_rows rows per attention layer, so a sliding layer costs its ring.
uint64_t kv_cache_bytes(const ModelConfig& c, const KvCacheTypes& types, int max_ctx,
                        int sliding_forward = kSlidingForwardTokens);

struct SequenceState {
  int max_ctx = 0;
  // The most tokens one forward may run (the sliding layers' rings hold them); max_ctx without sliding
  // layers, or when the rings are the whole context anyway.
  int forward_limit = 0;
  KvCacheTypes kv_types;
  int n_past = 0;  // tokens already processed (the next token's position)
  std::vector<LayerState> layers;
  // A provisional forward's tokens (Sequence::forward_pending) until keep(): pending token t's key and
  // value rows are n_past + t; n_past does not move until keep() chooses a root path.
  bool has_pending = false;
  TokenTree pending;
  // The pending tokens' router picks per layer ([n x k]), counted when keep() keeps them.
  std::vector<std::vector<int>> pending_picks;

  SequenceState() = default;
  // Fails (strata::Error) for cache types the model's heads cannot be stored in (check_kv_types).
  // sliding_forward: forward_limit for the sliding layers' rings (tests make it small to wrap often).
  SequenceState(const ModelConfig& config, int max_ctx, KvCacheTypes kv_types = {},
                int sliding_forward = kSlidingForwardTokens);
  // Back to an empty sequence (caches zeroed, position 0, nothing pending).
  void reset();
  // Prompt cache (engine/prompt_cache.h): copies the state from position `begin` to n_past into `out`
  // (0 <= begin <= n_past, nothing pending).
  void save_span(int begin, StateSpan& out) const;
  // Replaces the state by a chain of spans (the first begins at 0, each begins where the one before
  // ended, all saved from sequences of this shape); n_past becomes the last one's end. Checks
  // everything before changing anything.
  void restore(const StateSpan* const* spans, int n);
};

}  // namespace strata
