// What the CUDA backend implements of the model description. Every GPU entry point (the --gpu plan and
// DeviceModel, which GpuModel, the prefill and the hybrid step are built on) calls require_gpu_support,
// so a model using anything else is refused by name instead of running wrong.
#pragma once

#include <string>

#include "strata/model/config.h"

namespace strata {

// "" when the CUDA kernels implement everything c uses; otherwise what they lack, e.g.
// "layer 1 has its own key/value head count" or an input wider than the decode matvec stages.
std::string gpu_unsupported_feature(const ModelConfig& c);

// "" when the batched GPU prefill (cuda/prefill.h) implements everything c uses (every layer kind,
// FFN kind, router and gate the decode step runs); otherwise what it lacks (its attention's head size,
// DeltaNet key head and convolution limits, expert rows a multiple of 32 long). A GPU session of such a
// model runs prompts through its decode step, token by token.
std::string gpu_prefill_unsupported_feature(const ModelConfig& c);

// The largest attention head (head_dim, a multiple of 4) the batched prefill's tiled attention takes.
constexpr int kGpuPrefillMaxHeadDim = 256;
// The longest attention or DeltaNet value head the decode step takes (one thread per dim of a block).
constexpr int kGpuMaxHeadDim = 1024;
// The widest input the decode step's matvec stages (its shared memory): every projection's input width.
constexpr int kGpuMaxMatvecCols = 16384;
// The batched prefill's DeltaNet scan takes key heads up to this long, and convolutions up to this long.
constexpr int kGpuPrefillMaxDeltaNetHeadK = 256;
constexpr int kGpuPrefillMaxConvK = 16;

// Throws strata::Error "the GPU backend does not implement <feature> (model <arch>); run it on the CPU".
void require_gpu_support(const ModelConfig& c);

}  // namespace strata
