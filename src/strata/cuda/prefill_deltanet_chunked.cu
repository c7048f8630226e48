// The gated delta rule over a prompt in its chunkwise-parallel form (prefill_kernels.h:
// deltanet_scan_chunked). Within a chunk of C tokens with cumulative log-decay G_t (g summed from the
// chunk's first token, gamma_t = exp(G_t)) and the state S0 at the chunk's start, the per-token rule
//   S_t = d_t S_{t-1} + k_t u_t^T,  u_t = beta_t (v_t - d_t S_{t-1}^T k_t),  o_t = S_t^T q_t
// unrolls to
//   (I + A) U = B V - B Gamma K S0,   A[t][s] = beta_t exp(G_t - G_s) (k_t . k_s)   (s < t)
//   O = Gamma Q S0 + M U,             M[t][s] = exp(G_t - G_s) (q_t . k_s)          (s <= t)
//   S_C = gamma_C S0 + sum_s exp(G_C - G_s) k_s u_s^T
// so with T = (I + A)^-1 (unit lower triangular), U = Uv - W S0 where Uv = T B V and W = T B Gamma K.
// Everything but the S0 terms depends only on the chunk's inputs, so:
//   chunk_prep_kernel (every chunk of every head at once): A and M from the chunk's dot products, T by
//     forward substitution, W, Uv, M and G into a scratch record;
//   chunk_state_kernel (per head and group of 16 value columns, chunks in order): the matrix products
//     with the state, which each column j of S evolves independently (as in the scan).
// The token-by-token chain of the scan (three reductions per token) becomes C-token matrix products.
// Derivation after Yang, Kautz, Hatamizadeh, "Gated Delta Networks" (2024), and Yang et al.,
// "Parallelizing Linear Transformers with the Delta Rule over Sequence Length" (2024): the WY / UT form.
// All arithmetic in float32 (the scan's precision; the sums are reassociated, so results agree with the
// scan to float rounding).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/prefill_common.cuh"
#include "strata/cuda/prefill_kernels.h"

