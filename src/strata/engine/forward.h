// The CPU forward pass: runs the model's layer program (ModelConfig::layers, set by the architecture
// files in model/arch_*.cpp) over n tokens:
//   x = embed(tokens)
//   per layer: x += mixer(rmsnorm(x, attn_norm));  x += ffn(rmsnorm(x, ffn_norm))
//   logits = lm_head(rmsnorm(x, output_norm))
#pragma once

#include <cstdint>

#include "strata/engine/model.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/routing_trace.h"
#include "strata/engine/sequence_state.h"
#include "strata/engine/token_tree.h"

namespace strata {

// One sequence's part of a batched forward: its state, its tokens (consecutive rows of the batch), their
// shape (pending == nullptr: a chain, kept at once; otherwise their tree, left pending until
// keep_pending), where its logits go ([n x n_vocab] when all_positions, else the last token's) and its
// routing counts (optional; n_tokens is the caller's; pending parts keep their picks for keep_pending),
// its routing trace (optional: a chain's picks are appended as one record of stream trace_stream; a
// pending part's are appended by keep_pending for the kept tokens) and its replayed routing (optional:
// replay->next() gives the part's picks, which replace the router's top-k; engine/routing_trace.h).
struct ForwardPart {
  SequenceState* state = nullptr;
  const int32_t* tokens = nullptr;
  int n = 0;
  const TokenTree* pending = nullptr;
  float* logits = nullptr;
  bool all_positions = false;
  RoutingCounts* counts = nullptr;
  RoutingTraceWriter* trace = nullptr;
  uint32_t trace_stream = 0;
  RoutingSource* replay = nullptr;
  float* hidden = nullptr;  // optional: [n x n_embd] final hidden states (after the output norm), or
                            // with hidden_layers [n x L x n_embd]: each row's stream after those layers
  const std::vector<int>* hidden_layers = nullptr;
};

// Runs every part in one pass over the layers: norms, projections and experts over all rows at once (each
// weight read once for the whole batch, tokens grouped by expert across sequences), attention and
// DeltaNet per sequence over its own state. Each part ends exactly as forward_model on it alone would
// leave it (the row arithmetic does not depend on the batch). The states must be distinct.
void forward_batch(const Model& model, ForwardPart* parts, int n_parts);

// Runs tokens[0..n) after state.n_past kept tokens. pending == nullptr: a chain, kept at once
// (state.n_past += n). Otherwise the tokens' tree (a chain or not): they stay pending in state until
// keep_pending. logits: [n x n_vocab] when all_positions, else [n_vocab] for the last token.
// counts (optional): routing picks per (layer, expert) are added to it (n_tokens is the caller's); a
// pending forward keeps its picks for keep_pending instead, which counts the kept tokens only.
void forward_model(const Model& model, SequenceState& state, const int32_t* tokens, int n, const TokenTree* pending,
                   float* logits, bool all_positions, RoutingCounts* counts = nullptr);
// The same with every ForwardPart field (trace, replay) the caller sets; state, tokens, n, pending,
// logits and all_positions as given in `part`.
void forward_part(const Model& model, ForwardPart part);

// Keeps the root path path[0..m) of the pending tokens (checked against their tree) and drops the
// rest: the state then equals running those m tokens as a chain. counts (optional): the kept tokens'
// picks are added to it, and m to its n_tokens. trace (optional): the kept tokens' picks are appended
// as one record of `stream`.
void keep_pending(const Model& model, SequenceState& state, const int* path, int m, RoutingCounts* counts = nullptr,
                  RoutingTraceWriter* trace = nullptr, uint32_t stream = 0);

}  // namespace strata
