// Device helpers every CUDA kernel file shares: warp and block reductions (sums of squares in double,
// as the CPU ops accumulate them), the activations with the CPU's float expressions, launch-size
// arithmetic, and RMSNorm + NEOX rotary of one head. One copy, so the decode, prefill and hybrid
// kernels round alike.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace strata {
struct RopeYarn;
}

namespace strata::cuda {

// Values kept as float or __half (KV cache rows): read as float; stored rounded to nearest even, as
// the CPU's fp32_to_fp16.
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ float kv_load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void kv_store(__half* p, float v) { *p = __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum in double (blockDim.x a multiple of 32, <= 1024). Every thread gets the result.
__device__ __forceinline__ double block_sum_d(double v) {
  __shared__ double part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  double t = 0.0;
  for (int i = 0; i < nw; ++i) t += part[i];
  return t;
}

// Block-wide maximum (blockDim.x a multiple of 32, <= 1024). Every thread gets the result.
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int nw = (blockDim.x + 31) >> 5;
  float t = part[0];
  for (int i = 1; i < nw; ++i) t = fmaxf(t, part[i]);
  return t;
}

// Whether this block is the last of the grid to reach this call (then every other block's writes before
// it are visible to this block through L2: read them with __ldcg); the last block resets the counter for
// the next launch. Every thread of every block calls it. One thread per block fences, after the block's
// barrier (the pattern of cooperative groups' grid sync: the fence is cumulative over the writes the
// barrier ordered before it); a fence in every thread stalled every warp on the memory barrier.
__device__ inline bool last_block_of(unsigned int* counter) {
  __shared__ bool last;
  __syncthreads();  // the block's writes are ordered before thread 0's fence
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
    if (last) {
      __threadfence();  // the other blocks' writes are visible to this block's reads that follow
      *counter = 0;
    }
  }
  __syncthreads();
  return last;
}

// A float's place in the float order as an unsigned key (larger float, larger key; -0 below +0, NaN
// beyond the infinities), so an arg-max or a radix select works on integers; order_key_float inverts it.
__device__ __forceinline__ unsigned int float_order_key(float v) {
  const unsigned int b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float order_key_float(unsigned int k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_dev(float x) { return x / (1.0f + expf(-x)); }
// softplus as torch computes it (cpu/ops.h softplusf): x above 20, else log1p(exp(x)).
__device__ __forceinline__ float softplus_dev(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// order[0..k) = the slot indices 0..k-1 sorted by ids[slot], ascending (stable; one thread, k small): the
// order in which the CPU engine sums a token's experts.
__device__ __forceinline__ void slots_in_ascending_id(const int* ids, int k, int* order) {
  for (int s = 0; s < k; ++s) order[s] = s;
  for (int a = 1; a < k; ++a)
    for (int b = a; b > 0 && ids[order[b]] < ids[order[b - 1]]; --b) {
      const int tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
}

inline int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }
inline int warp_round(int n) { return ((n + 31) / 32) * 32; }

// cos and sin of the NEOX rotary angle of pair i (< rope_dims / 2) at position pos, as the CPU's
// rope_neox_inplace computes them: inverse frequency in double rounded to float, angle rounded to float,
// cos/sin in double. Independent of the activations, so a kernel can compute it before it waits on the
// previous kernel (the double-precision pow/cos/sin are a few microseconds of latency).
__device__ __forceinline__ float2 rope_cos_sin(int64_t pos, int i, int rope_dims, float freq_base) {
  const float inv_freq = static_cast<float>(pow(static_cast<double>(freq_base), -2.0 * i / rope_dims));
  const double angle = static_cast<float>(static_cast<float>(pos) * inv_freq);
  return make_float2(static_cast<float>(cos(angle)), static_cast<float>(sin(angle)));
}

// YaRN's rotary parameters as the kernels take them: the ramp's low end and span over the dims (from
// the betas, computed on the host in double as rope_neox_yarn_inplace does), factor and mscale.
struct YarnDev {
  float factor = 1.0f;  // 1: plain rotary
  double low = 0.0, span = 1.0;
  float mscale = 1.0f;
};

// The kernels' YaRN parameters of a layer's rotary (yarn null or off: plain rotary), the ramp's ends
// computed as rope_neox_yarn_inplace computes them (kernels.cu).
YarnDev yarn_dev(const RopeYarn* yarn, int rope_dims, float freq_base);

// rope_cos_sin under YaRN: the inverse frequency blended between interpolated and extrapolated by the
// ramp, cos/sin times mscale (rope_neox_yarn_inplace's float roundings).
__device__ __forceinline__ float2 rope_cos_sin_yarn(int64_t pos, int i, int rope_dims, float freq_base, const YarnDev& y) {
  const float pos_freq = static_cast<float>(pow(static_cast<double>(freq_base), 2.0 * i / rope_dims));
  const float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / (y.factor * pos_freq);
  const float keep = static_cast<float>(1.0 - fmin(fmax((i - y.low) / y.span, 0.0), 1.0));
  const float inv_freq = interpolated * (1.0f - keep) + extrapolated * keep;
  const double angle = static_cast<float>(static_cast<float>(pos) * inv_freq);
  return make_float2(static_cast<float>(cos(angle)) * y.mscale, static_cast<float>(sin(angle)) * y.mscale);
}

// One head, one block (blockDim.x >= head_dim): o = RMSNorm(x) * w, then NEOX rotary on the first
// rope_dims dims with cs = rope_cos_sin(pos, threadIdx.x, ...) (used by threads < rope_dims / 2), the
// rest copied. buf: head_dim floats of shared memory. o may equal x.
template <typename T>
__device__ __forceinline__ void norm_rope_head_cs(const float* x, T* o, int head_dim, const float* w, float eps,
                                                  int rope_dims, float2 cs, float* buf) {
  const int i = threadIdx.x;
  const float xi = i < head_dim ? x[i] : 0.0f;
  const double ss = block_sum_d(static_cast<double>(xi) * xi);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(head_dim) + eps));
  if (i < head_dim) buf[i] = xi * inv * w[i];
  __syncthreads();
  const int half = rope_dims / 2;
  if (i < half) {
    const float a = buf[i], b = buf[i + half];
    kv_store(o + i, a * cs.x - b * cs.y);
    kv_store(o + i + half, b * cs.x + a * cs.y);
  } else if (i >= rope_dims && i < head_dim) {
    kv_store(o + i, buf[i]);
  }
}

// The rotary cos/sin of pair i at position pos: YaRN's when y is on (factor != 1), else the plain one.
__device__ __forceinline__ float2 rope_cos_sin_at(int64_t pos, int i, int rope_dims, float freq_base, const YarnDev& y) {
  return y.factor != 1.0f ? rope_cos_sin_yarn(pos, i, rope_dims, freq_base, y) : rope_cos_sin(pos, i, rope_dims, freq_base);
}

// norm_rope_head_cs at position pos (the CPU's rope_neox_inplace arithmetic, or rope_neox_yarn_inplace's).
template <typename T>
__device__ __forceinline__ void norm_rope_head(const float* x, T* o, int64_t pos, int head_dim, const float* w,
                                               float eps, int rope_dims, float freq_base, const YarnDev& y,
                                               float* buf) {
  const int i = threadIdx.x;
  const float2 cs = i < rope_dims / 2 ? rope_cos_sin_at(pos, i, rope_dims, freq_base, y) : make_float2(1.0f, 0.0f);
  norm_rope_head_cs(x, o, head_dim, w, eps, rope_dims, cs, buf);
}

}  // namespace strata::cuda