namespace strata::cuda::prefill {
namespace {

constexpr int kChunk = 32;   // tokens per chunk (C)
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One chunk's record in the scratch: W [C][dk], Uv [C][dv], M [C][C], G [C].
__host__ __device__ inline int64_t record_floats(int dk, int dv) {
  return static_cast<int64_t>(kChunk) * (dk + dv + kChunk + 1);
}

struct ChunkInputs {
  const float* mixed;
  int64_t ms;  // mixed row stride
  const float* b;
  const float* alpha;
  const float* a;
  const float* dt_bias;
  int n, nk, nv, dk, dv;
};

__device__ __forceinline__ float log_decay(const ChunkInputs& in, int t, int h) {
  return in.a[h] * softplus_dev(in.alpha[static_cast<int64_t>(t) * in.nv + h] + in.dt_bias[h]);
}

// Block (chunk c, head h): the chunk's W, Uv, M and G.
__global__ void __launch_bounds__(kThreads) chunk_prep_kernel(ChunkInputs in, float* scratch) {
  extern __shared__ float sm[];
  const int c = blockIdx.x, h = blockIdx.y;
  const int dk = in.dk, dv = in.dv, ldk = dk + 1;
  const int t0 = c * kChunk, len = min(kChunk, in.n - t0);
  float* Ks = sm;                        // [C][dk + 1]
  float* Qs = Ks + kChunk * ldk;         // [C][dk + 1]
  float* Vs = Qs + kChunk * ldk;         // [C][dv]
  float* As = Vs + kChunk * dv;          // [C][C + 1]: A, then T
  float* Ms = As + kChunk * (kChunk + 1);  // [C][C + 1]
  float* Ts = Ms + kChunk * (kChunk + 1);  // [C][C + 1]
  float* G = Ts + kChunk * (kChunk + 1);   // [C]
  float* beta = G + kChunk;                // [C]
  float* bgam = beta + kChunk;             // [C]: beta_t gamma_t
  const int kh = h % in.nk;
  const int64_t key_dim = static_cast<int64_t>(in.nk) * dk;
  // Loads in float4 steps, several in flight per thread (a loop of dependent single loads waited one
  // L2 round trip per step: measured 34 us for this kernel at one chunk).
  const int dk4 = dk / 4;
#pragma unroll 4
  for (int idx = threadIdx.x; idx < kChunk * dk4; idx += blockDim.x) {
    const int t = idx / dk4, i = 4 * (idx % dk4);
    float4 kv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), qv = kv;
    if (t < len) {
      const float* row = in.mixed + static_cast<int64_t>(t0 + t) * in.ms;
      qv = *reinterpret_cast<const float4*>(row + static_cast<int64_t>(kh) * dk + i);
      kv = *reinterpret_cast<const float4*>(row + key_dim + static_cast<int64_t>(kh) * dk + i);
    }
    float* kd = Ks + t * ldk + i;
    float* qd = Qs + t * ldk + i;
    kd[0] = kv.x, kd[1] = kv.y, kd[2] = kv.z, kd[3] = kv.w;
    qd[0] = qv.x, qd[1] = qv.y, qd[2] = qv.z, qd[3] = qv.w;
  }
#pragma unroll 4
  for (int idx = threadIdx.x; idx < kChunk * dv; idx += blockDim.x) {
    const int t = idx / dv, j = idx % dv;
    Vs[idx] = t < len ? in.mixed[static_cast<int64_t>(t0 + t) * in.ms + 2 * key_dim + static_cast<int64_t>(h) * dv + j]
                      : 0.0f;
  }
  if (threadIdx.x < 32) {  // G: the chunk's cumulative log-decay (a warp scan); beta
    const int t = threadIdx.x;
    float g = t < len ? log_decay(in, t0 + t, h) : 0.0f;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const float o = __shfl_up_sync(0xffffffffu, g, off);
      if (t >= off) g += o;
    }
    G[t] = g;
    beta[t] = t < len ? sigmoid_dev(in.b[static_cast<int64_t>(t0 + t) * in.nv + h]) : 0.0f;
    bgam[t] = beta[t] * expf(g);
  }
  __syncthreads();
  // A (strictly lower) and M (lower with the diagonal) from the chunk's dot products.
  for (int p = threadIdx.x; p < kChunk * kChunk; p += blockDim.x) {
    const int t = p / kChunk, s = p % kChunk;
    float kk = 0.0f, qk = 0.0f;
    if (s <= t && t < len) {
      for (int i = 0; i < dk; ++i) {
        const float ks = Ks[s * ldk + i];
        kk = fmaf(Ks[t * ldk + i], ks, kk);
        qk = fmaf(Qs[t * ldk + i], ks, qk);
      }
    }
    const float decay = (s <= t && t < len) ? expf(G[t] - G[s]) : 0.0f;
    As[t * (kChunk + 1) + s] = s < t ? beta[t] * decay * kk : 0.0f;
    Ms[t * (kChunk + 1) + s] = decay * qk;
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // T = (I + A)^-1 by forward substitution, row by row (lane = column)
    const int col = threadIdx.x;
    for (int t = 0; t < len; ++t) {
      float v = col == t ? 1.0f : 0.0f;
      if (col < t)
        for (int s = col; s < t; ++s) v = fmaf(-As[t * (kChunk + 1) + s], Ts[s * (kChunk + 1) + col], v);
      Ts[t * (kChunk + 1) + col] = v;
      __syncwarp();
    }
  }
  __syncthreads();
  float* rec = scratch + (static_cast<int64_t>(h) * gridDim.x + c) * record_floats(dk, dv);
  float* W = rec;
  float* Uv = W + kChunk * dk;
  float* M = Uv + kChunk * dv;
  float* Gout = M + kChunk * kChunk;
  for (int idx = threadIdx.x; idx < kChunk * dk; idx += blockDim.x) {  // W = T B Gamma K
    const int t = idx / dk, i = idx % dk;
    float w = 0.0f;
    for (int s = 0; s <= t && s < len; ++s)
      w = fmaf(Ts[t * (kChunk + 1) + s] * bgam[s], Ks[s * ldk + i], w);
    W[idx] = t < len ? w : 0.0f;
  }
  for (int idx = threadIdx.x; idx < kChunk * dv; idx += blockDim.x) {  // Uv = T B V
    const int t = idx / dv, j = idx % dv;
    float u = 0.0f;
    for (int s = 0; s <= t && s < len; ++s) u = fmaf(Ts[t * (kChunk + 1) + s] * beta[s], Vs[s * dv + j], u);
    Uv[idx] = t < len ? u : 0.0f;
  }
  for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += blockDim.x)
    M[idx] = Ms[(idx / kChunk) * (kChunk + 1) + idx % kChunk];
  if (threadIdx.x < kChunk) Gout[threadIdx.x] = G[threadIdx.x];
}

