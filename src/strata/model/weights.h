// The model's weights bound to the tensors of a memory-mapped GGUF file: every matrix is a
// WeightMatrix view into the mapping (zero-copy, any quant type); small vectors (norm weights,
// DeltaNet gates, conv taps) are decoded to float32 once at load. Plain data, backend-neutral:
// a CUDA backend uploads from the same description.
// Tensor names and shapes: those llama.cpp's GGUF files use (the converter's contract).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/cpu/matmul.h"
#include "strata/model/config.h"

namespace strata {

class GgufFile;

struct AttentionWeights {  // full and sliding-window attention layers
  WeightMatrix q, k, v, o;  // q yields 2*head_dim per head when the config has attn_output_gate
  WeightMatrix gate;        // attn_gate (config attn_gate != None): n_head or n_head*head_dim rows
  std::vector<float> q_norm, k_norm;  // head_dim each
};

struct DeltaNetWeights {  // gated DeltaNet layers (qwen35moe)
  WeightMatrix qkv, gate, beta, alpha, out;  // gate = z projection
  std::vector<float> conv;     // channels x kernel (tap kernel-1 = current token)
  std::vector<float> a;        // per value head: -exp(A_log)
  std::vector<float> dt_bias;  // per value head
  std::vector<float> norm;     // head_v: gated RMSNorm weight (stored as is)
};

// The routed experts (gate, up, down stacks: ExpertFfn, cpu/matmul.h) with the router and the shared expert.
struct MoeWeights : ExpertFfn {
  WeightMatrix router;  // n_expert rows of n_embd
  std::vector<float> selection_bias;  // exp_probs_b (sigmoid routers): n_expert, or empty
  // Shared expert (qwen35moe, laguna); shared_gate_inp (one row of n_embd) when it is gated.
  bool has_shared = false;
  bool shared_gated = false;
  WeightMatrix shared_gate_inp, shared_gate, shared_up, shared_down;
};

struct DenseFfnWeights {  // dense SwiGLU layers: n_ff rows (gate, up), n_embd rows (down)
  WeightMatrix gate, up, down;
};

struct LayerWeights {
  LayerKind kind = LayerKind::FullAttention;
  std::vector<float> attn_norm;  // before attention / DeltaNet
  std::vector<float> ffn_norm;   // before the feed-forward
  AttentionWeights attn;
  DeltaNetWeights deltanet;
  MoeWeights moe;
  DenseFfnWeights dense;
};

// One multi-token-prediction block (blk.N.nextn.*, N >= n_layer, as llama.cpp names them): eh_proj
// takes [enorm(embedding); hnorm(hidden)] (2 n_embd columns, embedding first) to n_embd, then `layer`,
// then shared_head_norm before the output matrix. embed_tokens / head: the block's own tables when the
// file has them (nextn.embed_tokens, nextn.shared_head_head), else the model's.
struct MtpWeights {
  WeightMatrix eh_proj;
  std::vector<float> enorm, hnorm, shared_head_norm;
  WeightMatrix embed_tokens, head;
  LayerWeights layer;
};

struct ModelWeights {
  WeightMatrix token_embd;  // n_vocab rows of n_embd
  WeightMatrix output;      // n_vocab rows of n_embd (token_embd when the file ties them)
  bool tied_output = false;
  std::vector<float> output_norm;
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;  // ModelConfig::n_mtp blocks
};

// Binds every tensor the config needs, checking presence, type support and shape; errors name the
// file and tensor. The GgufFile must outlive the returned views.
ModelWeights bind_model_weights(const GgufFile& file, const ModelConfig& config);

// Total bytes of the tensors bound (for start-up reporting).
size_t weight_bytes(const GgufFile& file);

}  // namespace strata
