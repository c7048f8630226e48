#include "strata/convert/gguf_metadata.h"

#include "strata/base/error.h"
#include "strata/gguf/writer.h"

namespace strata::convert {

void write_model_metadata(const HfConfig& c, const std::string& model_name, uint32_t file_type, GgufWriter& w) {
  const std::string a = gguf_arch_name(c.arch);
  auto u32 = [](int v) {
    if (v < 0) fail("internal: negative value for a u32 GGUF key");
    return GgufValue::u32(static_cast<uint32_t>(v));
  };
  w.set("general.architecture", GgufValue::str(a));
  w.set("general.type", GgufValue::str("model"));
  w.set("general.name", GgufValue::str(model_name));
  w.set("general.file_type", GgufValue::u32(file_type));
  w.set("general.quantization_version", GgufValue::u32(2));

  w.set(a + ".block_count", u32(c.n_layer));
  if (c.n_ctx > 0) w.set(a + ".context_length", u32(c.n_ctx));
  w.set(a + ".embedding_length", u32(c.n_embd));
  if (c.intermediate_size > 0) w.set(a + ".feed_forward_length", u32(c.intermediate_size));
  w.set(a + ".attention.head_count", u32(c.n_head));
  w.set(a + ".attention.head_count_kv", u32(c.n_head_kv));
  w.set(a + ".attention.key_length", u32(c.head_dim));
  w.set(a + ".attention.value_length", u32(c.head_dim));
  w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::f32(c.rms_eps));
  w.set(a + ".rope.freq_base", GgufValue::f32(c.rope_theta));
  w.set(a + ".expert_count", u32(c.n_expert));
  w.set(a + ".expert_used_count", u32(c.n_expert_used));
  w.set(a + ".expert_feed_forward_length", u32(c.n_ff_exp));
  if (c.arch == HfArch::Qwen3Moe) return;

  w.set(a + ".expert_shared_feed_forward_length", u32(c.n_ff_shexp));
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