// Block (group of 16 value columns, head h): lane = 16 * rh + c holds column c and half rh of warp w's
// rows w*RPW .. +RPW-1 of S in registers (RPW / 2 rows each), so two blocks of 8 warps fit an SM (one
// block of 32 columns per SM was latency-bound: docs/PERF.md). Walks the chunks in order:
// U = Uv - W S, O = Gamma Q S + M U, S = gamma_C S + K^T D U. The row reads of W, Q and K are
// broadcasts within each half-warp, so the tiles are unpadded and read four rows at a time; dk % 4 == 0
// (the host checks). A form with 4 columns x 8 row groups per warp (sums over rows by shuffles) was slower.
constexpr int kCols = 16;  // value columns per block

template <int RPW>
__global__ void __launch_bounds__(kThreads, 2) chunk_state_kernel(ChunkInputs in, const float* scratch, float* S_all,
                                                                  float* o, int n_chunks) {
  constexpr int kHalf = RPW / 2;  // rows per lane
  static_assert(kHalf % 4 == 0, "rows per lane in float4 steps");
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  const int dk = in.dk, dv = in.dv;
  float* Ws = sm;                             // [C][dk]
  float* Qs = Ws + kChunk * dk;               // [C][dk]
  float* Ks = Qs + kChunk * dk;               // [C][dk]
  float* Ms = Ks + kChunk * dk;               // [C][C]
  float* Us = Ms + kChunk * kChunk;           // [C][kCols]: Uv, then U
  float* GQ = Us + kChunk * kCols;            // [C][kCols]: gamma_t (Q S)[t][j]
  float* pw = GQ + kChunk * kCols;            // [warps][C][kCols]: partial W S
  float* pq = pw + kWarps * kChunk * kCols;   // [warps][C][kCols]: partial Q S
  float* G = pq + kWarps * kChunk * kCols;    // [C]
  float* tail = G + kChunk;                   // [C]: exp(G_last - G_s)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cl = lane & (kCols - 1), rh = lane >> 4;
  const int h = blockIdx.y, j = blockIdx.x * kCols + cl;
  const bool col = j < dv;
  const int kh = h % in.nk;
  const int64_t key_dim = static_cast<int64_t>(in.nk) * dk;
  const int i0 = warp * RPW + rh * kHalf;
  const int nq = max(0, min(kHalf, dk - i0)) / 4;  // this lane's rows in float4 steps
  float* S = S_all + static_cast<int64_t>(h) * dk * dv;
  float r[kHalf];
#pragma unroll
  for (int q = 0; q < kHalf; ++q) {
    const int i = i0 + q;
    r[q] = (col && i < dk) ? S[static_cast<int64_t>(i) * dv + j] : 0.0f;
  }
  const int64_t o_stride = static_cast<int64_t>(in.nv) * dv;
  const int dk4 = dk / 4;
  for (int c = 0; c < n_chunks; ++c) {
    const int t0 = c * kChunk, len = min(kChunk, in.n - t0);
    const float* rec = scratch + (static_cast<int64_t>(h) * n_chunks + c) * record_floats(dk, dv);
    const float* W = rec;
    const float* Uv = W + kChunk * dk;
    const float* M = Uv + kChunk * dv;
    const float* Gin = M + kChunk * kChunk;
    __syncthreads();  // the previous chunk's readers are done
#pragma unroll 4
    for (int idx = threadIdx.x; idx < kChunk * dk4; idx += blockDim.x) {
      const int t = idx / dk4, i4 = idx % dk4;
      float4 qv = make_float4(0.0f, 0.0f, 0.0f, 0.0f), kv = qv;
      if (t < len) {
        const float* row = in.mixed + static_cast<int64_t>(t0 + t) * in.ms;
        qv = reinterpret_cast<const float4*>(row + static_cast<int64_t>(kh) * dk)[i4];
        kv = reinterpret_cast<const float4*>(row + key_dim + static_cast<int64_t>(kh) * dk)[i4];
      }
      reinterpret_cast<float4*>(Ws)[idx] = reinterpret_cast<const float4*>(W)[idx];
      reinterpret_cast<float4*>(Qs)[idx] = qv;
      reinterpret_cast<float4*>(Ks)[idx] = kv;
    }
#pragma unroll 4
    for (int idx = threadIdx.x; idx < kChunk * kChunk; idx += blockDim.x) Ms[idx] = M[idx];
#pragma unroll 2
    for (int idx = threadIdx.x; idx < kChunk * kCols; idx += blockDim.x) {
      const int t = idx / kCols, jj = blockIdx.x * kCols + idx % kCols;
      Us[idx] = jj < dv ? Uv[static_cast<int64_t>(t) * dv + jj] : 0.0f;
    }
    if (threadIdx.x < kChunk) {
      G[threadIdx.x] = Gin[threadIdx.x];
      tail[threadIdx.x] = threadIdx.x < len ? expf(Gin[len - 1] - Gin[threadIdx.x]) : 0.0f;
    }
    __syncthreads();
    // This warp's rows' share of (W S)[t][j] and (Q S)[t][j] for every t of the chunk (the two halves
    // of the warp's rows meet by one shuffle).
    for (int t = 0; t < len; ++t) {
      float ws = 0.0f, qs = 0.0f;
      const float4* w4 = reinterpret_cast<const float4*>(Ws + t * dk + i0);
      const float4* q4 = reinterpret_cast<const float4*>(Qs + t * dk + i0);
#pragma unroll
      for (int q = 0; q < kHalf / 4; ++q) {
        if (q < nq) {
          const float4 wv = w4[q], qv = q4[q];
          ws = fmaf(wv.x, r[4 * q], fmaf(wv.y, r[4 * q + 1], fmaf(wv.z, r[4 * q + 2], fmaf(wv.w, r[4 * q + 3], ws))));
          qs = fmaf(qv.x, r[4 * q], fmaf(qv.y, r[4 * q + 1], fmaf(qv.z, r[4 * q + 2], fmaf(qv.w, r[4 * q + 3], qs))));
        }
      }
      ws += __shfl_xor_sync(0xffffffffu, ws, 16);
      qs += __shfl_xor_sync(0xffffffffu, qs, 16);
      if (rh == 0) {
        pw[(warp * kChunk + t) * kCols + cl] = ws;
        pq[(warp * kChunk + t) * kCols + cl] = qs;
      }
    }
    __syncthreads();
    // U = Uv - W S and Gamma Q S, for the chunk's (token, column) pairs (two per thread).
    for (int p = threadIdx.x; p < kChunk * kCols; p += blockDim.x) {
      const int t = p / kCols, cc = p % kCols;
      if (t >= len) continue;
      float ws = 0.0f, qs = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        ws += pw[(w * kChunk + t) * kCols + cc];
        qs += pq[(w * kChunk + t) * kCols + cc];
      }
      Us[p] -= ws;
      GQ[p] = expf(G[t]) * qs;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < kChunk * kCols; p += blockDim.x) {  // O = Gamma Q S + M U
      const int t = p / kCols, cc = p % kCols, oj = blockIdx.x * kCols + cc;
      if (t >= len || oj >= dv) continue;
      float acc = GQ[p];
      for (int s2 = 0; s2 <= t; ++s2) acc = fmaf(Ms[t * kChunk + s2], Us[s2 * kCols + cc], acc);
      o[static_cast<int64_t>(t0 + t) * o_stride + static_cast<int64_t>(h) * dv + oj] = acc;
    }
    // S = gamma_last S + K^T diag(exp(G_last - G_s)) U
    const float glast = expf(G[len - 1]);
#pragma unroll
    for (int q = 0; q < kHalf; ++q) r[q] *= glast;
    for (int s2 = 0; s2 < len; ++s2) {
      const float us = tail[s2] * Us[s2 * kCols + cl];
      const float4* k4 = reinterpret_cast<const float4*>(Ks + s2 * dk + i0);
#pragma unroll
      for (int q = 0; q < kHalf / 4; ++q) {
        if (q < nq) {
          const float4 kv = k4[q];
          r[4 * q] = fmaf(kv.x, us, r[4 * q]);
          r[4 * q + 1] = fmaf(kv.y, us, r[4 * q + 1]);
          r[4 * q + 2] = fmaf(kv.z, us, r[4 * q + 2]);
          r[4 * q + 3] = fmaf(kv.w, us, r[4 * q + 3]);
        }
      }
    }
  }
  if (col) {
#pragma unroll
    for (int q = 0; q < kHalf; ++q) {
      const int i = i0 + q;
      if (i < dk) S[static_cast<int64_t>(i) * dv + j] = r[q];
    }
  }
}

