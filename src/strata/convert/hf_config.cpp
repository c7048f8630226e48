#include "strata/convert/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "strata/base/error.h"

namespace strata::convert {

namespace {

using nlohmann::json;

// Field access with errors that name the file and key.
struct Fields {
  const json& j;
  std::string path;

  bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }
  int get_int(const char* key) const {
    if (!has(key)) fail(path, ": missing field '", key, "'");
    if (!j[key].is_number_integer()) fail(path, ": field '", key, "' is not an integer");
    return j[key].get<int>();
  }
  int get_int_or(const char* key, int def) const { return has(key) ? get_int(key) : def; }
  double get_num(const char* key) const {
    if (!has(key)) fail(path, ": missing field '", key, "'");
    if (!j[key].is_number()) fail(path, ": field '", key, "' is not a number");
    return j[key].get<double>();
  }
  bool get_bool_or(const char* key, bool def) const {
    if (!has(key)) return def;
    if (!j[key].is_boolean()) fail(path, ": field '", key, "' is not a boolean");
    return j[key].get<bool>();
  }
};

}  // namespace

const char* gguf_arch_name(HfArch arch) { return arch == HfArch::Qwen3Moe ? "qwen3moe" : "qwen35moe"; }

std::string supported_model_types() { return "qwen3_moe, qwen3_5_moe, qwen3_5_moe_text"; }

