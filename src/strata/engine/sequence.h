// One sequence being run through a model, whatever computes it: the CPU engine (Session) or a GPU
// session (strata/cuda/gpu_session.h). The generation loop and the front ends (run, chat, serve, logits)
// talk to this interface, so every backend gets the same sampling, stop strings and token healing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/base/error.h"
#include "strata/engine/hidden_record.h"
#include "strata/engine/model.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/routing_trace.h"
#include "strata/engine/state_span.h"
#include "strata/sample/sampler.h"

namespace strata {

class MtpHead;  // engine/mtp.h
class DFlashHead;  // engine/dflash.h
class DFlashModel;

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
  // Runs n tokens after the kept ones and leaves them pending, for verifying drafted tokens: a chain
  // (parents == nullptr) or a token tree (parents[t] < t is the index of token t's parent, -1 for a child
  // of the kept tokens; token t sits at position n_past() + depth(t) and attends to the kept tokens and
  // its ancestors only; engine/token_tree.h). logits_out receives [n x n_vocab] floats. n_past() does not
  // move until keep(); forward, decode and the other calls fail while tokens are pending. Fails like
  // forward() (state unchanged) on bad ids, a bad tree or too long a context.
  virtual void forward_pending(const int32_t* tokens, int n, const int* parents, float* logits_out) {
    (void)tokens, (void)n, (void)parents, (void)logits_out;
    fail("this backend cannot run pending tokens (forward_pending)");
  }
  // forward_pending (a chain, or a tree by parents) for a plain greedy verification: instead of logits,
  // picks[t] = the arg-max of token t's logits over ids < n_allowed (argmax_logit: the lowest id among
  // equals; fails when none is finite). This default picks on the host; a backend may pick on its device
  // (no logits copy).
  virtual void forward_pending_picks(const int32_t* tokens, int n, const int* parents, int32_t n_allowed,
                                     int32_t* picks) {
    check_pick_range(n_allowed);
    const int32_t n_vocab = static_cast<int32_t>(model().config().n_vocab);
    std::vector<float> logits(static_cast<size_t>(n > 0 ? n : 0) * static_cast<size_t>(n_vocab));
    forward_pending(tokens, n, parents, logits.data());
    try {
      for (int t = 0; t < n; ++t) {
        float* row = logits.data() + static_cast<size_t>(t) * static_cast<size_t>(n_vocab);
        ban_ids_from(row, n_allowed, n_vocab);
        picks[t] = argmax_logit(row, n_vocab);
      }
    } catch (...) {  // no finite logit: nothing stays pending, as when a backend picks on its device
      keep(nullptr, 0);
      throw;
    }
  }
  // Keeps the root path path[0..m) of the pending tokens (path[0] a root, each entry a child of the one
  // before; m == 0 keeps none) and drops the rest: the sequence is then as if those m tokens had run
  // through forward() (exactly on the CPU; the GPU keeps the state its pending forward computed, which
  // differs from a forward of the m tokens by rounding). Fails, keeping everything pending, on a path
  // that is not a root path.
  virtual void keep(const int* path, int m) {
    (void)path, (void)m;
    fail("this backend cannot keep pending tokens");
  }
  virtual bool has_pending() const { return false; }
  // keep() of the first m pending tokens of a chain.
  void keep_first(int m) {
    std::vector<int> path(static_cast<size_t>(m > 0 ? m : 0));
    for (int j = 0; j < m; ++j) path[static_cast<size_t>(j)] = j;
    keep(path.data(), m);
  }
  // Prompt cache (engine/prompt_cache.h): save_span copies the state from position `begin` to n_past()
  // to host memory, restore_spans replaces the state by a chain of spans from position 0 (checked
  // before anything changes). Backends that cannot copy their state say so in can_save_state().
  virtual bool can_save_state() const { return false; }
  virtual void save_span(int begin, StateSpan& out) const {
    (void)begin, (void)out;
    fail("this backend cannot save its sequence state (the prompt cache is not available on it)");
  }
  virtual void restore_spans(const StateSpan* const* spans, int n) {
    (void)spans, (void)n;
    fail("this backend cannot restore a sequence state (the prompt cache is not available on it)");
  }
  virtual void reset() = 0;
  virtual int n_past() const = 0;
  virtual int max_ctx() const = 0;
  virtual const Model& model() const = 0;
  // Routing statistics (issue 8): while counts is set, every forward's router selections and token
  // count reach *counts (an empty table is sized to the model; another shape fails) by the next
  // flush_routing_counts() (a backend may count on its device and add in batches) or when counting is
  // turned off (nullptr) or moved to another table. The caller owns *counts and reads it after a flush.
  // Backends that cannot count say so instead of leaving the table silently empty.
  virtual void set_routing_counts(RoutingCounts* counts) {
    if (counts) fail("this backend does not count routes (routing statistics / --profile are not available on it)");
  }
  virtual void flush_routing_counts() {}
  // Routing trace (--collect-routing): while set, every kept token's picks per layer are appended to
  // *trace as records of `stream` (engine/routing_trace.h), pending tokens once kept. The caller owns
  // the writer; calling again with another stream starts the next request's records. Backends that
  // cannot record say so.
  virtual void set_routing_trace(RoutingTraceWriter* trace, uint32_t stream) {
    (void)stream;
    if (trace) fail("this backend does not record routing traces (--collect-routing is not available on it)");
  }
  // Replayed routing (bench --routing): while set, every token's expert picks come from *source instead
  // of the router's top-k (weights: the router's probabilities of the replayed ids). The caller owns it.
  virtual void set_routing_replay(RoutingSource* source) {
    if (source) fail("this backend cannot replay routing (--routing is not available on it)");
  }
  // While set, every kept token's final hidden state (or, with record->layers, its layer taps) is
  // appended to *record (engine/hidden_record.h); a reset or restore restarts it, and so does setting
  // another record (the same one again keeps it). Shared so either side may go first. Backends that
  // cannot say so.
  virtual void set_hidden_record(std::shared_ptr<HiddenRecord> record) {
    if (record) fail("this backend does not give its hidden states (--spec mtp and dflash need them)");
  }
  // The MTP head computed where this sequence computes, with a cache of max_ctx positions; null when
  // the CPU's head serves (why_cpu then says why, or stays empty where the CPU is this backend).
  virtual std::unique_ptr<MtpHead> make_mtp_head(int max_ctx, std::string& why_cpu);
  // A DFlash drafter's context and block computed where this sequence computes, positions below
  // max_ctx; null when the CPU's serves (why_cpu as make_mtp_head's).
  virtual std::unique_ptr<DFlashHead> make_dflash_head(const DFlashModel& drafter, int max_ctx, std::string& why_cpu);

 protected:
  // forward_pending_picks' n_allowed: 1..n_vocab, or fails naming it.
  void check_pick_range(int32_t n_allowed) const {
    const int64_t n_vocab = model().config().n_vocab;
    if (n_allowed <= 0 || n_allowed > n_vocab) fail("forward_pending_picks: ", n_allowed, " allowed ids of ", n_vocab);
  }
};

}  // namespace strata