size_t prep_smem(int dk, int dv) {
  return sizeof(float) * (2 * static_cast<size_t>(kChunk) * (dk + 1) + static_cast<size_t>(kChunk) * dv +
                          3 * static_cast<size_t>(kChunk) * (kChunk + 1) + 3 * kChunk);
}

size_t state_smem(int dk) {
  return sizeof(float) * (3 * static_cast<size_t>(kChunk) * dk + static_cast<size_t>(kChunk) * kChunk +
                          2 * static_cast<size_t>(kChunk) * kCols + 2 * static_cast<size_t>(kWarps) * kChunk * kCols +
                          2 * kChunk);
}

template <int RPW>
void launch_state(const ChunkInputs& in, const float* scratch, float* S, float* o, int n_chunks, cudaStream_t s) {
  const size_t smem = state_smem(in.dk);
  allow_dynamic_smem(chunk_state_kernel<RPW>, smem, "cudaFuncSetAttribute(deltanet chunk state)");
  chunk_state_kernel<RPW><<<dim3((in.dv + kCols - 1) / kCols, in.nv), kThreads, smem, s>>>(in, scratch, S, o, n_chunks);
}

}  // namespace

int64_t deltanet_chunked_scratch_floats(int n, int n_v_heads, int dk, int dv) {
  const int64_t chunks = (static_cast<int64_t>(n) + kChunk - 1) / kChunk;
  return chunks * n_v_heads * record_floats(dk, dv);
}

