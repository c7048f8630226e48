// Causal prefill attention (prefill_kernels.h: attention_prefill), tiled with an online softmax: a block
// takes TQ queries of one head, walks the cached keys / values in tiles of TK positions through shared
// memory, and keeps for each query the running max, the running sum of exponentials and the weighted
// sum of values (the flash-attention recurrence: when the max grows, the earlier sums are rescaled by
// exp(old max - new max)). All in float32 (f16 cache rows are widened as the tile loads them). The scores of one tile are float4 dots from shared memory.
// A sliding layer's block walks only the positions some query of the block sees (from the first query's
// window start), its cache rows found through the ring.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/kv_cache.cuh"
#include "strata/cuda/prefill_common.cuh"
#include "strata/cuda/prefill_kernels.h"
#include "strata/moe/gpu_support.h"

namespace strata::cuda::prefill {
namespace {

constexpr int TQ = 16;        // queries per block
constexpr int TK = 16;        // key positions per tile
constexpr int kThreads = 128; // TQ * TK / 2: each thread scores two queries (r, r + 8) against one key,
                              // and updates the softmax of two scores of one query
constexpr int kMaxDims = 2;   // head_dim <= kThreads * kMaxDims
static_assert(TQ * TK == 2 * kThreads && TK == 16 && TQ == 16, "the score and softmax thread layouts assume 16 x 16 tiles");

template <typename KT, typename VT>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(
    const float* q, int64_t q_tok_stride, int q_head_stride, const KT* k_cache, const VT* v_cache,
    int64_t kv_stride, int n, int group, int hd, float scale, bool gated, int pos0, float* out, int n_head, int window,
    int ring_rows) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int ld = hd + 4;  // padded rows: float4 reads of different rows spread over the banks
  float* sq = sm;               // [TQ][ld]
  float* skv = sq + TQ * ld;    // [TK][ld], keys then values of the current tile
  float* sp = skv + TK * ld;    // [TQ][TK] scores, then probabilities
  float* s_m = sp + TQ * TK;    // running max per query
  float* s_l = s_m + TQ;        // running sum per query
  float* s_a = s_l + TQ;        // rescale factor of the current tile
  const int tid = threadIdx.x;
  const int h = blockIdx.y;
  const int g = h / group;
  const int q0 = blockIdx.x * TQ;
  const int rows = min(TQ, n - q0);

  // Tile loads as float4: each pass covers rows_per_pass rows of hd4 float4s (no per-element division).
  const int hd4 = hd / 4;
  const int rows_per_pass = kThreads / hd4;
  const int lr = tid / hd4, l4 = tid % hd4;
  const bool loader = lr < rows_per_pass;
  const float4 zero4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (loader)
    for (int r = lr; r < TQ; r += rows_per_pass)
      reinterpret_cast<float4*>(sq + r * ld)[l4] =
          r < rows ? reinterpret_cast<const float4*>(q + (q0 + r) * q_tok_stride + static_cast<int64_t>(h) * q_head_stride)[l4]
                   : zero4;
  if (tid < TQ) {
    s_m[tid] = -INFINITY;
    s_l[tid] = 0.0f;
  }
  float acc[TQ][kMaxDims];
#pragma unroll
  for (int r = 0; r < TQ; ++r)
#pragma unroll
    for (int i = 0; i < kMaxDims; ++i) acc[r][i] = 0.0f;

