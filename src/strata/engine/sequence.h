// One sequence being run through a model, whatever computes it: the CPU engine (Session) or a GPU
// session (strata/cuda/gpu_session.h). The generation loop and the front ends (run, chat, serve, logits)
// talk to this interface, so every backend gets the same sampling, stop strings and token healing.
#pragma once

#include <cstdint>

#include "strata/engine/model.h"

namespace strata {

class Sequence {
 public:
  virtual ~Sequence() = default;
  // Runs n tokens after the ones already seen (prefill when n > 1, decode when n == 1).
  // logits_out receives [n x n_vocab] floats when all_positions, else [n_vocab] for the last token.
  // Fails (strata::Error) when the tokens would exceed the context or an id is out of range; the
  // state is unchanged then.
  virtual void forward(const int32_t* tokens, int n, float* logits_out, bool all_positions) = 0;
  virtual void reset() = 0;
  virtual int n_past() const = 0;
  virtual int max_ctx() const = 0;
  virtual const Model& model() const = 0;
};

}  // namespace strata
