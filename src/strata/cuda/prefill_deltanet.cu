// The gated delta rule over a chunk as an exact sequential scan (prefill_kernels.h: deltanet_scan; the
// prefill's default is the chunkwise-parallel form of prefill_deltanet_chunked.cu, and this scan runs
// the head shapes that form does not take). Column j of a value head's state (S[:, j], dk values)
// evolves independently of the other columns, so one warp owns one column, each lane holding dk/32 of
// its rows in registers, and walks the tokens in order (parallel over heads x value columns). Per token
// the three dot products the step needs (S.k and S.q before the update, and k.q) are reduced together in
// one shuffle pass, using
//   S' = d S + k delta,  delta = beta (v - d (S.k)),  o = S'.q = d (S.q) + (k.q) delta   (d = exp(g)),
// which is the per-token deltanet_step of cpu/ops.h up to the order of float rounding. A block first
// copies a stage of tokens' inputs into shared memory with coalesced loads, so the per-token global-load
// latency (one round trip per token) becomes one round trip per stage. (A form that loaded each token's
// inputs from global memory, one round trip per token, was removed: slower, and only the tests ran it.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/prefill_common.cuh"
#include "strata/cuda/prefill_kernels.h"
#include "strata/moe/gpu_support.h"

namespace strata::cuda::prefill {
namespace {

constexpr int kStagedWarps = 8;

template <int RPL>
__global__ void __launch_bounds__(kStagedWarps * 32) deltanet_scan_staged_kernel(
    float* S_all, const float* mixed, int64_t ms, const float* b, const float* alpha, const float* a,
    const float* dt_bias, int n, int nk, int nv, int dk, int dv, int stage, float* o, float* steps) {
  extern __shared__ float smem[];
  float* sq = smem;                          // [stage][dk]
  float* sk = sq + stage * dk;               // [stage][dk]
  float* sv = sk + stage * dk;               // [stage][kStagedWarps]
  float* sdecay = sv + stage * kStagedWarps; // [stage]
  float* sbeta = sdecay + stage;             // [stage]
  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y;
  const int j0 = blockIdx.x * kStagedWarps;
  const int j = j0 + warp;
  const bool active = j < dv;
  const int kh = h % nk;
  const int64_t key_dim = static_cast<int64_t>(nk) * dk;
  float* S = S_all + static_cast<int64_t>(h) * dk * dv;
  float s[RPL];
#pragma unroll
  for (int r = 0; r < RPL; ++r) {
    const int i = lane + 32 * r;
    s[r] = (active && i < dk) ? S[static_cast<int64_t>(i) * dv + j] : 0.0f;
  }
  const float ah = a[h], dtb = dt_bias[h];
  const int64_t o_stride = static_cast<int64_t>(nv) * dv;
  for (int t0 = 0; t0 < n; t0 += stage) {
    const int ts = min(stage, n - t0);
    __syncthreads();  // the previous stage is no longer read
    for (int tt = warp; tt < ts; tt += kStagedWarps) {  // a warp per token row, lanes along the head
      const float* row = mixed + static_cast<int64_t>(t0 + tt) * ms;
      for (int i = lane; i < dk; i += 32) {
        sq[tt * dk + i] = row[static_cast<int64_t>(kh) * dk + i];
        sk[tt * dk + i] = row[key_dim + static_cast<int64_t>(kh) * dk + i];
      }
    }
    for (int idx = tid; idx < ts * kStagedWarps; idx += blockDim.x) {
      const int tt = idx / kStagedWarps, jj = j0 + idx % kStagedWarps;
      sv[idx] = jj < dv ? mixed[static_cast<int64_t>(t0 + tt) * ms + 2 * key_dim + static_cast<int64_t>(h) * dv + jj]
                        : 0.0f;
    }
    for (int tt = tid; tt < ts; tt += blockDim.x) {
      const int64_t t = t0 + tt;
      sbeta[tt] = sigmoid_dev(b[t * nv + h]);
      sdecay[tt] = expf(ah * softplus_dev(alpha[t * nv + h] + dtb));
    }
    __syncthreads();
    if (!active) continue;
#pragma unroll 2
    for (int tt = 0; tt < ts; ++tt) {
      float qc[RPL], kc[RPL];
#pragma unroll
      for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        qc[r] = i < dk ? sq[tt * dk + i] : 0.0f;
        kc[r] = i < dk ? sk[tt * dk + i] : 0.0f;
      }
      const float vc = sv[tt * kStagedWarps + warp];
      const float decay = sdecay[tt], beta = sbeta[tt];
      float skd = 0.0f, sqd = 0.0f, kq = 0.0f;
#pragma unroll
      for (int r = 0; r < RPL; ++r) {
        skd += s[r] * kc[r];
        sqd += s[r] * qc[r];
        kq += kc[r] * qc[r];
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        skd += __shfl_xor_sync(0xffffffffu, skd, off);
        sqd += __shfl_xor_sync(0xffffffffu, sqd, off);
        kq += __shfl_xor_sync(0xffffffffu, kq, off);
      }
      const float delta = beta * (vc - decay * skd);
#pragma unroll
      for (int r = 0; r < RPL; ++r) s[r] = s[r] * decay + kc[r] * delta;
      if (lane == 0) o[(t0 + tt) * o_stride + static_cast<int64_t>(h) * dv + j] = decay * sqd + kq * delta;
      if (steps) {  // the block's warps cover adjacent columns: their writes fill whole sectors together
        float* St = steps + static_cast<int64_t>(t0 + tt) * nv * dk * dv + static_cast<int64_t>(h) * dk * dv;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
          const int i = lane + 32 * r;
          if (i < dk) St[static_cast<int64_t>(i) * dv + j] = s[r];
        }
      }
    }
  }
  if (active) {
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      const int i = lane + 32 * r;
      if (i < dk) S[static_cast<int64_t>(i) * dv + j] = s[r];
    }
  }
}

template <int RPL>
void launch_staged(float* S, const float* mixed, int64_t ms, const float* b, const float* alpha, const float* a,
                   const float* dt_bias, int n, int nk, int nv, int dk, int dv, float* o, float* steps, cudaStream_t s) {
  // About 32 KB of staged q/k: 32 tokens at dk 128, more for small heads (at most 128 tokens).
  const int stage = std::max(1, std::min(128, 4096 / dk));
  const size_t smem = sizeof(float) * (static_cast<size_t>(stage) * (2 * dk + kStagedWarps + 2));
  const dim3 grid((dv + kStagedWarps - 1) / kStagedWarps, nv);
  deltanet_scan_staged_kernel<RPL><<<grid, kStagedWarps * 32, smem, s>>>(S, mixed, ms, b, alpha, a, dt_bias, n, nk, nv,
                                                                          dk, dv, stage, o, steps);
}

}  // namespace

void deltanet_scan(float* S, const float* mixed, int64_t mixed_stride, const float* b, const float* alpha,
                   const float* a, const float* dt_bias, int n, int n_k_heads, int n_v_heads, int dk, int dv,
                   float* o, cudaStream_t s, float* steps) {
  check_arg(dk >= 1 && dk <= kGpuPrefillMaxDeltaNetHeadK, "deltanet_scan: key head dim must be 1..256");
  if (dk <= 32) {
    launch_staged<1>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, steps, s);
  } else if (dk <= 64) {
    launch_staged<2>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, steps, s);
  } else if (dk <= 128) {
    launch_staged<4>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, steps, s);
  } else {
    launch_staged<8>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, steps, s);
  }
  check_launch("deltanet_scan");
}

}  // namespace strata::cuda::prefill
