// Kernels of the hybrid hot/cold MoE step (see hybrid_kernels.h for each one's contract).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_math.cuh"
#include "strata/cuda/hybrid_kernels.h"

namespace strata::cuda {
namespace {

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- ring ------------------------------------------------------------------------------------------
__global__ void ring_kernel(int il, const int* ids, int k, const int* slot_of, const float* xn, int d, HostJob* job,
                            float* xn_host, HybridDevCounters* ctr, unsigned long long* wait_seq,
                            unsigned long long* calls, unsigned long long* cold_picks,
                            unsigned long long* expert_picks, unsigned long long* seq_picks) {
  __shared__ int n_cold;
  __shared__ unsigned long long seq;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int p = 0; p < k; ++p) {
      n += slot_of[ids[p]] < 0 ? 1 : 0;
      expert_picks[ids[p]] += 1;
      if (seq_picks) seq_picks[ids[p]] += 1;
    }
    n_cold = n;
    calls[il] += 1;
    cold_picks[il] += static_cast<unsigned long long>(n);
    seq = 0;
    if (n > 0) seq = ++ctr->seq;
    wait_seq[il] = seq;
  }
  __syncthreads();
  if (n_cold == 0) return;  // fast path: nothing leaves the GPU
  volatile float* xh = xn_host;
  for (int i = threadIdx.x; i < d; i += blockDim.x) xh[i] = xn[i];
  if (threadIdx.x == 0) {
    volatile HostJob* j = job;
    j->layer = il;
    j->k = k;
    j->n_cold = n_cold;
    for (int p = 0; p < k; ++p) {
      j->ids[p] = ids[p];
      j->cold[p] = slot_of[ids[p]] < 0 ? 1 : 0;
    }
  }
  // Every thread's writes reach host memory before the doorbell.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile HostJob* j = job;
    j->doorbell = seq;
    __threadfence_system();
  }
}

// ---- combine ---------------------------------------------------------------------------------------
__global__ void combine_kernel(float* x, const float* ye_hot, const float* ye_cold, const int* ids, const int* slot_of,
                               const float* weights, int k, int d, const float* ys, const float* shared_gate,
                               const unsigned long long* wait_seq, const HostJob* job, HybridDevCounters* ctr,
                               unsigned long long timeout_ns) {
  __shared__ int order[kHybridMaxK];
  __shared__ int is_cold[kHybridMaxK];
  if (threadIdx.x == 0) {
    const unsigned long long want = *wait_seq;
    if (want > 0) {
      // __ldcv: fetch again every time (the line lives in host memory and the CPU rewrites it).
      const unsigned long long* done = &job->done;
      const unsigned long long t0 = global_ns();
      while (__ldcv(done) < want) {
        if (global_ns() - t0 > timeout_ns) {
          if (blockIdx.x == 0) {
            printf("strata hybrid MoE: no answer from the CPU cold-expert workers for job %llu after %.1f s\n", want,
                   static_cast<double>(timeout_ns) * 1e-9);
            atomicAdd(&ctr->timeouts, 1ull);
          }
          __trap();
        }
        __nanosleep(200);
      }
      if (blockIdx.x == 0) atomicAdd(&ctr->wait_ns, global_ns() - t0);
    }
    for (int p = 0; p < k; ++p) is_cold[p] = slot_of[ids[p]] < 0 ? 1 : 0;
    slots_in_ascending_id(ids, k, order);  // the CPU engine sums experts in that order
  }
  __syncthreads();
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0.0f;
  for (int p = 0; p < k; ++p) {
    const int o = order[p];
    const int64_t at = static_cast<int64_t>(o) * d + j;
    const float v = is_cold[o] ? __ldcv(ye_cold + at) : ye_hot[at];
    acc += weights[o] * v;
  }
  if (ys) acc += sigmoid_dev(*shared_gate) * ys[j];
  x[j] += acc;
}

}  // namespace

void hybrid_ring(int il, const int* ids, int k, const int* slot_of, const float* xn, int d, HostJob* job,
                 float* xn_host, HybridDevCounters* ctr, unsigned long long* wait_seq, unsigned long long* calls,
                 unsigned long long* cold_picks, unsigned long long* expert_picks, unsigned long long* seq_picks,
                 cudaStream_t s) {
  check_arg(k >= 1 && k <= kHybridMaxK, "hybrid_ring: 1 <= k <= 64");
  ring_kernel<<<1, 256, 0, s>>>(il, ids, k, slot_of, xn, d, job, xn_host, ctr, wait_seq, calls, cold_picks, expert_picks,
                                   seq_picks);
  check_launch("hybrid_ring");
}

void hybrid_combine_add(float* x, const float* ye_hot, const float* ye_cold, const int* ids, const int* slot_of,
                        const float* weights, int k, int d, const float* ys, const float* shared_gate,
                        const unsigned long long* wait_seq, const HostJob* job, HybridDevCounters* ctr,
                        double timeout_s, cudaStream_t s) {
  check_arg(k >= 1 && k <= kHybridMaxK, "hybrid_combine_add: 1 <= k <= 64");
  const int threads = 256;
  const int blocks = (d + threads - 1) / threads;
  combine_kernel<<<blocks, threads, 0, s>>>(x, ye_hot, ye_cold, ids, slot_of, weights, k, d, ys, shared_gate, wait_seq,
                                            job, ctr, static_cast<unsigned long long>(timeout_s * 1e9));
  check_launch("hybrid_combine_add");
}

}  // namespace strata::cuda
