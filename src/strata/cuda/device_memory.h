// One account of the device memory strata allocates, shared by all its users (weights, sequence state,
// decode and prefill workspaces, the hybrid MoE): device_alloc / device_free stand for cudaMalloc /
// cudaFree, so the bytes in use are known and one limit bounds them all. The backend plan sets the limit
// from --gpu-mem: a VRAM estimate that was too low then fails at the allocation, naming what asked,
// instead of running past the user's bound. Thread-safe. Plain C++ header (STRATA_HAVE_CUDA builds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::cuda {

// `bytes` of device memory (1 when 0), not initialised. Fails (strata::Error) naming `what`, the bytes
// in use and the limit when the limit would be passed or the GPU is out of memory.
void* device_alloc(size_t bytes, const std::string& what);
// Frees what device_alloc returned (nullptr: nothing).
void device_free(void* p);
// The most strata's allocations may hold at once (0: no limit but the GPU's). Fails when more is in use.
void set_device_memory_limit(uint64_t bytes);
uint64_t device_memory_limit();
uint64_t device_memory_in_use();

}  // namespace strata::cuda
