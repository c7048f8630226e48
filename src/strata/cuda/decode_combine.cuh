// The MoE output combine of the decode step as a block-level device function, shared by the
// standalone kernel (kernels.cu: moe_combine_add_norm) and the epilogue of the down-projection launch
// (matvec_kernels.cu: GemvCombine), so both compute exactly the same thing:
//   x[j] += sum over the k slots in ascending expert id of weights[s] * ye[s*d + j]
//           (+ sigmoid(*shared_gate) * ys[j] when ys is not null; 1 * ys[j] when shared_gate is null),
//   then, when norm_w is not null, xn = rmsnorm(x) * norm_w (mean of squares accumulated in double).
// Everything but norm_w is read through L2 (__ldcg): in an epilogue other blocks of the same launch wrote ye
// and ys (the rest comes from earlier launches; reading it the same way costs nothing).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/device_math.cuh"

namespace strata::cuda {

// k <= 64; blockDim.x a multiple of 32 and >= k.
__device__ __forceinline__ void moe_combine_norm_block(float* x, const float* ye, const int* ids, const float* weights,
                                                       int k, int d, const float* ys, const float* shared_gate,
                                                       const float* norm_w, float eps, float* xn) {
  __shared__ int order[64], sid[64];
  __shared__ float sw[64];
  // Slots in ascending expert id: each slot finds its place by counting, in parallel (ids are distinct;
  // equal ones would keep slot order).
  if (static_cast<int>(threadIdx.x) < k) sid[threadIdx.x] = __ldcg(ids + threadIdx.x);
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < k) {
    const int t = static_cast<int>(threadIdx.x), me = sid[t];
    int r = 0;
    for (int u = 0; u < k; ++u) r += sid[u] < me || (sid[u] == me && u < t);
    order[r] = t;
    sw[r] = __ldcg(weights + t);
  }
  __syncthreads();
  const float sg = ys ? (shared_gate ? 1.0f / (1.0f + expf(-__ldcg(shared_gate))) : 1.0f) : 0.0f;
  double ss = 0.0;
  // kCols columns per thread at a time (j0 + i * blockDim.x, ascending j as a plain loop would take
  // them) and kSlots slots' loads for them in flight together: one block does this for the whole
  // launch, and every dependent L2 round trip is on the decode step's critical path (with kCols = 8 and
  // two slots per round trip, a 2048-wide combine of 8 experts waited four; now it waits two).
  constexpr int kCols = 4, kSlots = 8;
  const int bd = static_cast<int>(blockDim.x);
  for (int j0 = threadIdx.x; j0 < d; j0 += kCols * bd) {
    float acc[kCols];
#pragma unroll
    for (int i = 0; i < kCols; ++i) acc[i] = 0.0f;
    for (int s0 = 0; s0 < k; s0 += kSlots) {
      float v[kSlots][kCols];
#pragma unroll
      for (int q = 0; q < kSlots; ++q) {
        const int s = s0 + q;
        const float* src = ye + static_cast<int64_t>(s < k ? order[s] : 0) * d;
#pragma unroll
        for (int i = 0; i < kCols; ++i) {
          const int j = j0 + i * bd;
          v[q][i] = (s < k && j < d) ? __ldcg(src + j) : 0.0f;
        }
      }
#pragma unroll
      for (int q = 0; q < kSlots; ++q) {
        if (s0 + q >= k) break;
        const float w = sw[s0 + q];
#pragma unroll
        for (int i = 0; i < kCols; ++i) acc[i] += w * v[q][i];
      }
    }
#pragma unroll
    for (int i = 0; i < kCols; ++i) {
      const int j = j0 + i * bd;
      if (j < d) {
        float a = acc[i];
        if (ys) a += sg * __ldcg(ys + j);
        const float nx = __ldcg(x + j) + a;
        x[j] = nx;
        ss += static_cast<double>(nx) * nx;
      }
    }
  }
  if (!norm_w) return;  // uniform
  ss = block_sum_d(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
  for (int j = threadIdx.x; j < d; j += blockDim.x) xn[j] = x[j] * inv * norm_w[j];
}

}  // namespace strata::cuda
