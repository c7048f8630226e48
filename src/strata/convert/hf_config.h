// Hugging Face config.json of the model families strata converts, reduced to the fields the GGUF
// metadata and the tensor mapping need. Field meanings: transformers' qwen3_moe / qwen3_5_moe / laguna
// configs;
// how they become GGUF keys (the keys llama.cpp's GGUF files use).
#pragma once

#include <string>
#include <vector>

namespace strata::convert {

enum class HfArch { Qwen3Moe, Qwen35Moe, Laguna };

// The end of every refusal of a quantized checkpoint (its config or its tensors).
inline constexpr const char* kNeedUnquantized =
    "strata convert needs an unquantized checkpoint (bf16, f16 or f32 weights)";

// GGUF architecture name ("qwen3moe" / "qwen35moe" / "laguna").
const char* gguf_arch_name(HfArch arch);
// model_type values accepted, for error messages: "qwen3_moe, qwen3_5_moe, qwen3_5_moe_text, laguna".
std::string supported_model_types();

struct HfConfig {
  std::string model_type;  // as written at the top level of config.json
  HfArch arch = HfArch::Qwen3Moe;

  int n_layer = 0;
  int n_embd = 0;
  int n_vocab = 0;
  int n_ctx = 0;  // max_position_embeddings (0 when absent)
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float rms_eps = 1e-6f;
  float rope_theta = 10000.0f;
  int intermediate_size = 0;  // dense FFN size; 0 when the config has none
  bool tie_embeddings = false;

  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  int n_ff_shexp = 0;  // qwen35moe shared expert
  bool norm_topk_prob = true;

  // qwen35moe only.
  int conv_kernel = 0;
  int lin_k_heads = 0;
  int lin_v_heads = 0;
  int lin_k_dim = 0;
  int lin_v_dim = 0;
  int full_attention_interval = 4;
  std::vector<bool> is_full_attention;  // per layer
  float partial_rotary_factor = 0.25f;
  int rope_dims = 0;                     // int(head_dim * partial_rotary_factor) (laguna: full layers)
  std::vector<int> mrope_sections;       // 4 entries
  // Multi-token-prediction layers (mtp_num_hidden_layers; 0 or 1): written after the trunk as
  // blk.n_layer.* with the nextn.* tensors and <arch>.nextn_predict_layers, as llama.cpp writes them.
  int n_mtp = 0;

  // laguna only (rope_theta / rope_dims above: the full-attention layers').
  std::vector<bool> is_sliding;          // per layer: sliding_attention
  std::vector<int> heads_per_layer;      // per layer query heads (num_attention_heads_per_layer)
  int sliding_window = 0;
  float rope_theta_swa = 10000.0f;
  int rope_dims_swa = 0;
  // laguna full-attention layers' YaRN (rope_parameters.full_attention with rope_type yarn): factor 1 =
  // none; attn_factor as llama.cpp stores it (HF's attention_factor / (0.1 ln factor + 1)).
  float yarn_factor = 1.0f;
  int yarn_orig_ctx = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float yarn_attn_factor = 1.0f;
  int n_dense_lead = 0;                  // mlp_layer_types: this many dense layers first, then sparse
  bool gate_per_head = true;             // gating: softplus output gate per head, else per element
  float router_softcap = 0.0f;           // moe_router_logit_softcapping
  float routed_scale = 1.0f;             // moe_routed_scaling_factor
};

// The period P of a layout where layer i is of the special kind exactly when i % P == offset (0 when
// no P <= n_layer describes it). Shared by the qwen35moe (full every P-th, offset P-1) and laguna
// (full every P-th from layer 0) conversions.
int layout_period(const std::vector<bool>& special, bool offset_last);

// Reads <dir>/config.json. A missing file, a model_type not in supported_model_types(), a missing or
// ill-typed field, a quantization_config (a quantized checkpoint), or a layout GGUF cannot express
// (dense layers in a qwen3_moe, qwen3_5 layer_types that no full_attention_interval describes, laguna
// dense layers after a sparse one, rotary scaling) throws strata::Error naming the file and field.
HfConfig load_hf_config(const std::string& dir);

}  // namespace strata::convert
