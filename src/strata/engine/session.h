// A Session is one sequence being run through a Model: it owns the sequence state (KV cache,
// DeltaNet state, position) and runs forward passes. Not thread-safe; use one Session per sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/engine/model.h"
#include "strata/engine/sequence_state.h"

namespace strata {

class Session {
 public:
  // max_ctx: the most tokens this sequence may hold (the KV cache is sized to it).
  Session(const Model& model, int max_ctx);

  // Runs n tokens after the ones already seen (prefill when n > 1, decode when n == 1).
  // logits_out receives [n x n_vocab] floats when all_positions, else [n_vocab] for the last token.
  // Fails (strata::Error) when the tokens would exceed the context or an id is out of range;
  // the state is unchanged then.
  void forward(const int32_t* tokens, int n, float* logits_out, bool all_positions);

  void reset() { state_.reset(); }
  int n_past() const { return state_.n_past; }
  int max_ctx() const { return state_.max_ctx; }
  const Model& model() const { return model_; }
  SequenceState& state() { return state_; }

 private:
  const Model& model_;
  SequenceState state_;
};

// Greedy continuation: runs the prompt (from the session's current position), then picks the arg-max
// token n_new times (ties: lowest id), feeding each back. Returns the generated ids (prompt excluded).
std::vector<int32_t> generate_greedy(Session& session, const std::vector<int32_t>& prompt, int n_new);

// Index of the largest value (lowest index among equals).
int32_t argmax(const float* x, int64_t n);

}  // namespace strata
