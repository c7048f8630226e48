// Kernels of the hybrid hot/cold MoE decode step (see hybrid_kernels.h for each one's contract).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/device_math.cuh"
#include "strata/cuda/hybrid_device.cuh"
#include "strata/cuda/hybrid_kernels.h"
#include "strata/cuda/route_warp.cuh"

namespace strata::cuda {
namespace {

// ---- route + ring ----------------------------------------------------------------------------------
__global__ void route_ring_kernel(int il, const float* logits, int n_expert, int k, bool norm_topk, RouteRule rule,
                                  int* ids, float* weights, unsigned long long* seq_picks, const int* slot_of,
                                  const float* x, const float* norm_w, float eps, int d, HybridRing r) {
  __shared__ int chosen[kHybridMaxK];
  __shared__ float chosen_p[kHybridMaxK];
  __shared__ float p[1024];
  pdl_enter();
  if (threadIdx.x < 32) {
    warp_route(logits, n_expert, k, chosen, chosen_p, p, &rule);
    warp_route_store(chosen, chosen_p, k, norm_topk, ids, weights, seq_picks, rule.scale);
  }
  __syncthreads();
  hybrid_post_block(r, il, chosen, k, n_expert, slot_of, x, norm_w, eps, d);
}

// ---- cold add --------------------------------------------------------------------------------------
__global__ void cold_add_kernel(int il, float* x, const int* ids, const float* weights, const int* slot_of, int k, int d,
                                HybridRing r, unsigned long long timeout_ns) {
  __shared__ int order[kHybridMaxK];
  __shared__ int n_cold;
  pdl_enter();
  if (threadIdx.x == 0) n_cold = hybrid_wait_cold(r, il, ids, slot_of, k, timeout_ns, order);
  __syncthreads();
  if (n_cold == 0) return;  // no cold pick in this layer
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  x[j] += hybrid_cold_sum(r, order, n_cold, weights, d, j);
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

void hybrid_route_ring(int il, const float* logits, int n_expert, int k, bool norm_topk, const RouteRule& rule, int* ids,
                       float* weights, unsigned long long* seq_picks, const int* slot_of, const float* x,
                       const float* norm_w, float eps, int d, const HybridRing& ring, cudaStream_t s) {
  check_arg(k >= 1 && k <= kHybridMaxK && k <= n_expert && n_expert <= 1024,
            "hybrid_route_ring: 1 <= k <= 64 and n_expert <= 1024");
  launch_pdl("hybrid_route_ring", route_ring_kernel, dim3(1), dim3(256), 0, s, il, logits, n_expert, k, norm_topk, rule,
             ids, weights, seq_picks, slot_of, x, norm_w, eps, d, ring);
}

void hybrid_cold_add(int il, float* x, const int* ids, const float* weights, const int* slot_of, int k, int d,
                     const HybridRing& ring, double timeout_s, cudaStream_t s) {
  check_arg(k >= 1 && k <= kHybridMaxK, "hybrid_cold_add: 1 <= k <= 64");
  const int threads = 256;
  launch_pdl("hybrid_cold_add", cold_add_kernel, dim3((d + threads - 1) / threads), dim3(threads), 0, s, il, x, ids,
             weights, slot_of, k, d, ring, static_cast<unsigned long long>(timeout_s * 1e9));
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
