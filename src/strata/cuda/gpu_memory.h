// How much memory device 0 has in all and free right now (cudaMemGetInfo), for the VRAM receipt
// (moe/vram_budget.h). Plain C++ header: include it only where STRATA_HAVE_CUDA is defined.
#pragma once

#include <cstdint>

namespace strata::cuda {

struct GpuMemoryInfo {
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
};

// Creates the CUDA context on device 0 if needed (so "free" already excludes the context's own
// share) and reads total/free. Fails (strata::Error) with the CUDA runtime's reason when there is no
// usable GPU, e.g. "--gpu: no CUDA GPU is visible (cudaGetDeviceCount: no CUDA-capable device is
// detected)".
GpuMemoryInfo gpu_memory_info();

}  // namespace strata::cuda
