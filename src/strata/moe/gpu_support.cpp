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
  if (c.n_attention_layers() > 0 && (c.head_dim % 4 != 0 || c.head_dim > kGpuPrefillMaxHeadDim))
    return cat("attention heads of ", c.head_dim, " dims (the tiled prefill attention takes multiples of 4 up to ",
               kGpuPrefillMaxHeadDim, ")");
  return "";
}

void require_gpu_support(const ModelConfig& c) {
  const std::string what = gpu_unsupported_feature(c);
  if (!what.empty())
    fail("the GPU backend does not implement ", what, " (model ", c.arch_name, "); run it on the CPU (without --gpu)");
}

}  // namespace strata
