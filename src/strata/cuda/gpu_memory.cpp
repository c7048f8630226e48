#include "strata/cuda/gpu_memory.h"

#include <cuda_runtime.h>

#include "strata/base/error.h"

namespace strata::cuda {

GpuMemoryInfo gpu_memory_info() {
  int count = 0;
  const cudaError_t st = cudaGetDeviceCount(&count);
  if (st != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls report their own
    fail("no CUDA GPU is visible (cudaGetDeviceCount: ", cudaGetErrorString(st), ")");
  }
  if (count == 0) fail("no CUDA GPU is visible (cudaGetDeviceCount reports 0 devices)");
  const cudaError_t set = cudaSetDevice(0);
  if (set != cudaSuccess) fail("cannot use GPU 0 (cudaSetDevice: ", cudaGetErrorString(set), ")");
  // cudaFree(nullptr) forces the lazy context creation, so its memory is no longer counted as free.
  const cudaError_t ctx = cudaFree(nullptr);
  if (ctx != cudaSuccess) fail("cannot create a CUDA context on GPU 0: ", cudaGetErrorString(ctx));
  size_t free_b = 0, total_b = 0;
  const cudaError_t info = cudaMemGetInfo(&free_b, &total_b);
  if (info != cudaSuccess) fail("cannot read GPU 0's memory (cudaMemGetInfo: ", cudaGetErrorString(info), ")");
  return {static_cast<uint64_t>(total_b), static_cast<uint64_t>(free_b)};
}

}  // namespace strata::cuda
