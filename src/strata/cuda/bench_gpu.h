// The CUDA side of `strata bench`: the device memory of a GPU sequence by tier, and the GPU memory
// bandwidth that decode floors are computed from when benchmarking on the GPU. The sequence itself
// comes from the same factory as run and serve (cli/backend_cli.h).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "strata/engine/bench_bandwidth.h"
#include "strata/engine/sequence.h"

namespace strata::cuda {

// Weights (the shared GpuModel's) and the sequence's state + workspaces; empty when `sequence` is
// not a GPU session.
std::vector<std::pair<std::string, size_t>> gpu_vram_by_tier(const Sequence& sequence);

// Device-to-device copy of `bytes`, best of `passes`; counts bytes read + written, as HBM floors do.
BandwidthResult measure_gpu_copy_bandwidth(size_t bytes = size_t(1) << 30, int passes = 5);

}  // namespace strata::cuda
