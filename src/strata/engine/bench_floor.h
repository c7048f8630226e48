// Bytes a forward pass must read, from the model file, for the bandwidth floors `strata bench` prints
// beside each measurement.
#pragma once

#include <cstdint>

namespace strata {

class GgufFile;
struct ModelConfig;

struct ActiveBytes {
  double dense = 0;         // every non-expert tensor read in full per token (attention, DeltaNet,
                            // norms, router, shared expert), excluding token_embd and output
  double embd_row = 0;      // one row of token_embd per token
  double output = 0;        // lm_head (output.weight, or token_embd when tied)
  double experts_all = 0;   // every routed expert of every layer
  double expert_fraction = 0;  // n_expert_used / n_expert

  // Decode: one token reads dense + one embedding row + lm_head + its share of experts.
  double decode_per_token() const { return dense + embd_row + output + experts_all * expert_fraction; }
  // Prefill of n tokens with logits for the last only: weights read once, the experts any token
  // picks (expected fraction 1 - (1 - k/E)^n under uniform routing), one embedding row per token.
  double prefill(int n_tokens) const;
};

ActiveBytes count_active_bytes(const GgufFile& file, const ModelConfig& config);

}  // namespace strata
