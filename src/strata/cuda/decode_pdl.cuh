// Programmatic dependent launch (Hopper) for the decode step's kernels: each kernel is launched with the
// programmatic-stream-serialization attribute, so the GPU may start scheduling it while the previous
// kernel on the stream is still finishing (hiding most of the launch gap between the ~360 small kernels
// of a step). Correctness rests on every such kernel calling pdl_enter() before it reads or writes any
// memory: it lets the next kernel launch early and then waits until the previous grid has completed
// and its writes are visible (griddepcontrol.wait). Without the attribute (GPUs before Hopper) both
// instructions do nothing.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "strata/cuda/cuda_check.h"

namespace strata::cuda {

// The two halves of pdl_enter(), for kernels that do independent work (prefetching weights, which no
// kernel writes) between them.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_enter() {
  pdl_launch_dependents();
  pdl_wait();
}

inline bool pdl_enabled() {
  static const bool on = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

// kernel<<<grid, block, smem, s>>>(args...) with the PDL attribute when programmatic (and enabled);
// without it the kernel starts once the previous work on the stream has completed.
template <typename... KArgs, typename... Args>
void launch_programmatic(const char* what, bool programmatic, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                         size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = programmatic && pdl_enabled() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

// kernel<<<grid, block, smem, s>>>(args...) with the PDL attribute (when enabled).
template <typename... KArgs, typename... Args>
void launch_pdl(const char* what, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  launch_programmatic(what, true, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

}  // namespace strata::cuda
