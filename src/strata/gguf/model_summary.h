// Byte accounting of a model's tensors: routed experts (what the hot/cold expert cache moves between
// GPU and CPU) versus everything else, per layer. Used by `strata inspect` and the VRAM budget.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "strata/gguf/gguf.h"

namespace strata {

struct TensorClass {
  int layer = -1;              // N of "blk.N.", -1 for tensors outside the layers (token_embd, output, ...)
  bool routed_expert = false;  // blk.N.ffn_{gate,up,down,gate_up}_exps*
};

// Classifies a tensor by its name.
TensorClass classify_tensor(std::string_view name);

struct LayerBytes {
  int layer = 0;
  uint64_t expert_bytes = 0;      // all routed-expert tensors of the layer
  uint64_t other_bytes = 0;       // attention, norms, router, shared expert, ...
  int64_t n_expert = 0;           // experts in the layer (the last dimension of its expert tensors), 0 if none
  uint64_t bytes_per_expert = 0;  // bytes one expert occupies (sum over its gate/up/down slices)
};

struct ModelBytes {
  std::vector<LayerBytes> layers;   // ascending by layer index; only layers that have tensors
  uint64_t non_layer_bytes = 0;     // tensors outside blk.N (embeddings, output head, final norm)
  uint64_t expert_bytes = 0;        // total routed-expert bytes
  uint64_t other_bytes = 0;         // total of everything else (including non_layer_bytes)
  uint64_t total_bytes() const { return expert_bytes + other_bytes; }
};

// Sums tensor bytes by category. Throws strata::Error when expert tensors of one layer disagree
// on the number of experts (the per-expert size would be meaningless).
ModelBytes summarize_bytes(const std::vector<GgufTensorInfo>& tensors);

}  // namespace strata
