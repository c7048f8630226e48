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

// Per-layer strings of `key` (num_hidden_layers of them), each one of `a` (true) or `b` (false).
std::vector<bool> layer_flags(const Fields& f, const char* key, int n_layer, const char* a, const char* b) {
  const json& lt = f.j[key];
  if (!lt.is_array() || static_cast<int>(lt.size()) != n_layer)
    fail(f.path, ": '", key, "' must be an array of num_hidden_layers (", n_layer, ") strings");
  std::vector<bool> out(static_cast<size_t>(n_layer));
  for (int i = 0; i < n_layer; ++i) {
    const std::string kind = lt[i].is_string() ? lt[i].get<std::string>() : "";
    if (kind != a && kind != b) fail(f.path, ": ", key, "[", i, "] is '", kind, "' (expected ", a, " or ", b, ")");
    out[static_cast<size_t>(i)] = kind == a;
  }
  return out;
}

// One layer kind's rope parameters (laguna's rope_parameters.<kind>): theta and rotary dims, and with
// yarn set (the full-attention kind) YaRN scaling; other rotary scaling is refused.
void laguna_rope(const Fields& f, const json* rope, const char* kind, float def_theta, float def_factor, int head_dim,
                 float& theta, int& dims, HfConfig* yarn = nullptr) {
  theta = def_theta;
  float factor = def_factor;
  if (rope != nullptr && rope->contains(kind)) {
    const json& r = (*rope)[kind];
    if (!r.is_object()) fail(f.path, ": rope_parameters.", kind, " is not an object");
    const std::string type = r.value("rope_type", std::string("default"));
    if (type == "yarn" && yarn) {
      auto num = [&](const char* key, double def) {
        if (!r.contains(key) || r[key].is_null()) return def;
        if (!r[key].is_number()) fail(f.path, ": rope_parameters.", kind, ".", key, " is not a number");
        return r[key].get<double>();
      };
      if (r.contains("mscale") || r.contains("mscale_all_dim"))
        fail(f.path, ": rope_parameters.", kind, ": yarn with mscale / mscale_all_dim is not supported");
      if (r.contains("truncate") && r["truncate"].is_boolean() && !r["truncate"].get<bool>())
        fail(f.path, ": rope_parameters.", kind, ": yarn with truncate = false is not supported");
      yarn->yarn_factor = static_cast<float>(num("factor", 1.0));
      yarn->yarn_orig_ctx = static_cast<int>(num("original_max_position_embeddings", 0));
      yarn->yarn_beta_fast = static_cast<float>(num("beta_fast", 32.0));
      yarn->yarn_beta_slow = static_cast<float>(num("beta_slow", 1.0));
      const double own = 0.1 * std::log(static_cast<double>(yarn->yarn_factor)) + 1.0;
      yarn->yarn_attn_factor = static_cast<float>(num("attention_factor", own) / own);
      if (yarn->yarn_factor < 1.0f || yarn->yarn_orig_ctx <= 0)
        fail(f.path, ": rope_parameters.", kind, ": yarn needs factor >= 1 and original_max_position_embeddings");
    } else if (type != "default") {
      fail(f.path, ": rope_parameters.", kind, ".rope_type '", type,
           "' (rotary scaling) is not supported by strata yet (supported: default", yarn ? ", yarn" : "", ")");
    }
    if (r.contains("rope_theta")) {
      if (!r["rope_theta"].is_number()) fail(f.path, ": rope_parameters.", kind, ".rope_theta is not a number");
      theta = r["rope_theta"].get<float>();
    }
    if (r.contains("partial_rotary_factor")) {
      if (!r["partial_rotary_factor"].is_number())
        fail(f.path, ": rope_parameters.", kind, ".partial_rotary_factor is not a number");
      factor = r["partial_rotary_factor"].get<float>();
    }
  }
  dims = static_cast<int>(head_dim * factor);
  if (dims <= 0 || dims > head_dim || dims % 2 != 0)
    fail(f.path, ": rope_parameters.", kind, ": ", dims, " rotary dims (head_dim x partial_rotary_factor) must be even and in (0, head_dim]");
}