  // Query r (position pos0 + q0 + r) sees keys first_key(r) .. pos0 + q0 + r; keys kbegin .. kend-1 are
  // visible to some query of the block.
  auto first_key = [&](int r) { return window > 0 ? max(0, pos0 + q0 + r - window + 1) : 0; };
  const int kbegin = first_key(0);
  const int kend = pos0 + q0 + rows;
  const int sc_c = tid % TK, sc_r = tid / TK;  // this thread scores queries sc_r, sc_r + 8 against key sc_c
  const int lo_a = first_key(sc_r), lo_b = first_key(sc_r + 8);
  for (int k0 = kbegin; k0 < kend; k0 += TK) {
    __syncthreads();  // the previous tile's values are no longer read
    if (loader)
      for (int c = lr; c < TK; c += rows_per_pass) {
        const int p = k0 + c;
        reinterpret_cast<float4*>(skv + c * ld)[l4] =
            p < kend ? kv_load4(k_cache + ring_row(p, ring_rows) * kv_stride + static_cast<int64_t>(g) * hd + 4 * l4)
                     : zero4;
      }
    __syncthreads();
    {
      float s0 = 0.0f, s1 = 0.0f;
      const float4* kr = reinterpret_cast<const float4*>(skv + sc_c * ld);
      const float4* qa = reinterpret_cast<const float4*>(sq + sc_r * ld);
      const float4* qb = reinterpret_cast<const float4*>(sq + (sc_r + 8) * ld);
      for (int d4 = 0; d4 < hd / 4; ++d4) {
        const float4 kv = kr[d4], a = qa[d4], b = qb[d4];
        s0 += a.x * kv.x + a.y * kv.y + a.z * kv.z + a.w * kv.w;
        s1 += b.x * kv.x + b.y * kv.y + b.z * kv.z + b.w * kv.w;
      }
      const int p = k0 + sc_c;
      sp[sc_r * TK + sc_c] = (p >= lo_a && p <= pos0 + q0 + sc_r) ? s0 * scale : -INFINITY;
      sp[(sc_r + 8) * TK + sc_c] = (p >= lo_b && p <= pos0 + q0 + sc_r + 8) ? s1 * scale : -INFINITY;
    }
    __syncthreads();
    {
      // Online softmax update: 8 consecutive lanes share a query row, two scores each, reduced by
      // shuffles. A tile may hold no key a query sees (below its window, or past a padding row's
      // position): while its max is -inf the exponentials are taken against 0, so they and the
      // rescale factor are 0, not NaN.
      const int r = tid >> 3, c0 = (tid & 7) * 2;
      const float v0 = sp[r * TK + c0], v1 = sp[r * TK + c0 + 1];
      const float m_old = s_m[r];
      float mx = fmaxf(v0, v1);
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      mx = fmaxf(mx, m_old);
      const float ref = mx == -INFINITY ? 0.0f : mx;
      const float e0 = expf(v0 - ref), e1 = expf(v1 - ref);
      sp[r * TK + c0] = e0;
      sp[r * TK + c0 + 1] = e1;
      float sum = e0 + e1;
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if ((tid & 7) == 0) {
        const float a = expf(m_old - ref);
        s_a[r] = a;
        s_l[r] = s_l[r] * a + sum;
        s_m[r] = mx;
      }
    }
    // Scores are done with the keys (barrier above), so the values overwrite them.
    if (loader)
      for (int c = lr; c < TK; c += rows_per_pass) {
        const int p = k0 + c;
        reinterpret_cast<float4*>(skv + c * ld)[l4] =
            p < kend ? kv_load4(v_cache + ring_row(p, ring_rows) * kv_stride + static_cast<int64_t>(g) * hd + 4 * l4)
                     : zero4;
      }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < TQ; ++r) {
      const float a = s_a[r];
#pragma unroll
      for (int i = 0; i < kMaxDims; ++i) acc[r][i] *= a;
    }
    for (int c = 0; c < TK; ++c) {
      float v[kMaxDims];
#pragma unroll
      for (int i = 0; i < kMaxDims; ++i) {
        const int d = tid + i * kThreads;
        v[i] = d < hd ? skv[c * ld + d] : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < TQ; ++r) {
        const float p = sp[r * TK + c];
#pragma unroll
        for (int i = 0; i < kMaxDims; ++i) acc[r][i] += p * v[i];
      }
    }
  }
  const int64_t o_stride = static_cast<int64_t>(n_head) * hd;
#pragma unroll
  for (int r = 0; r < TQ; ++r) {
    if (r >= rows) break;
    const float inv = 1.0f / s_l[r];
#pragma unroll
    for (int i = 0; i < kMaxDims; ++i) {
      const int d = tid + i * kThreads;
      if (d >= hd) continue;
      float o = acc[r][i] * inv;
      if (gated) o *= sigmoid_dev(q[(q0 + r) * q_tok_stride + static_cast<int64_t>(h) * q_head_stride + hd + d]);
      out[(q0 + r) * o_stride + static_cast<int64_t>(h) * hd + d] = o;
    }
  }
}

}  // namespace

void attention_prefill(const float* q, int64_t q_tok_stride, int q_head_stride, const void* k_cache,
                       const void* v_cache, int64_t kv_stride, int n, int n_head, int n_head_kv, int head_dim,
                       float scale, bool gated, int pos0, float* out, cudaStream_t s, KvCacheTypes kv, int window,
                       int rows) {
  check_arg(n_head % n_head_kv == 0, "attention_prefill: n_head must be a multiple of n_head_kv");
  static_assert(kGpuPrefillMaxHeadDim == kThreads * kMaxDims, "gpu_support.h's head limit is this kernel's");
  check_arg(head_dim % 4 == 0 && head_dim <= kGpuPrefillMaxHeadDim, "attention_prefill: head_dim must be a multiple of 4, <= 256");
  if (rows <= 0) rows = std::numeric_limits<int>::max();
  check_arg(q_tok_stride % 4 == 0 && q_head_stride % 4 == 0 && kv_stride % 4 == 0,
            "attention_prefill: row strides must be multiples of 4 floats (float4 loads)");
  const size_t smem = sizeof(float) * (static_cast<size_t>(TQ + TK) * (head_dim + 4) + TQ * TK + 3 * TQ);
  const dim3 grid((n + TQ - 1) / TQ, n_head);
  with_kv_types(kv, [&](auto tk, auto tv) {
    using KT = decltype(tk);
    using VT = decltype(tv);
    attention_prefill_kernel<KT, VT><<<grid, kThreads, smem, s>>>(
        q, q_tok_stride, q_head_stride, static_cast<const KT*>(k_cache), static_cast<const VT*>(v_cache), kv_stride, n,
        n_head / n_head_kv, head_dim, scale, gated, pos0, out, n_head, window, rows);
  });
  check_launch("attention_prefill");
}

}  // namespace strata::cuda::prefill
