// Kernels of the hybrid hot/cold MoE decode step (see hybrid_kernels.h for each one's contract).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_math.cuh"
#include "strata/cuda/hybrid_kernels.h"
#include "strata/cuda/route_warp.cuh"

namespace strata::cuda {
namespace {

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- route + ring ----------------------------------------------------------------------------------
// One block routes the tokens one after another (each token's warp_route and counts as a launch of its
// own would do them), then writes every input row with a cold pick and the job. Warp 0 routes and
// classifies (a lane per pick, so the slot-map loads overlap); the block meets only after the tokens.
__global__ void route_ring_kernel(int il, const float* logits, int n_expert, int k, RouteRule rule, const int* slot_of,
                                  const float* x, const float* norm_w, float eps, int d, HybridRing r, int n_tokens,
                                  int64_t logits_stride, int64_t x_stride) {
  __shared__ int chosen[kHybridMaxK];
  __shared__ float chosen_p[kHybridMaxK];
  __shared__ float p[1024];
  __shared__ int picked[kHybridMaxTokens * kHybridMaxK];
  __shared__ int cold_of[kHybridMaxTokens];  // cold picks per token
  __shared__ int n_cold;
  __shared__ unsigned long long seq;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    unsigned long long* per_expert = r.expert_picks + static_cast<size_t>(il) * static_cast<size_t>(n_expert);
    const int pinned = r.pinned[il];
    for (int t = 0; t < n_tokens; ++t) {
      warp_route(logits + t * logits_stride, n_expert, k, chosen, chosen_p, p, &rule, t);
      __syncwarp();
      int n = 0, hits = 0;
      for (int q = lane; q < k; q += 32) {
        const int e = chosen[q];
        const int slot = slot_of[e];
        n += slot < 0 ? 1 : 0;
        hits += slot >= pinned ? 1 : 0;
        atomicAdd(per_expert + e, 1ull);
        picked[t * k + q] = e;
      }
      for (int o = 16; o > 0; o >>= 1) {
        n += __shfl_xor_sync(0xffffffffu, n, o);
        hits += __shfl_xor_sync(0xffffffffu, hits, o);
      }
      if (lane == 0) {
        cold_of[t] = n;
        atomicAdd(r.calls + il, 1ull);
        atomicAdd(r.cold_picks + il, static_cast<unsigned long long>(n));
        if (hits > 0) atomicAdd(r.cache_hits + il, static_cast<unsigned long long>(hits));
      }
      __syncwarp();  // chosen[] is the next token's
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int n = 0;
    for (int t = 0; t < n_tokens; ++t) n += cold_of[t];
    n_cold = n;
    seq = n > 0 ? atomicAdd(&r.ctr->seq, 1ull) + 1 : 0;
    if (n > 0) atomicAdd(&r.ctr->jobs, 1ull);
    r.wait_seq[il] = seq;
  }
  __syncthreads();
  if (n_cold == 0) return;  // fast path: nothing leaves the GPU
  for (int t = 0; t < n_tokens; ++t) {
    if (cold_of[t] == 0) continue;  // block-uniform
    const float* xt = x + t * x_stride;
    double ss = 0.0;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += static_cast<double>(xt[i]) * xt[i];
    ss = block_sum_d(ss);
    const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
    volatile float* xh = r.xn_host + static_cast<int64_t>(t) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) xh[i] = xt[i] * inv * norm_w[i];
  }
  volatile HostJob* j = r.job;
  for (int q = threadIdx.x; q < n_tokens * k; q += blockDim.x) {
    j->ids[q] = picked[q];
    j->cold[q] = slot_of[picked[q]] < 0 ? 1 : 0;
  }
  if (threadIdx.x == 0) {
    j->layer = il;
    j->k = k;
    j->n_tokens = n_tokens;
    j->n_cold = n_cold;
  }
  // Every thread's writes reach host memory before the doorbell.
  __threadfence_system();
  __syncthreads();
  // The doorbell needs no fence after it: the store leaves at once, and a system-scope fence would only
  // hold the kernel's end (and the hot experts' launch after it) until the store is performed.
  if (threadIdx.x == 0) {
    r.ctr->rung_at = global_ns();
    j->doorbell = seq;
  }
}

// ---- cold add --------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long ld_acquire_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Token blockIdx.y's row; every block with cold rows to add waits for the job itself.
__global__ void cold_add_kernel(int il, float* x, const int* ids, const float* weights, const int* slot_of, int k,
                                int d, HybridRing r, unsigned long long timeout_ns, int64_t x_stride) {
  const unsigned long long want = r.wait_seq[il];
  if (want == 0) return;  // no cold pick in this layer
  const int tok = static_cast<int>(blockIdx.y);
  ids += tok * k;
  weights += tok * k;
  x += tok * x_stride;
  __shared__ int order[kHybridMaxK];
  __shared__ int n_cold;
  // The block that times the wait (telemetry) waits even when its token has no cold pick.
  const bool timer = blockIdx.x == 0 && tok == 0;
  if (threadIdx.x == 0) {
    int all[kHybridMaxK];
    slots_in_ascending_id(ids, k, all);  // the CPU engine sums experts in that order
    int n = 0;
    for (int q = 0; q < k; ++q)
      if (slot_of[ids[all[q]]] < 0) order[n++] = all[q];
    n_cold = n;
  }
  __syncthreads();
  if (n_cold == 0 && !timer) return;  // a token without cold picks keeps its row as its own step would
  if (threadIdx.x == 0) {
    const unsigned long long* done = &r.job->done;
    const unsigned long long t0 = global_ns();
    // An acquire load: the rows the CPU wrote before `done` are read after it (a relaxed poll and the
    // block barrier alone would not order this thread's load before the other threads' row reads).
    while (ld_acquire_sys(done) < want) {
      if (global_ns() - t0 > timeout_ns) {
        if (timer) {
          printf("strata hybrid MoE: no answer from the CPU cold-expert workers for job %llu after %.1f s\n", want,
                 static_cast<double>(timeout_ns) * 1e-9);
          atomicAdd(&r.ctr->timeouts, 1ull);
        }
        __trap();
      }
      __nanosleep(200);
    }
    if (timer) {
      const unsigned long long t1 = global_ns();
      atomicAdd(&r.ctr->wait_ns, t1 - t0);
      atomicAdd(&r.ctr->answer_ns, t1 - r.ctr->rung_at);
    }
  }
  __syncthreads();
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d || n_cold == 0) return;
  // Up to eight cold rows' values requested before any is used (each is a PCIe round trip; loading one
  // per use would serialise them), then added in the engine's order.
  constexpr int kBatch = 8;
  float acc = 0.0f;
  for (int q0 = 0; q0 < n_cold; q0 += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      v[i] = q0 + i < n_cold ? __ldcv(r.ye_cold + (static_cast<int64_t>(tok) * k + order[q0 + i]) * d + j) : 0.0f;
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
      if (q0 + i < n_cold) acc += weights[order[q0 + i]] * v[i];
  }
  x[j] += acc;
}

