// A Session is one sequence being run through a Model: it owns the sequence state (KV cache,
// DeltaNet state, position) and runs forward passes. Not thread-safe; use one Session per sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/engine/model.h"
#include "strata/engine/sequence.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/sequence_state.h"

namespace strata {

struct ForwardPart;

class Session : public Sequence {
 public:
  // max_ctx: the most tokens this sequence may hold (the KV cache is sized to it). kv_types: how the
  // cache stores keys and values; f32 by default here (the exact reference the parity tests compare),
  // while the command line defaults to f16 (cli/backend_cli.h). sliding_forward: the most tokens one
  // forward adds to the sliding-window layers' ring caches (SequenceState; longer prompts run in pieces).
  Session(const Model& model, int max_ctx, KvCacheTypes kv_types = {}, int sliding_forward = kSlidingForwardTokens);

  // Runs n tokens after the ones already seen (prefill when n > 1, decode when n == 1).
  // logits_out receives [n x n_vocab] floats when all_positions, else [n_vocab] for the last token.
  // Fails (strata::Error) when the tokens would exceed the context or an id is out of range;
  // the state is unchanged then.
  void forward(const int32_t* tokens, int n, float* logits_out, bool all_positions) override;

  // Native pending forward: KV rows for every pending token, the DeltaNet state before them kept with
  // each token's recurrence inputs, so keep() moves rows and replays the kept path (no recomputation of
  // projections, attention or experts).
  void forward_pending(const int32_t* tokens, int n, const int* parents, float* logits_out) override;
  void keep(const int* path, int m) override;
  bool has_pending() const override { return state_.has_pending; }

  void reset() override {
    state_.reset();
    if (hidden_) hidden_->restart(0);
  }
  bool can_save_state() const override { return true; }
  void save_span(int begin, StateSpan& out) const override { state_.save_span(begin, out); }
  void restore_spans(const StateSpan* const* spans, int n) override {
    state_.restore(spans, n);
    if (hidden_) hidden_->restart(state_.n_past);  // restored positions have no hidden rows
  }
  int n_past() const override { return state_.n_past; }
  int max_ctx() const override { return state_.max_ctx; }
  const Model& model() const override { return model_; }
  SequenceState& state() { return state_; }

  // Routing statistics (issue 8): while set, every forward adds one pick per (token, chosen expert) and
  // n tokens to *counts. nullptr (the default) turns counting off at no cost. An empty table is sized to
  // the model; a table of another shape is refused. The caller owns it and must keep it alive while set.
  void set_routing_counts(RoutingCounts* counts) override;
  RoutingCounts* routing_counts() const { return routing_counts_; }
  // Both refuse a trace writer or source of another shape than the model's.
  void set_routing_trace(RoutingTraceWriter* trace, uint32_t stream) override;
  void set_routing_replay(RoutingSource* source) override;
  void set_hidden_record(std::shared_ptr<HiddenRecord> record) override;
  // The ForwardPart fields this session's routing options set (counts, trace, replay).
  void attach_routing(ForwardPart& part) const;
  // With a hidden record: points part.hidden at scratch for n rows; after the forward, record_kept
  // appends them (pending ones wait for keep()).
  void attach_hidden(ForwardPart& part, int n);
  void record_kept(const int32_t* tokens, int n);
  // Fails like forward() would on these tokens, changing nothing.
  void check_forward(const int32_t* tokens, int n) const;

 private:
  const Model& model_;
  SequenceState state_;
  RoutingCounts* routing_counts_ = nullptr;
  RoutingTraceWriter* trace_ = nullptr;
  uint32_t trace_stream_ = 0;
  RoutingSource* replay_ = nullptr;
  std::shared_ptr<HiddenRecord> hidden_;
  std::vector<float> hidden_rows_;       // a forward's rows
  std::vector<int> hidden_layers_;       // the record's layers when it was set (empty: final states)
  std::vector<int32_t> pending_tokens_;  // the pending tokens, for keep() to record
};

// One session's tokens in forward_sessions.
struct SessionStep {
  Session* session = nullptr;
  const int32_t* tokens = nullptr;
  int n = 0;
  float* logits = nullptr;  // as Session::forward
  bool all_positions = false;
};

// Several sessions of one model in one batched forward (continuous batching on the CPU: every weight is
// read once for all of them, tokens grouped by expert across sessions). Each session ends as its own
// forward() would leave it, logits bit for bit. Everything is checked first (one model, distinct
// sessions, nothing pending, ids and contexts): on a failure no session changes.
void forward_sessions(SessionStep* steps, int n_steps);

// Greedy continuation: runs the prompt (from the session's current position), then picks the arg-max
// token n_new times (ties: lowest id), feeding each back. Returns the generated ids (prompt excluded).
std::vector<int32_t> generate_greedy(Sequence& session, const std::vector<int32_t>& prompt, int n_new);

// Index of the largest value (lowest index among equals).
int32_t argmax(const float* x, int64_t n);

}  // namespace strata
