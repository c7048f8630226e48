// One forward function per architecture: run n tokens (positions state.n_past ..) through the model,
// update the sequence state, write logits ([n x n_vocab] when all_positions, else [n_vocab] for the last).
// counts (optional): routing picks per (layer, expert) are added to it (n_tokens is the caller's).
#pragma once

#include <cstdint>

#include "strata/engine/model.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/sequence_state.h"

namespace strata {

void forward_qwen3moe(const Model& model, SequenceState& state, const int32_t* tokens, int n, float* logits,
                      bool all_positions, RoutingCounts* counts = nullptr);
void forward_qwen35moe(const Model& model, SequenceState& state, const int32_t* tokens, int n, float* logits,
                       bool all_positions, RoutingCounts* counts = nullptr);

}  // namespace strata
