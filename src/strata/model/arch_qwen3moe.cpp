// qwen3moe (Qwen3-30B-A3B family). Every layer:
//   x += attention(rmsnorm(x, attn_norm));  x += moe(rmsnorm(x, ffn_norm))
// Attention: per-head q/k RMSNorm, NEOX rotary over rope.dimension_count dims, GQA. MoE: softmax
// router, top-k renormalised when expert_weights_norm (default true), SwiGLU experts, no shared expert.
#include "strata/gguf/gguf.h"
#include "strata/model/arch.h"

namespace strata {
namespace {

void read_qwen3moe(const GgufFile& f, const std::string& p, ModelConfig& c) {
  c.norm_topk = f.get_bool_or(p + "expert_weights_norm", true);
  c.layers.assign(static_cast<size_t>(c.n_layer), LayerSpec{LayerKind::FullAttention, FfnKind::Moe});
}

}  // namespace

const ArchDescription kQwen3Moe = {Arch::Qwen3Moe, "qwen3moe", &read_qwen3moe, "ffn_norm.weight"};

}  // namespace strata
