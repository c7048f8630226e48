// qwen35moe (Qwen3.5 / 3.6 MoE). Layers mix gated DeltaNet linear attention and gated full attention;
// every layer is
//   x += mixer(rmsnorm(x, attn_norm));  x += moe_with_shared_expert(rmsnorm(x, post_attention_norm))
// Full attention: attn_q yields, per head, the query and a sigmoid output gate; partial NEOX rotary.
// DeltaNet: conv1d + SiLU over q|k|v, L2-normed q/k, decay/beta gates, the delta rule, gated RMSNorm.
// MoE: the router always renormalises its top-k (HF Qwen3_5MoeTopKRouter); a sigmoid-gated shared
// expert. HF stores the RMSNorm weights zero-centred (1 + w); GGUF files hold 1 + w already.
#include <memory>
#include <variant>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/model/arch.h"

namespace strata {
namespace {

// An array of bool or integer flags.
std::vector<bool> flag_array(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  const auto* arr = std::get_if<std::shared_ptr<GgufArray>>(&v->v);
  if (v->type != GgufType::ARRAY || !arr || !*arr) fail(f.path(), ": key ", key, " must be an array of bool or integers");
  std::vector<bool> out;
  if ((*arr)->elem_type != GgufType::BOOL) {
    for (int64_t x : f.get_int_array(key)) out.push_back(x != 0);
    return out;
  }
  for (const GgufValue& item : (*arr)->items) out.push_back(std::get<bool>(item.v));
  return out;
}

void read_qwen35moe(const GgufFile& f, const std::string& p, ModelConfig& c) {
  c.norm_topk = f.get_bool_or(p + "expert_weights_norm", true);  // absent (llama.cpp's files): renormalised
  c.attn_output_gate = true;
  c.n_ff_shexp = gguf_positive(f, p + "expert_shared_feed_forward_length");
  c.ssm_conv_kernel = gguf_positive(f, p + "ssm.conv_kernel");
  c.ssm_head_k = gguf_positive(f, p + "ssm.state_size");
  c.ssm_k_heads = gguf_positive(f, p + "ssm.group_count");
  c.ssm_v_heads = gguf_positive(f, p + "ssm.time_step_rank");
  const int inner = gguf_positive(f, p + "ssm.inner_size");
  require_config(inner % c.ssm_v_heads == 0, f, "ssm.inner_size is not a multiple of ssm.time_step_rank");
  c.ssm_head_v = inner / c.ssm_v_heads;
  require_config(c.ssm_v_heads % c.ssm_k_heads == 0, f, "ssm.time_step_rank is not a multiple of ssm.group_count");

  // Which layers are recurrent: explicit per-layer flags (non-zero = DeltaNet) win over the interval.
  std::vector<bool> recurrent(static_cast<size_t>(c.n_layer));
  if (f.has(p + "attention.recurrent_layers")) {
    const std::vector<bool> flags = flag_array(f, p + "attention.recurrent_layers");
    require_config(static_cast<int>(flags.size()) >= c.n_layer, f,
                   "attention.recurrent_layers has fewer entries than layers");
    for (int i = 0; i < c.n_layer; ++i) recurrent[i] = flags[i];
  } else {
    const int interval = gguf_positive_or(f, p + "full_attention_interval", 4);
    for (int i = 0; i < c.n_layer; ++i) recurrent[i] = (i + 1) % interval != 0;
  }
  c.layers.resize(static_cast<size_t>(c.n_layer));
  for (int i = 0; i < c.n_layer; ++i)
    c.layers[i] = LayerSpec{recurrent[i] ? LayerKind::DeltaNet : LayerKind::FullAttention, FfnKind::Moe};
}

}  // namespace

const ArchDescription kQwen35Moe = {Arch::Qwen35Moe, "qwen35moe", &read_qwen35moe, "post_attention_norm.weight"};

}  // namespace strata
