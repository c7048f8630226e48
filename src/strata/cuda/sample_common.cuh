// Device pieces shared by the GPU sampler's kernels (sample_kernels.cu: the draw; sample_select.cu: the
// top-k / top-p cut): the candidate order, the kept set, token probabilities and the scratch layout.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "strata/cuda/device_math.cuh"

namespace strata::cuda::samp {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;                  // consecutive ids per thread
constexpr int kChunk = kThreads * kPerThread;  // ids per block
constexpr int kMaxChunks = kThreads;           // n <= kChunk * kMaxChunks = 2^19 (sample_max_ids)

// A finite logit's place in the candidate order as an unsigned key (float_order_key; -0 and +0 are one
// logit, as the host compares them).
__device__ __forceinline__ unsigned int logit_key(float l) { return float_order_key(l == 0.0f ? 0.0f : l); }

// The kept set: finite logits with key > key, or key == key and id <= id (the candidate order's best-first
// prefix). {0, INT_MAX} keeps every finite logit.
struct Keep {
  unsigned int key;
  int id;
};
__device__ __forceinline__ bool kept(const Keep& k, float l, int64_t id) {
  if (!isfinite(l)) return false;
  const unsigned int key = logit_key(l);
  return key > k.key || (key == k.key && id <= k.id);
}

// The largest finite logit (argmax_wide with finite_only), or NaN when there is none (*argmax = -1):
// then nothing is drawn.
__device__ __forceinline__ float max_logit(const float* logits, const int* argmax) {
  const int a = *argmax;
  return a >= 0 ? logits[a] : __int_as_float(0x7fc00000);
}

__device__ __forceinline__ double token_prob(float l, float mx, double inv_t) {
  return exp((static_cast<double>(l) - static_cast<double>(mx)) * inv_t);
}

// The selection's state in the scratch (sample_select.cu). Histograms and the counter return to zero
// after each pass.
struct SelectState {
  unsigned int hist_count[256];
  unsigned long long hist_mass[256];
  unsigned int counter;   // last-block counter of the running launch
  unsigned int prefix;    // the cut's key bits found so far
  unsigned int mask;
  int cut;                // 0: this stage keeps the whole set
  unsigned int need_count;
  double need_mass;       // fixed point
  Keep keep;              // the set after the stages so far
};

// Scratch layout: the state, then one double per chunk (the draw's chunk masses), then one int per
// chunk (ties per chunk).
struct ScratchLayout {
  SelectState* st;
  double* partial;
  int* ties;
};
inline ScratchLayout scratch_layout(void* base, int chunks) {
  char* p = static_cast<char*>(base);
  const size_t st = (sizeof(SelectState) + 15) & ~size_t{15};
  return {reinterpret_cast<SelectState*>(p), reinterpret_cast<double*>(p + st),
          reinterpret_cast<int*>(p + st + sizeof(double) * static_cast<size_t>(chunks))};
}

// Block-wide exclusive prefix of v in thread order, and the block total (kThreads threads).
template <class T>
__device__ T exclusive_prefix(T v, T& total) {
  __shared__ T warp_tot[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();  // warp_tot may still be read by a previous call
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  T before = 0, all = 0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_tot[w];
    all += warp_tot[w];
  }
  total = all;
  return before + incl - v;
}

}  // namespace strata::cuda::samp
