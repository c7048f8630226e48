// One sequence being run through a model, whatever computes it: the CPU engine (Session) or a GPU
// session (strata/cuda/gpu_session.h). The generation loop and the front ends (run, chat, serve, logits)
// talk to this interface, so every backend gets the same sampling, stop strings and token healing.
#pragma once

#include <cstdint>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/routing_counts.h"

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
  // Routing statistics (issue 8): while counts is set, every forward adds its router selections and
  // its token count into *counts (an empty table is sized to the model; another shape fails).
  // nullptr turns counting off. The caller owns *counts and reads it between forwards.
  // Backends that cannot count say so instead of leaving the table silently empty.
  virtual void set_routing_counts(RoutingCounts* counts) {
    if (counts) fail("this backend does not count routes (routing statistics / --profile are not available on it)");
  }
};

}  // namespace strata
