#include "strata/moe/gpu_support.h"

#include "strata/base/error.h"

namespace strata {

std::string gpu_unsupported_feature(const ModelConfig& c) {
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerSpec& l = c.layer(il);
    // The KV cache has one row width for every layer.
    if (is_attention(l.mixer) && l.n_head_kv != c.n_head_kv)
      return cat("layer ", il, " has its own key/value head count");
  }
  return "";
}

std::string gpu_prefill_unsupported_feature(const ModelConfig& c) {
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerSpec& l = c.layer(il);
    if (l.mixer == LayerKind::SlidingAttention) return cat("layer ", il, " runs ", layer_kind_name(l.mixer));
    if (l.yarn.on()) return cat("YaRN rotary scaling (layer ", il, ")");
    if (l.ffn != FfnKind::Moe) return cat("layer ", il, " has a ", ffn_kind_name(l.ffn), " feed-forward");
    if (l.mixer == LayerKind::FullAttention &&
        (l.n_head != c.n_head || l.rope_dims != c.rope_dims || l.rope_freq_base != c.rope_freq_base))
      return cat("layer ", il, " has its own head counts or rotary parameters");
  }
  if (c.attn_gate != AttnGate::None) return "the softplus attention output gate (attn_gate)";
  if (c.router != RouterKind::Softmax) return "the sigmoid expert router";
  if (c.router_softcap != 0.0f) return "router logit soft-capping";
  if (c.expert_selection_bias) return "the expert selection bias (exp_probs_b)";
  if (c.expert_weights_scale != 1.0f) return "expert_weights_scale != 1";
  if (c.n_ff_shexp > 0 && !c.shared_expert_gated) return "an ungated shared expert";
  return "";
}

void require_gpu_support(const ModelConfig& c) {
  const std::string what = gpu_unsupported_feature(c);
  if (!what.empty())
    fail("the GPU backend does not implement ", what, " (model ", c.arch_name, "); run it on the CPU (without --gpu)");
}

}  // namespace strata
