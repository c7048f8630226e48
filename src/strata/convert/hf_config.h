// Hugging Face config.json of the model families strata converts, reduced to the fields the GGUF
// metadata and the tensor mapping need. Field meanings: transformers' qwen3_moe / qwen3_5_moe configs;
// how they become GGUF keys: /work/notes/gguf-naming.md.
#pragma once

#include <string>
#include <vector>

namespace strata::convert {

enum class HfArch { Qwen3Moe, Qwen35Moe };

// GGUF architecture name ("qwen3moe" / "qwen35moe").
const char* gguf_arch_name(HfArch arch);
// model_type values accepted, for error messages: "qwen3_moe, qwen3_5_moe, qwen3_5_moe_text".
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
  int rope_dims = 0;                     // int(head_dim * partial_rotary_factor)
  std::vector<int> mrope_sections;       // 4 entries
};

// Reads <dir>/config.json. A missing file, a model_type not in supported_model_types(), a missing or
// ill-typed field, or a layout strata cannot express (dense layers in a qwen3_moe, layer_types that
// no full_attention_interval describes) throws strata::Error naming the file and field.
HfConfig load_hf_config(const std::string& dir);

}  // namespace strata::convert