// Laguna's rope settings in the form LagunaConfig documents: rope_parameters keyed by layer type, the layers of
// each type reading their entry (its rotary embedding looks every type in layer_types up); absent, both
// types take LagunaConfig's defaults. Nothing else is read (no top-level rope_theta /
// partial_rotary_factor / rope_scaling, no flat dict), so such keys are refused rather than guessed at.
const json* laguna_rope_parameters(const Fields& f, const HfConfig& c) {
  for (const char* key : {"rope_theta", "partial_rotary_factor", "rope_scaling"})
    if (f.has(key))
      fail(f.path, ": '", key, "' at the top level is not read for laguna (its rope settings live only in ",
           "rope_parameters.full_attention and rope_parameters.sliding_attention); move it there or remove it");
  if (!f.has("rope_parameters")) return nullptr;
  const json& r = f.j["rope_parameters"];
  if (!r.is_object()) fail(f.path, ": 'rope_parameters' is not an object");
  const bool keyed = r.contains("full_attention") || r.contains("sliding_attention");
  for (auto it = r.begin(); it != r.end(); ++it) {
    if (it.key() == "full_attention" || it.key() == "sliding_attention") continue;
    if (!keyed)
      fail(f.path, ": rope_parameters is not keyed by layer type (it has '", it.key(), "' at its top level); ",
           "laguna reads one entry per layer type, rope_parameters.full_attention and ",
           "rope_parameters.sliding_attention");
    fail(f.path, ": rope_parameters.", it.key(), " sits beside the per-layer-type entries, which alone are read; ",
         "move it into rope_parameters.full_attention / rope_parameters.sliding_attention or remove it");
  }
  for (int i = 0; i < c.n_layer; ++i) {
    const char* kind = c.is_sliding[static_cast<size_t>(i)] ? "sliding_attention" : "full_attention";
    if (!r.contains(kind))
      fail(f.path, ": rope_parameters has no '", kind, "' entry, which layer ", i, " (", kind, ") reads");
  }
  return &r;
}

// The laguna fields (HF LagunaConfig; defaults as its __post_init__ sets them).
void read_laguna(const Fields& f, HfConfig& c) {
  const int n = c.n_layer;
  if (f.get_bool_or("attention_bias", false)) fail(f.path, ": attention_bias is true: biases are not supported");
  if (f.get_bool_or("moe_apply_router_weight_on_input", false))
    fail(f.path, ": moe_apply_router_weight_on_input is true: not supported (transformers does not implement it either)");
  if (f.has("hidden_act") && f.j["hidden_act"] != "silu") fail(f.path, ": hidden_act must be silu");
  c.n_ff_shexp = f.get_int("shared_expert_intermediate_size");
  c.norm_topk_prob = true;  // HF LagunaTopKRouter always renormalises the chosen weights
  c.routed_scale = f.has("moe_routed_scaling_factor") ? static_cast<float>(f.get_num("moe_routed_scaling_factor")) : 1.0f;
  c.router_softcap =
      f.has("moe_router_logit_softcapping") ? static_cast<float>(f.get_num("moe_router_logit_softcapping")) : 0.0f;
  if (!(c.routed_scale > 0.0f) || c.router_softcap < 0.0f)
    fail(f.path, ": moe_routed_scaling_factor must be positive and moe_router_logit_softcapping >= 0");
  c.sliding_window = f.get_int_or("sliding_window", 512);

  c.is_sliding = f.has("layer_types") ? layer_flags(f, "layer_types", n, "sliding_attention", "full_attention")
                                      : std::vector<bool>(static_cast<size_t>(n), false);
  bool any_sliding = false;
  for (bool s : c.is_sliding) any_sliding = any_sliding || s;
  if (any_sliding && c.sliding_window <= 0) fail(f.path, ": sliding_window must be positive for sliding_attention layers");
  std::vector<bool> dense(static_cast<size_t>(n), false);
  if (f.has("mlp_layer_types")) dense = layer_flags(f, "mlp_layer_types", n, "dense", "sparse");
  else if (n > 0) dense[0] = true;
  while (c.n_dense_lead < n && dense[static_cast<size_t>(c.n_dense_lead)]) ++c.n_dense_lead;
  for (int i = c.n_dense_lead; i < n; ++i)
    if (dense[static_cast<size_t>(i)])
      fail(f.path, ": mlp_layer_types[", i, "] is dense after a sparse layer; GGUF (leading_dense_block_count) "
           "expresses only dense layers first");
  if (c.n_dense_lead > 0 && c.intermediate_size <= 0) fail(f.path, ": dense layers need intermediate_size");

  c.heads_per_layer.assign(static_cast<size_t>(n), c.n_head);
  if (f.has("num_attention_heads_per_layer")) {
    const json& h = f.j["num_attention_heads_per_layer"];
    if (!h.is_array() || static_cast<int>(h.size()) != n)
      fail(f.path, ": 'num_attention_heads_per_layer' must be an array of num_hidden_layers (", n, ") integers");
    for (int i = 0; i < n; ++i) {
      if (!h[i].is_number_integer() || h[i].get<int>() <= 0 || h[i].get<int>() % c.n_head_kv != 0)
        fail(f.path, ": num_attention_heads_per_layer[", i, "] must be a positive multiple of num_key_value_heads");
      c.heads_per_layer[static_cast<size_t>(i)] = h[i].get<int>();
    }
  }
  // gating: true / "per-head" -> one gate per head; anything else (HF: false, "per-element") per element.
  if (!f.has("gating")) {
    c.gate_per_head = true;
  } else if (f.j["gating"].is_boolean()) {
    c.gate_per_head = f.j["gating"].get<bool>();
  } else if (f.j["gating"].is_string() && (f.j["gating"] == "per-head" || f.j["gating"] == "per-element")) {
    c.gate_per_head = f.j["gating"] == "per-head";
  } else {
    fail(f.path, ": 'gating' must be true, false, \"per-head\" or \"per-element\"");
  }
  const json* rope = laguna_rope_parameters(f, c);
  laguna_rope(f, rope, "full_attention", 500000.0f, 0.5f, c.head_dim, c.rope_theta, c.rope_dims, &c);
  laguna_rope(f, rope, "sliding_attention", 10000.0f, 1.0f, c.head_dim, c.rope_theta_swa, c.rope_dims_swa);
}

}  // namespace

