// Device halves of the hybrid decode mailbox (hybrid_kernels.h), shared by the stand-alone hybrid kernels
// and the router launch's route epilogue, which posts a layer's cold picks (GemvRoute::post_ring).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "strata/cuda/device_math.cuh"
#include "strata/cuda/hybrid_kernels.h"

namespace strata::cuda {

__device__ __forceinline__ unsigned long long hybrid_global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// By the whole block (block-uniform call), after chosen[0..k) (shared memory) holds layer il's picks:
// counts them into the model's counters, takes a job number when some pick is cold (wait_seq[il], 0
// without one), and then writes xn = rmsnorm(x) * norm_w (rmsnorm_rows' arithmetic) and the job to
// host memory, fences and rings the doorbell.
static __device__ __noinline__ void hybrid_post_block(const HybridRing& r, int il, const int* chosen, int k, int n_expert,
                                               const int* slot_of, const float* x, const float* norm_w, float eps,
                                               int d) {
  __shared__ int n_cold;
  __shared__ unsigned long long seq;
  if (threadIdx.x == 0) {
    int n = 0, hits = 0;
    unsigned long long* per_expert = r.expert_picks + static_cast<size_t>(il) * static_cast<size_t>(n_expert);
    for (int q = 0; q < k; ++q) {
      const int slot = __ldcg(slot_of + chosen[q]);
      n += slot < 0 ? 1 : 0;
      hits += slot >= r.pinned[il] ? 1 : 0;
      atomicAdd(per_expert + chosen[q], 1ull);
    }
    n_cold = n;
    atomicAdd(r.calls + il, 1ull);
    atomicAdd(r.cold_picks + il, static_cast<unsigned long long>(n));
    if (hits > 0) atomicAdd(r.cache_hits + il, static_cast<unsigned long long>(hits));
    seq = n > 0 ? atomicAdd(&r.ctr->seq, 1ull) + 1 : 0;
    if (n > 0) atomicAdd(&r.ctr->jobs, 1ull);
    r.wait_seq[il] = seq;
  }
  __syncthreads();
  if (n_cold == 0) return;  // fast path: nothing leaves the GPU
  double ss = 0.0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = __ldcg(x + i);
    ss += static_cast<double>(v) * v;
  }
  ss = block_sum_d(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
  volatile float* xh = r.xn_host;
  for (int i = threadIdx.x; i < d; i += blockDim.x) xh[i] = __ldcg(x + i) * inv * norm_w[i];
  if (threadIdx.x == 0) {
    volatile HostJob* j = r.job;
    j->layer = il;
    j->k = k;
    j->n_cold = n_cold;
    for (int q = 0; q < k; ++q) {
      j->ids[q] = chosen[q];
      j->cold[q] = __ldcg(slot_of + chosen[q]) < 0 ? 1 : 0;
    }
  }
  // Every thread's writes reach host memory before the doorbell.
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile HostJob* j = r.job;
    j->doorbell = seq;
    __threadfence_system();
  }
}

// By one thread: when layer il posted a job (wait_seq[il] > 0), waits until the CPU finished it (block 0
// adds the wait to ctr->wait_ns; past timeout_ns it reports and traps) and writes into order[] the picks
// whose rows the CPU computed, in ascending expert id (the CPU engine's combine order); returns how
// many (0 without a job).
static __device__ __noinline__ int hybrid_wait_cold(const HybridRing& r, int il, const int* ids, const int* slot_of, int k,
                                             unsigned long long timeout_ns, int* order) {
  const unsigned long long want = __ldcg(r.wait_seq + il);
  if (want == 0) return 0;
  // __ldcv: fetch again every time (the line lives in host memory and the CPU rewrites it).
  const unsigned long long* done = &r.job->done;
  const unsigned long long t0 = hybrid_global_ns();
  while (__ldcv(done) < want) {
    if (hybrid_global_ns() - t0 > timeout_ns) {
      if (blockIdx.x == 0) {
        printf("strata hybrid MoE: no answer from the CPU cold-expert workers for job %llu after %.1f s\n", want,
               static_cast<double>(timeout_ns) * 1e-9);
        atomicAdd(&r.ctr->timeouts, 1ull);
      }
      __trap();
    }
    __nanosleep(200);
  }
  if (blockIdx.x == 0) atomicAdd(&r.ctr->wait_ns, hybrid_global_ns() - t0);
  int all[kHybridMaxK];
  int own[kHybridMaxK];
  for (int q = 0; q < k; ++q) own[q] = __ldcg(ids + q);
  slots_in_ascending_id(own, k, all);
  int n = 0;
  for (int q = 0; q < k; ++q)
    if (__ldcg(slot_of + own[all[q]]) < 0) order[n++] = all[q];
  return n;
}

// sum over q < n_cold of weights[order[q]] * ye_cold[order[q]][j], in that order (the CPU's rows, read
// from host memory).
static __device__ __forceinline__ float hybrid_cold_sum(const HybridRing& r, const int* order, int n_cold, const float* weights,
                                                 int d, int j) {
  float acc = 0.0f;
  for (int q = 0; q < n_cold; ++q) {
    const int o = order[q];
    acc += __ldcg(weights + o) * __ldcv(r.ye_cold + static_cast<int64_t>(o) * d + j);
  }
  return acc;
}

}  // namespace strata::cuda
