// The uncount kernel of the decode lookahead and the host's wait for a published pick (decode_lookahead.h).
#include "strata/cuda/decode_lookahead.h"

#include <cuda_runtime.h>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata::cuda {
namespace {

__global__ void uncount_kernel(const int* ids, int n_layer, int k, int n_expert, unsigned long long* counts) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_layer * k; i += gridDim.x * blockDim.x) {
    const int il = i / k;
    if (ids[i] < 0) continue;  // a layer that routes nothing (a dense feed-forward) keeps -1
    atomicAdd(counts + static_cast<int64_t>(il) * n_expert + ids[i], ~0ull);  // - 1 (mod 2^64)
  }
}

}  // namespace

void LookaheadLink::allocate() {
  void* p = nullptr;
  check_cuda(cudaHostAlloc(&p, 2 * sizeof(unsigned long long), cudaHostAllocMapped), "cudaHostAlloc(lookahead)");
  host_pick = static_cast<unsigned long long*>(p);
  host_pick[0] = host_pick[1] = 0;
  void* d = nullptr;
  check_cuda(cudaHostGetDevicePointer(&d, p, 0), "cudaHostGetDevicePointer(lookahead)");
  dev_pick = static_cast<unsigned long long*>(d);
  dev_count = static_cast<unsigned long long*>(device_alloc(sizeof(unsigned long long), "the decode lookahead"));
  check_cuda(cudaMemset(dev_count, 0, sizeof(unsigned long long)), "cudaMemset(lookahead)");
  launched = 0;
}

void LookaheadLink::release() {
  if (host_pick) cudaFreeHost(host_pick);
  device_free(dev_count);
  host_pick = dev_pick = dev_count = nullptr;
}

int32_t LookaheadLink::wait(cudaStream_t s, unsigned long long n) const {
  const volatile unsigned long long* w = host_pick + (n & 1);
  const unsigned long long want = n & 0xffffffffull;
  for (unsigned spin = 1;; ++spin) {
    const unsigned long long v = *w;
    if ((v >> 32) == want) return static_cast<int32_t>(static_cast<uint32_t>(v));
    if ((spin & 4095u) == 0) {  // a failed kernel never publishes: look at the stream now and then
      const cudaError_t st = cudaStreamQuery(s);
      if (st != cudaErrorNotReady) {
        check_cuda(st, "decode step (lookahead)");
        if ((*w >> 32) != want) fail("CUDA backend: a decode step ended without publishing its pick (lookahead)");
      }
    }
#if defined(__x86_64__)
    _mm_pause();
#endif
  }
}

void uncount_routes(const int* ids, int n_layer, int k, int n_expert, unsigned long long* counts, cudaStream_t s) {
  const int n = n_layer * k;
  if (n == 0) return;
  uncount_kernel<<<(n + 255) / 256, 256, 0, s>>>(ids, n_layer, k, n_expert, counts);
  check_launch("uncount_routes");
}

}  // namespace strata::cuda