int layout_period(const std::vector<bool>& special, bool offset_last) {
  const int n = static_cast<int>(special.size());
  for (int period = 1; period <= n + 1; ++period) {
    bool ok = true;
    for (int i = 0; i < n && ok; ++i)
      ok = special[static_cast<size_t>(i)] == (offset_last ? (i + 1) % period == 0 : i % period == 0);
    if (ok) return period;
  }
  return 0;
}

const char* gguf_arch_name(HfArch arch) {
  switch (arch) {
    case HfArch::Qwen3Moe: return "qwen3moe";
    case HfArch::Qwen35Moe: return "qwen35moe";
    case HfArch::Laguna: return "laguna";
  }
  return "?";
}

std::string supported_model_types() { return "qwen3_moe, qwen3_5_moe, qwen3_5_moe_text, laguna"; }

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
  } else if (c.model_type == "laguna") {
    c.arch = HfArch::Laguna;
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
  // Quantized weights (packed integers, fp8 with scales) cannot be read as floats: say so before a
  // missing or odd tensor does, less clearly.
  if (f.has("quantization_config")) {
    const json& q = f.j["quantization_config"];
    const bool named = q.is_object() && q.contains("quant_method") && q["quant_method"].is_string();
    fail(where, ": the checkpoint is quantized (quantization_config",
         named ? cat(".quant_method '", q["quant_method"].get<std::string>(), "'") : std::string(), "); ",
         kNeedUnquantized);
  }
  // MLX writes its own key: {"quantization": {"group_size": G, "bits": B}} (weights packed, with .scales
  // and .biases tensors).
  if (f.has("quantization") && f.j["quantization"].is_object() && f.j["quantization"].contains("bits")) {
    const json& q = f.j["quantization"];
    fail(where, ": the checkpoint is quantized (MLX-style 'quantization'",
         q["bits"].is_number_integer() ? cat(", ", q["bits"].get<int64_t>(), " bits") : std::string(), "); ",
         kNeedUnquantized);
  }

  c.n_layer = f.get_int("num_hidden_layers");
  c.n_embd = f.get_int("hidden_size");
  c.n_vocab = f.get_int("vocab_size");
  c.n_ctx = f.get_int_or("max_position_embeddings", 0);
  c.n_head = f.get_int("num_attention_heads");
  c.n_head_kv = f.get_int_or("num_key_value_heads", c.n_head);
  // Absent: the architecture's transformers default. Qwen3MoeConfig has no head_dim field, so its attention
  // takes hidden_size / num_attention_heads; the Qwen3.5 MoE and Laguna configs carry their own defaults.
  int default_head_dim = c.n_head > 0 ? c.n_embd / c.n_head : 0;
  if (c.arch == HfArch::Qwen35Moe) default_head_dim = 256;
  if (c.arch == HfArch::Laguna) default_head_dim = 128;
  c.head_dim = f.get_int_or("head_dim", default_head_dim);
  c.rms_eps = static_cast<float>(f.get_num("rms_norm_eps"));
  c.intermediate_size = f.get_int_or("intermediate_size", 0);
  const bool top_tie = top.contains("tie_word_embeddings") && top["tie_word_embeddings"].is_boolean() &&
                       top["tie_word_embeddings"].get<bool>();
  c.tie_embeddings = f.get_bool_or("tie_word_embeddings", top_tie);

  // rope_theta: top level (transformers 4) or inside rope_parameters / rope_scaling (transformers 5).
  const json* rope = nullptr;
  if (merged.contains("rope_parameters") && merged["rope_parameters"].is_object()) rope = &merged["rope_parameters"];
  else if (merged.contains("rope_scaling") && merged["rope_scaling"].is_object()) rope = &merged["rope_scaling"];
  if (c.arch == HfArch::Laguna) {
    // Keyed by layer type: read_laguna.
  } else if (f.has("rope_theta")) {
    c.rope_theta = static_cast<float>(f.get_num("rope_theta"));
  } else if (rope != nullptr && rope->contains("rope_theta") && (*rope)["rope_theta"].is_number()) {
    c.rope_theta = (*rope)["rope_theta"].get<float>();
  } else {
    fail(where, ": missing field 'rope_theta' (top level or in rope_parameters)");
  }
  // Rotary scaling may sit in either dict, its kind under rope_type or (older configs) type.
  for (const char* dict : {"rope_parameters", "rope_scaling"}) {
    if (c.arch == HfArch::Laguna || !merged.contains(dict) || !merged[dict].is_object()) continue;
    const json& r = merged[dict];
    for (const char* key : {"rope_type", "type"}) {
      if (!r.contains(key) || !r[key].is_string()) continue;
      const std::string rt = r[key].get<std::string>();
      if (rt != "default" && rt != "mrope")
        fail(where, ": ", dict, ".", key, " '", rt,
             "' (rope scaling) is not supported by strata convert (supported: default)");
    }
  }

  // transformers 5 names the expert count num_local_experts for qwen3_moe; older configs num_experts.
  c.n_expert = f.has("num_local_experts") ? f.get_int("num_local_experts") : f.get_int("num_experts");
  c.n_expert_used = f.get_int("num_experts_per_tok");
  c.n_ff_exp = f.get_int("moe_intermediate_size");
  // Absent: transformers' defaults (Qwen3MoeConfig false; the Qwen3.5 MoE configs renormalise).
  c.norm_topk_prob = f.get_bool_or("norm_topk_prob", c.arch != HfArch::Qwen3Moe);

  if (c.arch == HfArch::Laguna) {
    read_laguna(f, c);
    return c;
  }

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
  // The layout: layer_types when given (current transformers writes only those), which must be
  // periodic (full attention every P-th layer) for GGUF's full_attention_interval to express it; a
  // full_attention_interval given beside them must agree.
  c.n_mtp = f.get_int_or("mtp_num_hidden_layers", 0);
  // One predictor (fc, its norms) serves all of HF's MTP layers; GGUF's nextn blocks each carry their own.
  if (c.n_mtp < 0 || c.n_mtp > 1) fail(where, ": mtp_num_hidden_layers = ", c.n_mtp, " (0 or 1 supported)");
  const bool has_interval = f.has("full_attention_interval");
  c.full_attention_interval = f.get_int_or("full_attention_interval", 4);
  if (c.full_attention_interval <= 0) fail(where, ": full_attention_interval must be positive");
  c.is_full_attention.resize(c.n_layer);
  for (int i = 0; i < c.n_layer; ++i) c.is_full_attention[i] = (i + 1) % c.full_attention_interval == 0;
  if (f.has("layer_types")) {
    const std::vector<bool> full = layer_flags(f, "layer_types", c.n_layer, "full_attention", "linear_attention");
    const int period = layout_period(full, /*offset_last=*/true);
    if (period == 0)
      fail(where, ": layer_types is not periodic (full attention exactly at layers P-1, 2P-1, ...); GGUF "
           "full_attention_interval cannot express this layout");
    if (has_interval && full != c.is_full_attention)
      fail(where, ": layer_types (full attention every ", period, " layers) disagrees with full_attention_interval ",
           c.full_attention_interval);
    c.full_attention_interval = period;
    c.is_full_attention = full;
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
