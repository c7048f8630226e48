// One sequence being run through a model, whatever computes it: the CPU engine (Session) or a GPU
// session (strata/cuda/gpu_session.h). The generation loop and the front ends (run, chat, serve, logits)
// talk to this interface, so every backend gets the same sampling, stop strings and token healing.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/engine/routing_counts.h"
#include "strata/sample/sampler.h"

namespace strata {

class Sequence {
 public:
  virtual ~Sequence() = default;
  // Runs n tokens after the ones already seen (prefill when n > 1, decode when n == 1).
  // logits_out receives [n x n_vocab] floats when all_positions, else [n_vocab] for the last token.
  // Fails (strata::Error) when the tokens would exceed the context or an id is out of range; the
  // state is unchanged then.
  virtual void forward(const int32_t* tokens, int n, float* logits_out, bool all_positions) = 0;
  // One decode step for `token`, then the next token picked by `sampler` among ids < n_allowed (the
  // ids past it are treated as -inf logits; history is the penalties' window). The same choice as
  // forward() then sampler.sample() on those logits, which is what this default does; a backend may
  // pick on its device instead (the GPU session's arg-max and sampler), saving the logits copy. scratch
  // holds n_vocab floats on return only when the logits went to the host.
  virtual int32_t decode_and_pick(int32_t token, Sampler& sampler, const std::vector<int32_t>& history,
                                  int32_t n_allowed, std::vector<float>& scratch) {
    const int32_t n_vocab = static_cast<int32_t>(model().config().n_vocab);
    scratch.resize(static_cast<size_t>(n_vocab));
    forward(&token, 1, scratch.data(), false);
    ban_ids_from(scratch.data(), n_allowed, n_vocab);
    return sampler.sample(scratch.data(), n_vocab, history);
  }
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
