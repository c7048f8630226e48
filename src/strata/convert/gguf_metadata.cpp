#include "strata/convert/gguf_metadata.h"

#include "strata/base/error.h"
#include "strata/gguf/writer.h"

namespace strata::convert {

namespace {

GgufValue u32(int v) {
  if (v < 0) fail("internal: negative value for a u32 GGUF key");
  return GgufValue::u32(static_cast<uint32_t>(v));
}

// The laguna keys beyond the shared ones, named and typed as llama.cpp's converter writes them. The
// sliding layout is written as llama.cpp's laguna loader reads it, a period P with full attention at
// layers 0, P, 2P, ...; a layout no period describes as one flag per layer (true = sliding), which
// strata reads and llama.cpp's laguna loader does not.
void write_laguna_metadata(const HfConfig& c, GgufWriter& w) {
  const std::string a = "laguna";
  w.set(a + ".vocab_size", u32(c.n_vocab));
  w.set(a + ".rope.dimension_count", u32(c.rope_dims));
  w.set(a + ".rope.freq_base_swa", GgufValue::f32(c.rope_theta_swa));
  w.set(a + ".rope.dimension_count_swa", u32(c.rope_dims_swa));
  if (c.yarn_factor != 1.0f) {  // the full-attention layers' YaRN
    w.set(a + ".rope.scaling.type", GgufValue::str("yarn"));
    w.set(a + ".rope.scaling.factor", GgufValue::f32(c.yarn_factor));
    w.set(a + ".rope.scaling.original_context_length", u32(c.yarn_orig_ctx));
    w.set(a + ".rope.scaling.yarn_beta_fast", GgufValue::f32(c.yarn_beta_fast));
    w.set(a + ".rope.scaling.yarn_beta_slow", GgufValue::f32(c.yarn_beta_slow));
    w.set(a + ".rope.scaling.attn_factor", GgufValue::f32(c.yarn_attn_factor));
  }
  bool any_sliding = false;
  for (bool s : c.is_sliding) any_sliding = any_sliding || s;
  if (any_sliding) {
    w.set(a + ".attention.sliding_window", u32(c.sliding_window));
    std::vector<bool> full(c.is_sliding.size());
    for (size_t i = 0; i < full.size(); ++i) full[i] = !c.is_sliding[i];
    const int period = layout_period(full, /*offset_last=*/false);
    if (period > 0) {
      w.set(a + ".attention.sliding_window_pattern", u32(period));
    } else {
      std::vector<GgufValue> flags;
      for (bool s : c.is_sliding) flags.push_back(GgufValue::boolean(s));
      w.set(a + ".attention.sliding_window_pattern", GgufValue::array(GgufType::BOOL, std::move(flags)));
    }
  }
  w.set(a + ".expert_shared_feed_forward_length", u32(c.n_ff_shexp));
  w.set(a + ".expert_weights_norm", GgufValue::boolean(c.norm_topk_prob));
  w.set(a + ".expert_weights_scale", GgufValue::f32(c.routed_scale));
  w.set(a + ".expert_gating_func", GgufValue::u32(2));  // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
  w.set(a + ".leading_dense_block_count", u32(c.n_dense_lead));
  // llama.cpp's key for router soft-capping (its laguna graph does not apply it; 0 writes nothing).
  if (c.router_softcap > 0.0f) w.set(a + ".router_logit_softcapping", GgufValue::f32(c.router_softcap));
}

}  // namespace

void write_model_metadata(const HfConfig& c, const std::string& model_name, uint32_t file_type, GgufWriter& w) {
  const std::string a = gguf_arch_name(c.arch);
  w.set("general.architecture", GgufValue::str(a));
  w.set("general.type", GgufValue::str("model"));
  w.set("general.name", GgufValue::str(model_name));
  w.set("general.file_type", GgufValue::u32(file_type));
  w.set("general.quantization_version", GgufValue::u32(2));

  w.set(a + ".block_count", u32(c.n_layer + c.n_mtp));
  if (c.n_mtp > 0) w.set(a + ".nextn_predict_layers", u32(c.n_mtp));
  if (c.n_ctx > 0) w.set(a + ".context_length", u32(c.n_ctx));
  w.set(a + ".embedding_length", u32(c.n_embd));
  if (c.intermediate_size > 0) w.set(a + ".feed_forward_length", u32(c.intermediate_size));
  if (c.arch == HfArch::Laguna) {
    // Per-layer query heads as an array, as llama.cpp's converter writes them for laguna.
    w.set(a + ".attention.head_count", GgufValue::i32_array({c.heads_per_layer.begin(), c.heads_per_layer.end()}));
  } else {
    w.set(a + ".attention.head_count", u32(c.n_head));
  }
  w.set(a + ".attention.head_count_kv", u32(c.n_head_kv));
  w.set(a + ".attention.key_length", u32(c.head_dim));
  w.set(a + ".attention.value_length", u32(c.head_dim));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::f32(c.rms_eps));
  w.set(a + ".rope.freq_base", GgufValue::f32(c.rope_theta));
  w.set(a + ".expert_count", u32(c.n_expert));
  w.set(a + ".expert_used_count", u32(c.n_expert_used));
  w.set(a + ".expert_feed_forward_length", u32(c.n_ff_exp));
  if (c.arch == HfArch::Qwen3Moe) {
    w.set(a + ".expert_weights_norm", GgufValue::boolean(c.norm_topk_prob));
    return;
  }
  if (c.arch == HfArch::Laguna) {
    write_laguna_metadata(c, w);
    return;
  }

  w.set(a + ".expert_shared_feed_forward_length", u32(c.n_ff_shexp));
  w.set(a + ".expert_weights_norm", GgufValue::boolean(c.norm_topk_prob));
  w.set(a + ".rope.dimension_count", u32(c.rope_dims));
  w.set(a + ".rope.dimension_sections", GgufValue::i32_array({c.mrope_sections.begin(), c.mrope_sections.end()}));
  w.set(a + ".ssm.conv_kernel", u32(c.conv_kernel));
  w.set(a + ".ssm.state_size", u32(c.lin_k_dim));
  w.set(a + ".ssm.group_count", u32(c.lin_k_heads));
  w.set(a + ".ssm.time_step_rank", u32(c.lin_v_heads));
  w.set(a + ".ssm.inner_size", u32(c.lin_v_dim * c.lin_v_heads));
  w.set(a + ".full_attention_interval", u32(c.full_attention_interval));
}

}  // namespace strata::convert
