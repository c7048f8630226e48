// The gated delta rule over a chunk (prefill_kernels.h: deltanet_scan). Column j of a value head's
// state (S[:, j], dk values) evolves independently of the other columns, so one warp owns one column,
// each lane holding dk/32 of its rows in registers, and walks the chunk's tokens in order (an exact
// sequential scan, parallel over heads x value columns). Per token the three dot products the step needs
// (S.k and S.q before the update, and k.q) are reduced together in one shuffle pass, using
//   S' = d S + k delta,  delta = beta (v - d (S.k)),  o = S'.q = d (S.q) + (k.q) delta   (d = exp(g)),
// which is the per-token deltanet_step of cpu/ops.h up to the order of float rounding. The next token's
// inputs are loaded before the current token is computed, to hide their latency.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/prefill_common.cuh"
#include "strata/cuda/prefill_kernels.h"

namespace strata::cuda::prefill {
namespace {

constexpr int kWarps = 4;  // value columns per block

template <int RPL>  // rows per lane: dk <= 32 * RPL
__global__ void __launch_bounds__(kWarps * 32) deltanet_scan_kernel(
    float* S_all, const float* mixed, int64_t ms, const float* b, const float* alpha, const float* a,
    const float* dt_bias, int n, int nk, int nv, int dk, int dv, float* o) {
  const int lane = threadIdx.x & 31;
  const int j = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int h = blockIdx.y;
  if (j >= dv) return;
  const int kh = h % nk;
  const int64_t key_dim = static_cast<int64_t>(nk) * dk;
  float* S = S_all + static_cast<int64_t>(h) * dk * dv;
  float s[RPL];
#pragma unroll
  for (int r = 0; r < RPL; ++r) {
    const int i = lane + 32 * r;
    s[r] = i < dk ? S[static_cast<int64_t>(i) * dv + j] : 0.0f;
  }
  const float ah = a[h], dtb = dt_bias[h];
  const float* qbase = mixed + static_cast<int64_t>(kh) * dk;
  const float* kbase = mixed + key_dim + static_cast<int64_t>(kh) * dk;
  const float* vbase = mixed + 2 * key_dim + static_cast<int64_t>(h) * dv + j;

  float qn[RPL], kn[RPL], vn = 0.0f, bn = 0.0f, an = 0.0f;
  auto load = [&](int t) {
    const int64_t off = static_cast<int64_t>(t) * ms;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      const int i = lane + 32 * r;
      qn[r] = i < dk ? qbase[off + i] : 0.0f;
      kn[r] = i < dk ? kbase[off + i] : 0.0f;
    }
    vn = vbase[off];
    bn = b[static_cast<int64_t>(t) * nv + h];
    an = alpha[static_cast<int64_t>(t) * nv + h];
  };
  load(0);
  const int64_t o_stride = static_cast<int64_t>(nv) * dv;
  for (int t = 0; t < n; ++t) {
    float qc[RPL], kc[RPL];
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      qc[r] = qn[r];
      kc[r] = kn[r];
    }
    const float vc = vn, bc = bn, ac = an;
    if (t + 1 < n) load(t + 1);
    const float beta = sigmoid_dev(bc);
    const float xa = ac + dtb;
    const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
    const float decay = expf(ah * sp);
    float sk = 0.0f, sq = 0.0f, kq = 0.0f;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
      sk += s[r] * kc[r];
      sq += s[r] * qc[r];
      kq += kc[r] * qc[r];
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      sk += __shfl_xor_sync(0xffffffffu, sk, off);
      sq += __shfl_xor_sync(0xffffffffu, sq, off);
      kq += __shfl_xor_sync(0xffffffffu, kq, off);
    }
    const float delta = beta * (vc - decay * sk);
#pragma unroll
    for (int r = 0; r < RPL; ++r) s[r] = s[r] * decay + kc[r] * delta;
    if (lane == 0) o[static_cast<int64_t>(t) * o_stride + static_cast<int64_t>(h) * dv + j] = decay * sq + kq * delta;
  }
#pragma unroll
  for (int r = 0; r < RPL; ++r) {
    const int i = lane + 32 * r;
    if (i < dk) S[static_cast<int64_t>(i) * dv + j] = s[r];
  }
}


// The staged form: a block of kStagedWarps warps (columns of one value head) first copies a stage of
// tokens' q, k (kStage x dk), its columns' v, and the per-token decay exp(g) and beta into shared memory
// with coalesced loads, then every warp walks the stage reading only shared memory. The per-token
// global-load latency of deltanet_scan_kernel (one round trip per token, the scan's bottleneck) becomes
// one round trip per stage. Same arithmetic per token as deltanet_scan_kernel.
constexpr int kStagedWarps = 8;

template <int RPL>
__global__ void __launch_bounds__(kStagedWarps * 32) deltanet_scan_staged_kernel(
    float* S_all, const float* mixed, int64_t ms, const float* b, const float* alpha, const float* a,
    const float* dt_bias, int n, int nk, int nv, int dk, int dv, int stage, float* o) {
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
      const float xa = alpha[t * nv + h] + dtb;
      const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
      sdecay[tt] = expf(ah * sp);
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
                   const float* dt_bias, int n, int nk, int nv, int dk, int dv, float* o, cudaStream_t s) {
  // About 32 KB of staged q/k: 32 tokens at dk 128, more for small heads (at most 128 tokens).
  const int stage = std::max(1, std::min(128, 4096 / dk));
  const size_t smem = sizeof(float) * (static_cast<size_t>(stage) * (2 * dk + kStagedWarps + 2));
  const dim3 grid((dv + kStagedWarps - 1) / kStagedWarps, nv);
  deltanet_scan_staged_kernel<RPL><<<grid, kStagedWarps * 32, smem, s>>>(S, mixed, ms, b, alpha, a, dt_bias, n, nk, nv,
                                                                          dk, dv, stage, o);
}

}  // namespace

void deltanet_scan(float* S, const float* mixed, int64_t mixed_stride, const float* b, const float* alpha,
                   const float* a, const float* dt_bias, int n, int n_k_heads, int n_v_heads, int dk, int dv,
                   float* o, cudaStream_t s, bool staged) {
  check_arg(dk >= 1 && dk <= 256, "deltanet_scan: key head dim must be 1..256");
  if (staged) {
    if (dk <= 32) {
      launch_staged<1>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, s);
    } else if (dk <= 64) {
      launch_staged<2>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, s);
    } else if (dk <= 128) {
      launch_staged<4>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, s);
    } else {
      launch_staged<8>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o, s);
    }
    check_launch("deltanet_scan (staged)");
    return;
  }
  const dim3 grid((dv + kWarps - 1) / kWarps, n_v_heads);
  const int threads = kWarps * 32;
  if (dk <= 32) {
    deltanet_scan_kernel<1><<<grid, threads, 0, s>>>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o);
  } else if (dk <= 64) {
    deltanet_scan_kernel<2><<<grid, threads, 0, s>>>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o);
  } else if (dk <= 128) {
    deltanet_scan_kernel<4><<<grid, threads, 0, s>>>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o);
  } else {
    deltanet_scan_kernel<8><<<grid, threads, 0, s>>>(S, mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv, o);
  }
  check_launch("deltanet_scan");
}

}  // namespace strata::cuda::prefill