// ---- uncount ---------------------------------------------------------------------------------------
__global__ void hybrid_uncount_kernel(const int* ids, int n_layer, int k, int n_expert, const int* slot_maps,
                                      HybridRing r) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_layer * k) return;
  const int il = i / k;
  const int e = ids[i];
  if (e < 0 || e >= n_expert) return;
  constexpr unsigned long long kMinusOne = ~0ull;  // atomicAdd of -1 (mod 2^64)
  atomicAdd(r.expert_picks + static_cast<size_t>(il) * static_cast<size_t>(n_expert) + e, kMinusOne);
  const int slot = slot_maps[static_cast<size_t>(il) * static_cast<size_t>(n_expert) + e];
  if (slot < 0) atomicAdd(r.cold_picks + il, kMinusOne);
  if (slot >= r.pinned[il]) atomicAdd(r.cache_hits + il, kMinusOne);
  if (i % k == 0) {
    atomicAdd(r.calls + il, kMinusOne);
    const int* layer = ids + static_cast<size_t>(il) * static_cast<size_t>(k);
    const int* slots = slot_maps + static_cast<size_t>(il) * static_cast<size_t>(n_expert);
    bool cold = false;
    for (int q = 0; q < k; ++q) cold = cold || (layer[q] >= 0 && layer[q] < n_expert && slots[layer[q]] < 0);
    if (cold) atomicAdd(&r.ctr->jobs, kMinusOne);
  }
}

// ---- slot-map writes --------------------------------------------------------------------------------
__global__ void write_slots_kernel(int* slot_maps, SlotWrites w) {
  for (int i = 0; i < w.n; ++i) slot_maps[w.index[i]] = w.slot[i];
}

}  // namespace

void hybrid_route_ring(int il, const float* logits, int n_expert, int k, const RouteRule& rule, const int* slot_of,
                       const float* x, const float* norm_w, float eps, int d, const HybridRing& ring, cudaStream_t s,
                       int n_tokens, int64_t logits_stride, int64_t x_stride) {
  check_arg(k >= 1 && k <= kHybridMaxK && k <= n_expert && n_expert <= 1024,
            "hybrid_route_ring: 1 <= k <= 64 and n_expert <= 1024");
  check_arg(n_tokens >= 1 && n_tokens <= kHybridMaxTokens && (n_tokens == 1 || !rule.replay || rule.replay_stride > 0),
            "hybrid_route_ring: 1..kHybridMaxTokens tokens, replayed picks of several tokens need their stride");
  route_ring_kernel<<<1, 256, 0, s>>>(il, logits, n_expert, k, rule, slot_of, x, norm_w, eps, d, ring, n_tokens,
                                      logits_stride, x_stride);
  check_launch("hybrid_route_ring");
}

void hybrid_cold_add(int il, float* x, const int* ids, const float* weights, const int* slot_of, int k, int d,
                     const HybridRing& ring, double timeout_s, cudaStream_t s, int n_tokens, int64_t x_stride) {
  check_arg(k >= 1 && k <= kHybridMaxK, "hybrid_cold_add: 1 <= k <= 64");
  check_arg(n_tokens >= 1 && n_tokens <= kHybridMaxTokens, "hybrid_cold_add: 1..kHybridMaxTokens tokens");
  const int threads = 256;
  cold_add_kernel<<<dim3((d + threads - 1) / threads, n_tokens), threads, 0, s>>>(
      il, x, ids, weights, slot_of, k, d, ring, static_cast<unsigned long long>(timeout_s * 1e9), x_stride);
  check_launch("hybrid_cold_add");
}

void hybrid_uncount(const int* ids, int n_layer, int k, int n_expert, const int* slot_maps, const HybridRing& ring,
                    cudaStream_t s) {
  const int n = n_layer * k;
  if (n == 0) return;
  hybrid_uncount_kernel<<<(n + 255) / 256, 256, 0, s>>>(ids, n_layer, k, n_expert, slot_maps, ring);
  check_launch("hybrid_uncount");
}

void hybrid_write_slots(int* slot_maps, const SlotWrites& w, cudaStream_t s) {
  check_arg(w.n >= 0 && w.n <= kMaxSlotWrites, "hybrid_write_slots: 0..128 writes");
  if (w.n == 0) return;
  write_slots_kernel<<<1, 1, 0, s>>>(slot_maps, w);
  check_launch("hybrid_write_slots");
}

}  // namespace strata::cuda
