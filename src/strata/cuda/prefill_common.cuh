// Device helpers shared by the prefill_*.cu kernels: warp / block reductions and the activations, with
// the same float expressions as the decode kernels (kernels.cu) so both paths round alike.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::prefill {

__device__ __forceinline__ float pf_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double pf_warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float pf_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in double (blockDim.x a multiple of 32). Every thread gets the result.
__device__ __forceinline__ double pf_block_sum_d(double v) {
  __shared__ double part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = pf_warp_sum_d(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  double t = 0.0;
  for (int i = 0; i < nw; ++i) t += part[i];
  return t;
}

__device__ __forceinline__ float pf_block_max(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = pf_warp_max(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  float t = part[0];
  for (int i = 1; i < nw; ++i) t = fmaxf(t, part[i]);
  return t;
}

__device__ __forceinline__ float pf_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float pf_silu(float x) { return x / (1.0f + expf(-x)); }

inline int pf_blocks(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }
inline int pf_warp_round(int n) { return ((n + 31) / 32) * 32; }

}  // namespace strata::cuda::prefill
