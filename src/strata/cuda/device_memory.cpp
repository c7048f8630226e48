#include "strata/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <mutex>
#include <unordered_map>

#include "strata/base/error.h"

namespace strata::cuda {
namespace {

struct Account {
  std::mutex mutex;
  std::unordered_map<void*, size_t> sizes;
  uint64_t in_use = 0;
  uint64_t limit = 0;
};

Account& account() {
  static Account a;
  return a;
}

}  // namespace

void* device_alloc(size_t bytes, const std::string& what) {
  if (bytes == 0) bytes = 1;
  Account& a = account();
  std::lock_guard<std::mutex> lock(a.mutex);
  if (a.limit > 0 && a.in_use + bytes > a.limit)
    fail("GPU memory: ", what, " needs ", bytes, " bytes, but ", a.in_use, " of the ", a.limit,
         " bytes strata may use (--gpu-mem) are taken");
  void* p = nullptr;
  const cudaError_t st = cudaMalloc(&p, bytes);
  if (st != cudaSuccess) {
    cudaGetLastError();  // the allocation failure is not sticky: later calls start clean
    fail("GPU memory: cannot allocate ", bytes, " bytes for ", what, " (", a.in_use, " bytes in use by strata): ",
         cudaGetErrorString(st));
  }
  a.sizes.emplace(p, bytes);
  a.in_use += bytes;
  return p;
}

void device_free(void* p) {
  if (!p) return;
  Account& a = account();
  {
    std::lock_guard<std::mutex> lock(a.mutex);
    const auto it = a.sizes.find(p);
    if (it != a.sizes.end()) {
      a.in_use -= it->second;
      a.sizes.erase(it);
    }
  }
  cudaFree(p);
}

void set_device_memory_limit(uint64_t bytes) {
  Account& a = account();
  std::lock_guard<std::mutex> lock(a.mutex);
  if (bytes > 0 && a.in_use > bytes)
    fail("GPU memory: a limit of ", bytes, " bytes is below the ", a.in_use, " bytes strata already holds");
  a.limit = bytes;
}

uint64_t device_memory_limit() {
  Account& a = account();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.limit;
}

uint64_t device_memory_in_use() {
  Account& a = account();
  std::lock_guard<std::mutex> lock(a.mutex);
  return a.in_use;
}

}  // namespace strata::cuda
