// Error checks for the CUDA backend: every CUDA call's status and every launch is checked, and a
// failure throws strata::Error naming the operation and CUDA's message.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "strata/quant/types.h"

namespace strata::cuda {

// Throws when status != cudaSuccess: "CUDA error in <what>: <message>".
void check_cuda(cudaError_t status, const char* what);
// Checks cudaGetLastError() after a kernel launch.
void check_launch(const char* what);
// Throws "CUDA backend: <what>" when !ok (argument checks of the launchers).
void check_arg(bool ok, const char* what);
// Throws "CUDA backend: <what> does not support weight type <name> (supported: ...)".
[[noreturn]] void fail_unsupported_type(const char* what, GgmlType type);

// Lets kernel take `bytes` of dynamic shared memory per block (a launch above 48 KB needs the opt-in).
template <class K>
void allow_dynamic_smem(K kernel, size_t bytes, const char* what) {
  if (bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               what);
}

// The graph of what enqueue() launches on stream s (thread-local capture), instantiated. A throw from
// enqueue ends the capture and passes on.
template <class F>
cudaGraphExec_t capture_graph(cudaStream_t s, F&& enqueue) {
  cudaGraph_t raw = nullptr;
  check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(s, &raw);
    if (raw) cudaGraphDestroy(raw);
    throw;
  }
  check_cuda(cudaStreamEndCapture(s, &raw), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiate(&exec, raw, 0);
  cudaGraphDestroy(raw);
  check_cuda(st, "cudaGraphInstantiate");
  return exec;
}

}  // namespace strata::cuda