bool deltanet_chunked_supported(int dk, int dv, int64_t mixed_stride) {
  return dk >= 4 && dk <= 256 && dk % 4 == 0 && dv >= 1 && dv <= 256 && mixed_stride % 4 == 0;
}

void deltanet_scan_chunked(float* S, const float* mixed, int64_t mixed_stride, const float* b, const float* alpha,
                           const float* a, const float* dt_bias, int n, int n_k_heads, int n_v_heads, int dk, int dv,
                           float* o, float* scratch, cudaStream_t s) {
  check_arg(deltanet_chunked_supported(dk, dv, mixed_stride) && (reinterpret_cast<uintptr_t>(mixed) & 15) == 0,
            "deltanet_scan (chunked): needs a key head dim that is a multiple of 4 (4..256), a value head dim of "
            "1..256 and 16-byte aligned mixed rows");
  check_arg(scratch != nullptr, "deltanet_scan (chunked): needs deltanet_chunked_scratch_floats() of scratch");
  if (n <= 0) return;
  const ChunkInputs in{mixed, mixed_stride, b, alpha, a, dt_bias, n, n_k_heads, n_v_heads, dk, dv};
  const int n_chunks = (n + kChunk - 1) / kChunk;
  const size_t psmem = prep_smem(dk, dv);
  allow_dynamic_smem(chunk_prep_kernel, psmem, "cudaFuncSetAttribute(deltanet chunk prep)");
  chunk_prep_kernel<<<dim3(n_chunks, n_v_heads), kThreads, psmem, s>>>(in, scratch);
  check_launch("deltanet_scan (chunked): prep");
  if (dk <= 8 * kWarps) {  // rows per warp: dk over the 8 warps, in float4 steps
    launch_state<8>(in, scratch, S, o, n_chunks, s);
  } else if (dk <= 16 * kWarps) {
    launch_state<16>(in, scratch, S, o, n_chunks, s);
  } else {
    launch_state<32>(in, scratch, S, o, n_chunks, s);
  }
  check_launch("deltanet_scan (chunked): state");
}

}  // namespace strata::cuda::prefill
