// row_topk (kernels.h): a block drafter's candidates per block position, taken on the device.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_math.cuh"
#include "strata/cuda/kernels.h"

namespace strata::cuda {
namespace {

// (v, i) ranks above (w, j): the larger value, the lower index among equals.
__device__ __forceinline__ bool ranks_above(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

__device__ __forceinline__ float finite_or_low(float v) { return isnan(v) ? -INFINITY : v; }

// The block's best (value, index) pair (blockDim.x a multiple of 32, <= 1024); every thread gets it.
__device__ __forceinline__ void block_best(float& v, int& i) {
  __shared__ float pv[32];
  __shared__ int pi[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    const int j = __shfl_xor_sync(0xffffffffu, i, o);
    if (ranks_above(w, j, v, i)) v = w, i = j;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // pv / pi may still be read by a previous call
  if (lane == 0) pv[warp] = v, pi[warp] = i;
  __syncthreads();
  v = pv[0], i = pi[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
    if (ranks_above(pv[w], pi[w], v, i)) v = pv[w], i = pi[w];
}

__global__ void row_topk_kernel(const float* x, int64_t row_stride, int n, int k, int* ids, float* probs, int* count) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * row_stride;
  ids += static_cast<int64_t>(blockIdx.x) * k;
  probs += static_cast<int64_t>(blockIdx.x) * k;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, finite_or_low(row[i]));
  mx = block_max(mx);
  if (!isfinite(mx)) {
    if (threadIdx.x == 0) count[blockIdx.x] = 0;
    return;
  }
  double z = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) z += exp(static_cast<double>(finite_or_low(row[i])) - mx);
  z = block_sum_d(z);
  // The r-th best is the best of the pairs ranked below the (r-1)-th: no list of taken ids to search.
  float last_v = INFINITY;
  int last_i = -1, taken = 0;
  float prev_p = 1.0f;
  for (int r = 0; r < k; ++r) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const float v = finite_or_low(row[i]);
      if (ranks_above(last_v, last_i, v, i) && ranks_above(v, i, bv, bi)) bv = v, bi = i;
    }
    block_best(bv, bi);
    if (!isfinite(bv)) break;  // -inf: the row's finite values are used up
    if (threadIdx.x == 0) {
      const float p = fminf(static_cast<float>(exp(static_cast<double>(bv) - mx) / z), prev_p);
      ids[r] = bi;
      probs[r] = p;
      prev_p = p;
    }
    last_v = bv, last_i = bi;
    ++taken;
  }
  if (threadIdx.x == 0) count[blockIdx.x] = taken;
}

}  // namespace

void row_topk(const float* x, int rows, int64_t row_stride, int n, int k, int* ids, float* probs, int* count,
              cudaStream_t s) {
  check_arg(rows >= 1 && n >= 1 && k >= 1 && k <= kRowTopkMax, "row_topk: rows, n >= 1 and 1 <= k <= kRowTopkMax");
  row_topk_kernel<<<rows, 512, 0, s>>>(x, row_stride, n, k, ids, probs, count);
  check_launch("row_topk");
}

}  // namespace strata::cuda
