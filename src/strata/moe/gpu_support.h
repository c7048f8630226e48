// What the CUDA backend implements of the model description. Every GPU entry point (the --gpu plan and
// DeviceModel, which GpuModel, the prefill and the hybrid step are built on) calls require_gpu_support,
// so a model using anything else is refused by name instead of running wrong.
#pragma once

#include <string>

#include "strata/model/config.h"

namespace strata {

// "" when the CUDA kernels implement everything c uses; otherwise what they lack, e.g.
// "layer 1 runs sliding-window attention".
std::string gpu_unsupported_feature(const ModelConfig& c);

// "" when the batched GPU prefill (cuda/prefill.h) implements everything c uses (every layer kind,
// FFN kind, router and gate the decode step runs); otherwise what it lacks (its attention's head size
// limit). A GPU session of such a model runs prompts through its decode step, token by token.
std::string gpu_prefill_unsupported_feature(const ModelConfig& c);

// The largest attention head (head_dim, a multiple of 4) the batched prefill's tiled attention takes.
constexpr int kGpuPrefillMaxHeadDim = 256;

// Throws strata::Error "the GPU backend does not implement <feature> (model <arch>); run it on the CPU".
void require_gpu_support(const ModelConfig& c);

}  // namespace strata
