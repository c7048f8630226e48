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

// Host memory read by the two paths cold experts could take, each from its own pinned buffer of `bytes`:
// CPU threads, and a GPU kernel reading mapped memory over PCIe (zero-copy). Each path alone, then both at
// once, since one host DRAM feeds both. The GPU's rate is its best pass; the CPU's alone, the sum of each
// thread's best pass (threads started one after another, each timing its own passes); at once, each thread's
// average from its start to its last whole pass, a window that begins 20 ms before the GPU's passes and may
// end one pass after them (so it leans towards the CPU's rate alone). error is set (rates zero) without a
// device or when the pinned buffers cannot be allocated; format_host_read_paths formats a measured result.
struct HostReadPaths {
  double cpu_alone_gbs = 0, gpu_alone_gbs = 0, cpu_shared_gbs = 0, gpu_shared_gbs = 0;
  double pin_gbs = 0;  // allocating and first filling the two pinned buffers, bytes per second
  uint64_t checksum = 0;  // of the words read, so that no read can be dropped
  std::string gpu;        // the device's name
  int cpu_threads = 0;
  size_t bytes = 0;
  std::string error;
};
HostReadPaths measure_host_read_paths(size_t bytes, int cpu_threads, int passes = 3);
std::string format_host_read_paths(const HostReadPaths& r);

}  // namespace strata::cuda