HfConfig load_hf_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open (a Hugging Face checkpoint directory needs config.json)");
  json top;
  try {
    top = json::parse(in);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  if (!top.is_object()) fail(path, ": not a JSON object");
  if (!top.contains("model_type") || !top["model_type"].is_string())
    fail(path, ": missing string field 'model_type' (supported: ", supported_model_types(), ")");

  HfConfig c;
  c.model_type = top["model_type"].get<std::string>();
  if (c.model_type == "qwen3_moe") {
    c.arch = HfArch::Qwen3Moe;
  } else if (c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_5_moe_text") {
    c.arch = HfArch::Qwen35Moe;
  } else {
    fail(path, ": model_type '", c.model_type, "' is not supported (supported: ", supported_model_types(), ")");
  }

  // The multimodal wrapper nests the language model's fields in text_config; they win over the top level.
  json merged = top;
  if (top.contains("text_config")) {
    if (!top["text_config"].is_object()) fail(path, ": field 'text_config' is not an object");
    for (auto it = top["text_config"].begin(); it != top["text_config"].end(); ++it) merged[it.key()] = it.value();
  }
  const std::string where = top.contains("text_config") ? path + " (text_config)" : path;
  Fields f{merged, where};

  c.n_layer = f.get_int("num_hidden_layers");
  c.n_embd = f.get_int("hidden_size");
  c.n_vocab = f.get_int("vocab_size");
  c.n_ctx = f.get_int_or("max_position_embeddings", 0);
  c.n_head = f.get_int("num_attention_heads");
  c.n_head_kv = f.get_int_or("num_key_value_heads", c.n_head);
  c.head_dim = f.has("head_dim") ? f.get_int("head_dim") : c.n_embd / c.n_head;
  c.rms_eps = static_cast<float>(f.get_num("rms_norm_eps"));
  c.intermediate_size = f.get_int_or("intermediate_size", 0);
  c.tie_embeddings = f.get_bool_or("tie_word_embeddings", top.value("tie_word_embeddings", false));

  // rope_theta: top level (transformers 4) or inside rope_parameters / rope_scaling (transformers 5).
  const json* rope = nullptr;
  if (merged.contains("rope_parameters") && merged["rope_parameters"].is_object()) rope = &merged["rope_parameters"];
  else if (merged.contains("rope_scaling") && merged["rope_scaling"].is_object()) rope = &merged["rope_scaling"];
  if (f.has("rope_theta")) {
    c.rope_theta = static_cast<float>(f.get_num("rope_theta"));
  } else if (rope != nullptr && rope->contains("rope_theta") && (*rope)["rope_theta"].is_number()) {
    c.rope_theta = (*rope)["rope_theta"].get<float>();
  } else {
    fail(where, ": missing field 'rope_theta' (top level or in rope_parameters)");
  }
  if (rope != nullptr && rope->contains("rope_type") && (*rope)["rope_type"].is_string()) {
    const std::string rt = (*rope)["rope_type"].get<std::string>();
    if (rt != "default" && rt != "mrope")
      fail(where, ": rope_type '", rt, "' (rope scaling) is not supported by strata convert (supported: default)");
  }

  // transformers 5 names the expert count num_local_experts for qwen3_moe; older configs num_experts.
  c.n_expert = f.has("num_local_experts") ? f.get_int("num_local_experts") : f.get_int("num_experts");
  c.n_expert_used = f.get_int("num_experts_per_tok");
  c.n_ff_exp = f.get_int("moe_intermediate_size");
  c.norm_topk_prob = f.get_bool_or("norm_topk_prob", true);

  if (c.arch == HfArch::Qwen3Moe) {
    // Qwen3-MoE may interleave dense MLP layers; strata's qwen3moe has MoE in every layer.
    if (f.has("mlp_only_layers") && f.j["mlp_only_layers"].is_array() && !f.j["mlp_only_layers"].empty())
      fail(where, ": 'mlp_only_layers' is not empty: dense MLP layers are not supported by qwen3moe in strata");
    if (f.get_int_or("decoder_sparse_step", 1) != 1)
      fail(where, ": 'decoder_sparse_step' != 1: dense MLP layers are not supported by qwen3moe in strata");
    return c;
  }

  c.n_ff_shexp = f.get_int("shared_expert_intermediate_size");
  c.conv_kernel = f.get_int("linear_conv_kernel_dim");
  c.lin_k_heads = f.get_int("linear_num_key_heads");
  c.lin_v_heads = f.get_int("linear_num_value_heads");
  c.lin_k_dim = f.get_int("linear_key_head_dim");
  c.lin_v_dim = f.get_int("linear_value_head_dim");
  if (c.lin_k_heads <= 0 || c.lin_v_heads % c.lin_k_heads != 0)
    fail(where, ": linear_num_value_heads (", c.lin_v_heads, ") must be a multiple of linear_num_key_heads (",
         c.lin_k_heads, ")");
  c.full_attention_interval = f.get_int_or("full_attention_interval", 4);
  if (c.full_attention_interval <= 0) fail(where, ": full_attention_interval must be positive");
  c.is_full_attention.resize(c.n_layer);
  for (int i = 0; i < c.n_layer; ++i) c.is_full_attention[i] = (i + 1) % c.full_attention_interval == 0;
  if (f.has("layer_types")) {
    const json& lt = f.j["layer_types"];
    if (!lt.is_array() || static_cast<int>(lt.size()) != c.n_layer)
      fail(where, ": 'layer_types' must be an array of num_hidden_layers (", c.n_layer, ") strings");
    for (int i = 0; i < c.n_layer; ++i) {
      const std::string kind = lt[i].is_string() ? lt[i].get<std::string>() : "";
      bool full;
      if (kind == "full_attention") full = true;
      else if (kind == "linear_attention") full = false;
      else fail(where, ": layer_types[", i, "] is '", kind, "' (expected full_attention or linear_attention)");
      if (full != c.is_full_attention[i])
        fail(where, ": layer_types[", i, "] = ", kind, " disagrees with full_attention_interval ",
             c.full_attention_interval, "; GGUF full_attention_interval cannot express this layout");
    }
  }

  if (rope != nullptr && rope->contains("partial_rotary_factor") && (*rope)["partial_rotary_factor"].is_number())
    c.partial_rotary_factor = (*rope)["partial_rotary_factor"].get<float>();
  else if (f.has("partial_rotary_factor"))
    c.partial_rotary_factor = static_cast<float>(f.get_num("partial_rotary_factor"));
  c.rope_dims = static_cast<int>(c.head_dim * c.partial_rotary_factor);
  c.mrope_sections = {11, 11, 10, 0};  // the upstream default when the checkpoint names none
  if (rope != nullptr && rope->contains("mrope_section")) {
    const json& ms = (*rope)["mrope_section"];
    if (!ms.is_array() || ms.size() > 4) fail(where, ": rope_parameters.mrope_section must be an array of at most 4 integers");
    c.mrope_sections.assign(4, 0);
    for (size_t i = 0; i < ms.size(); ++i) {
      if (!ms[i].is_number_integer()) fail(where, ": rope_parameters.mrope_section[", i, "] is not an integer");
      c.mrope_sections[i] = ms[i].get<int>();
    }
  }
  return c;
}

}  // namespace strata::convert
