#include "strata/moe/gpu_support.h"

#include "strata/base/error.h"

namespace strata {

namespace {

// The first matvec input of c wider than the decode step stages, as "<what> of <n> columns", or "".
std::string too_wide_input(const ModelConfig& c) {
  const auto wide = [](int64_t n) { return n > kGpuMaxMatvecCols; };
  if (wide(c.n_embd)) return cat("a hidden size of ", c.n_embd);
  if (c.n_mtp > 0 && wide(2 * static_cast<int64_t>(c.n_embd)))
    return cat("an MTP input projection of ", 2 * static_cast<int64_t>(c.n_embd), " columns");
  const int head_v = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
  // An attention layer's output projection takes its heads' values side by side.
  const auto attn_out = [&](const LayerSpec& l) {
    return is_attention(l.mixer) ? static_cast<int64_t>(l.n_head) * head_v : int64_t{0};
  };
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerSpec& l = c.layer(il);
    if (wide(attn_out(l))) return cat("layer ", il, "'s attention output projection of ", attn_out(l), " columns");
    if (l.mixer == LayerKind::DeltaNet && wide(static_cast<int64_t>(c.ssm_v_heads) * c.ssm_head_v))
      return cat("layer ", il, "'s DeltaNet output projection of ", static_cast<int64_t>(c.ssm_v_heads) * c.ssm_head_v,
                 " columns");
    if (l.ffn == FfnKind::Dense && wide(c.n_ff))
      return cat("layer ", il, "'s dense down projection of ", c.n_ff, " columns");
    if (l.ffn == FfnKind::Moe && (wide(c.n_ff_exp) || wide(c.n_ff_shexp)))
      return cat("layer ", il, "'s expert down projections of ", c.n_ff_exp, " / ", c.n_ff_shexp, " columns");
  }
  if (c.n_mtp > 0 && wide(attn_out(c.mtp_layer)))
    return cat("the MTP layer's attention output projection of ", attn_out(c.mtp_layer), " columns");
  return "";
}

}  // namespace

std::string gpu_unsupported_feature(const ModelConfig& c) {
  for (int il = 0; il < c.n_layer; ++il) {
    const LayerSpec& l = c.layer(il);
    // The KV cache has one row width for every layer.
    if (is_attention(l.mixer) && l.n_head_kv != c.n_head_kv)
      return cat("layer ", il, " has its own key/value head count");
  }
  // The decode step's attention prep and DeltaNet step give each head's dims one thread of a block.
  if (c.n_attention_layers() > 0 && c.head_dim > kGpuMaxHeadDim)
    return cat("attention heads of ", c.head_dim, " dims (the decode step takes up to ", kGpuMaxHeadDim, ")");
  if (c.n_deltanet_layers() > 0 && c.ssm_head_v > kGpuMaxHeadDim)
    return cat("DeltaNet value heads of ", c.ssm_head_v, " dims (the decode step takes up to ", kGpuMaxHeadDim, ")");
  const std::string wide = too_wide_input(c);
  if (!wide.empty()) return cat(wide, " (the decode step's matvec takes inputs up to ", kGpuMaxMatvecCols, " wide)");
  return "";
}

std::string gpu_prefill_unsupported_feature(const ModelConfig& c) {
  if (c.n_attention_layers() > 0 && (c.head_dim % 4 != 0 || c.head_dim > kGpuPrefillMaxHeadDim))
    return cat("attention heads of ", c.head_dim, " dims (the tiled prefill attention takes multiples of 4 up to ",
               kGpuPrefillMaxHeadDim, ")");
  if (c.n_deltanet_layers() > 0 && c.ssm_head_k > kGpuPrefillMaxDeltaNetHeadK)
    return cat("DeltaNet key heads of ", c.ssm_head_k, " dims (the prefill's scan takes up to ",
               kGpuPrefillMaxDeltaNetHeadK, ")");
  if (c.n_deltanet_layers() > 0 && c.ssm_conv_kernel > kGpuPrefillMaxConvK)
    return cat("a DeltaNet convolution of ", c.ssm_conv_kernel, " taps (the prefill takes up to ", kGpuPrefillMaxConvK,
               ")");
  if (c.n_expert > 0 && (c.n_embd % 32 != 0 || c.n_ff_exp % 32 != 0))
    return cat("expert rows of ", c.n_embd, " / ", c.n_ff_exp,
               " columns (the prefill's grouped expert products take multiples of 32)");
  return "";
}

void require_gpu_support(const ModelConfig& c) {
  const std::string what = gpu_unsupported_feature(c);
  if (!what.empty())
    fail("the GPU backend does not implement ", what, " (model ", c.arch_name, "); run it on the CPU (without --gpu)");
}

}  // namespace strata
