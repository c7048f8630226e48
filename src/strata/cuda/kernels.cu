// CUDA kernels of the decode step (see kernels.h for each one's contract): the embedding, norms and
// routing shared with the prefill and the hybrid step, and the fused kernels of the decode graph.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_combine.cuh"
#include "strata/cuda/decode_lookahead.cuh"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/device_math.cuh"
#include "strata/cuda/kernels.h"
#include "strata/cuda/kv_cache.cuh"
#include "strata/cuda/matvec_kernels.h"
#include "strata/cuda/quant_decode.cuh"
#include "strata/cuda/route_warp.cuh"
#include "strata/moe/gpu_support.h"

namespace strata::cuda {
namespace {

// ---- embedding row --------------------------------------------------------------------------------
template <GgmlType T>
__global__ void embed_kernel(const uint8_t* table, size_t row_bytes, int64_t n_cols, const int* token, float* x) {
  pdl_enter();
  const uint8_t* r = table + static_cast<size_t>(*token) * row_bytes;
  if constexpr (is_float_type<T>()) {
    for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n_cols; i += gridDim.x * blockDim.x)
      x[i] = float_elem<T>(r, i);
  } else {
    float wv[32];
    for (int64_t c = blockIdx.x * blockDim.x + threadIdx.x; c < n_cols / 32; c += gridDim.x * blockDim.x) {
      decode_chunk<T>(r, c, wv);
#pragma unroll
      for (int l = 0; l < 32; ++l) x[c * 32 + l] = wv[l];
    }
  }
}

template <GgmlType T>
void launch_embed_t(const DevMatrix& t, const int* token, float* x, cudaStream_t s) {
  launch_pdl("embed_row", embed_kernel<T>, dim3(blocks_for(t.n_cols, 256)), dim3(256), 0, s, t.data, t.row_bytes,
             t.n_cols, token, x);
}

// ---- norms, rotary, attention ---------------------------------------------------------------------
// One row of d values normalised by the block: o = xr / sqrt(mean(xr^2) + eps) * w (mean in double).
__device__ __forceinline__ void rmsnorm_block_row(const float* xr, const float* w, float eps, int d, float* o) {
  double ss = 0.0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  ss = block_sum_d(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int d, float* out) {
  pdl_enter();
  rmsnorm_block_row(x + static_cast<int64_t>(blockIdx.x) * d, w, eps, d, out + static_cast<int64_t>(blockIdx.x) * d);
}

// rmsnorm_rows_pair: block (r, 0) normalises x0's row r, block (r, 1) x1's.
__global__ void rmsnorm_pair_kernel(const float* x0, const float* w0, const float* x1, const float* w1, float eps,
                                    int d, float* out, int64_t out_stride) {
  pdl_enter();
  const bool second = blockIdx.y == 1;
  rmsnorm_block_row((second ? x1 : x0) + static_cast<int64_t>(blockIdx.x) * d, second ? w1 : w0, eps, d,
                    out + static_cast<int64_t>(blockIdx.x) * out_stride + (second ? d : 0));
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// ---- gated DeltaNet --------------------------------------------------------------------------------
// The step for key-head sizes the split kernel does not take (deltanet_step_fast): block per value
// head, one thread per value dim j (blockDim.x = dv rounded up to 32), state updated in place.
__global__ void deltanet_step_kernel(float* S_all, const float* mixed, const float* b, const float* alpha,
                                     const float* a, const float* dt_bias, const float* norm_w, const float* z,
                                     float eps, int n_k_heads, int dk, int dv, float* out) {
  extern __shared__ float qk[];  // q then k, dk each
  const int h = blockIdx.x;
  const int kh = h % n_k_heads;
  const int j = threadIdx.x;
  const int64_t key_dim = static_cast<int64_t>(n_k_heads) * dk;
  const float* q = mixed + static_cast<int64_t>(kh) * dk;
  const float* k = mixed + key_dim + static_cast<int64_t>(kh) * dk;
  const float* v = mixed + 2 * key_dim + static_cast<int64_t>(h) * dv;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    qk[i] = q[i];
    qk[dk + i] = k[i];
  }
  __syncthreads();
  const float beta = sigmoid_dev(b[h]);
  const float g = a[h] * softplus_dev(alpha[h] + dt_bias[h]);
  const float decay = expf(g);
  float* S = S_all + static_cast<int64_t>(h) * dk * dv;
  float o = 0.0f;
  if (j < dv) {
    float delta = 0.0f;
    for (int i = 0; i < dk; ++i) {
      float r = S[static_cast<int64_t>(i) * dv + j] * decay;
      S[static_cast<int64_t>(i) * dv + j] = r;
      delta += r * qk[dk + i];
    }
    delta = beta * (v[j] - delta);
    for (int i = 0; i < dk; ++i) {
      float r = S[static_cast<int64_t>(i) * dv + j] + qk[dk + i] * delta;
      S[static_cast<int64_t>(i) * dv + j] = r;
      o += r * qk[i];
    }
  }
  const double ss = block_sum_d(j < dv ? static_cast<double>(o) * o : 0.0);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dv) + eps));
  if (j < dv) {
    float r = o * inv * norm_w[j];
    r *= silu_dev(z[static_cast<int64_t>(h) * dv + j]);
    out[static_cast<int64_t>(h) * dv + j] = r;
  }
}

// ---- MoE --------------------------------------------------------------------------------------------
// One warp (route_warp.cuh: the routine every GPU routing path shares).
__global__ void route_kernel(const float* logits, int n_expert, int k, bool norm_topk, int* ids, float* weights,
                             unsigned long long* counts) {
  __shared__ float p[1024];
  __shared__ int chosen[64];
  __shared__ float chosen_p[64];
  warp_route(logits, n_expert, k, chosen, chosen_p, p);
  warp_route_store(chosen, chosen_p, k, norm_topk, ids, weights, counts);
}

// Fewest positions per attention chunk (attn_split_kernel): a block's work is worth its launch and the
// last block's merge stays short.
constexpr int kAttnMinChunk = 32;
// Most chunks of one head (attention_splits; the merge keeps each chunk's statistics in shared memory).
constexpr int kAttnMaxSplits = 128;

// Positions per chunk when n_ctx positions are split S ways: the kernel's rule for the live context and
// the launcher's for the largest chunk (its shared memory), one formula so the two cannot drift apart.
__host__ __device__ constexpr int attention_chunk(int n_ctx, int S) {
  return (n_ctx + S - 1) / S > kAttnMinChunk ? (n_ctx + S - 1) / S : kAttnMinChunk;
}

// ---- fused kernels of the fast decode step ------------------------------------------------------------
// Attention inputs in one launch: blocks [0, n_head) normalise + rotate the query heads in place,
// [n_head, n_head + n_kv) the key heads into the cache row at *pos, the last block copies the value row.
template <typename TK, typename TV>
__global__ void attn_prep_kernel(float* q, int q_head_stride, const float* kk, const float* vv, TK* k_cache,
                                 TV* v_cache, int kv_width, int n_head, int n_kv, int head_dim, const float* q_norm,
                                 const float* k_norm, float eps, int rope_dims, float freq_base, const int* pos_ptr,
                                 int rows, YarnDev yarn, AttnTokens ts) {
  extern __shared__ float buf[];  // head_dim
  const int bid = blockIdx.x;
  const int tok = static_cast<int>(blockIdx.y);  // a token grid's token (0 in a one-token launch)
  q += tok * ts.q;
  kk += tok * ts.kv;
  vv += tok * ts.kv;
  pos_ptr += tok;
  pdl_launch_dependents();
  // The position was written before this step began (host copy or the last step's publish), so it and
  // the rotary cos/sin are read and computed before waiting on the previous kernel: the trig's latency
  // hides under that kernel's tail.
  const int64_t pos = *pos_ptr;
  const int64_t row = ring_row(ts.base ? *ts.base + tok : static_cast<int>(pos), rows);  // a sliding layer's ring
  const bool rotates = static_cast<int>(threadIdx.x) < rope_dims / 2 && bid < n_head + n_kv;
  const float2 cs = rotates ? rope_cos_sin_at(pos, threadIdx.x, rope_dims, freq_base, yarn) : make_float2(1.0f, 0.0f);
  pdl_wait();
  if (bid == n_head + n_kv) {
    for (int i = threadIdx.x; i < kv_width; i += blockDim.x) kv_store(v_cache + row * kv_width + i, vv[i]);
    return;
  }
  if (bid < n_head) {
    float* qh = q + static_cast<int64_t>(bid) * q_head_stride;
    norm_rope_head_cs(qh, qh, head_dim, q_norm, eps, rope_dims, cs, buf);
  } else {
    const int h = bid - n_head;
    norm_rope_head_cs(kk + static_cast<int64_t>(h) * head_dim, k_cache + row * kv_width + static_cast<int64_t>(h) * head_dim,
                      head_dim, k_norm, eps, rope_dims, cs, buf);
  }
}

// Conv1d step + SiLU + the q/k L2 norms in one launch: block b < n_k: query head b, < 2 n_k: key head,
// else value head (no norm). Same per-channel arithmetic as conv1d_silu_kernel and qk_l2norm_kernel.
__global__ void conv_qk_norm_kernel(const float* x, const float* weight, int K, int channels, const float* state,
                                    float* state_out, float* out, int n_k, int dk, int dv, float q_scale) {
  pdl_enter();
  extern __shared__ float vals[];  // max(dk, dv)
  const int bid = blockIdx.x;
  const bool is_q = bid < n_k, is_k = !is_q && bid < 2 * n_k;
  const int c0 = bid < 2 * n_k ? bid * dk : 2 * n_k * dk + (bid - 2 * n_k) * dv;
  const int width = bid < 2 * n_k ? dk : dv;
  double ss = 0.0;
  for (int t = threadIdx.x; t < width; t += blockDim.x) {
    const int c = c0 + t;
    const float* w = weight + static_cast<int64_t>(c) * K;
    float acc = w[K - 1] * x[c];
    for (int j = 0; j < K - 1; ++j) acc += w[j] * state[static_cast<int64_t>(j) * channels + c];
    const float v = silu_dev(acc);
    vals[t] = v;
    ss += static_cast<double>(v) * v;
    if (K > 1) {
      for (int j = 0; j < K - 2; ++j)
        state_out[static_cast<int64_t>(j) * channels + c] = state[static_cast<int64_t>(j + 1) * channels + c];
      state_out[static_cast<int64_t>(K - 2) * channels + c] = x[c];
    }
  }
  if (is_q || is_k) {
    ss = block_sum_d(ss);
    const float inv = static_cast<float>(1.0 / sqrt(ss + 1e-6f));
    for (int t = threadIdx.x; t < width; t += blockDim.x) {
      float v = vals[t] * inv;
      if (is_q) v *= q_scale;
      out[c0 + t] = v;
    }
  } else {
    for (int t = threadIdx.x; t < width; t += blockDim.x) out[c0 + t] = vals[t];
  }
}

// Gated delta rule with the state spread over the whole GPU: block (h, slice) owns the 32 value columns
// slice*32 .. +31 of head h (one warp's lanes) and all dk rows, cut into groups of RPW rows (one warp
// each, held in registers); the per-column sums over rows meet in shared memory in group order. The
// gated RMSNorm needs the whole head: each block leaves its raw outputs and its sum of squares (double)
// in scratch, and the last block of the head to finish applies the norm (slices summed in order, so
// the result does not depend on timing).
template <int RPW>
__global__ void deltanet_step_split_kernel(const float* S_all, float* S_out_all, const float* mixed, const float* b,
                                           const float* alpha,
                                           const float* a, const float* dt_bias, const float* norm_w, const float* z,
                                           float eps, int n_k_heads, int dk, int dv, double* ss_part,
                                           unsigned int* counters, float* out, bool qk_norm, float q_scale,
                                           const DeltaNetTokens tk) {
  pdl_launch_dependents();
  extern __shared__ float sh[];  // q[dk], k[dk], part[R * 32]
  __shared__ double wss[32];
  __shared__ bool last;
  const int h = blockIdx.x, slice = blockIdx.y, nsl = gridDim.y, n_v_heads = gridDim.x;
  const int kh = h % n_k_heads;
  const int rg = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int R = static_cast<int>(blockDim.x >> 5);
  const int j = slice * 32 + lane;
  const int i0 = rg * RPW;
  float* sq = sh;
  float* sk = sh + dk;
  float* part = sh + 2 * dk;
  const int64_t key_dim = static_cast<int64_t>(n_k_heads) * dk;
  const int64_t head_state = static_cast<int64_t>(dk) * dv;
  // The state is read before waiting on the previous kernel: only this kernel writes it, and its last
  // writer (this layer's step of the previous token) has completed. With a ping-pong pair (S_out not
  // S), the buffer written was last read by the step before that one, also complete.
  const bool col = j < dv;
  const float* S = S_all + h * head_state;
  float r[RPW];
  if (col) {
#pragma unroll
    for (int ii = 0; ii < RPW; ++ii) r[ii] = S[static_cast<int64_t>(i0 + ii) * dv + j];
  }
  pdl_wait();
  // Token by token, the state staying in registers: token t's state goes to record t (tk.records), the
  // last token's to S_out; each token's arithmetic is a single step's.
  for (int t = 0; t < tk.n; ++t) {
    const float* mt = mixed + t * tk.mixed_stride;
    const float* q = mt + static_cast<int64_t>(kh) * dk;
    const float* k = mt + key_dim + static_cast<int64_t>(kh) * dk;
    const float* v = mt + 2 * key_dim + static_cast<int64_t>(h) * dv;
    float* S_out = (t + 1 < tk.n ? tk.records + t * tk.record_stride : S_out_all) + h * head_state;  // may be S
    if (tk.parents && t > 0 && col) {  // a tree: a token whose parent is not the previous one starts over
      const int pa = tk.parents[t];
      if (pa != t - 1) {
        const float* from = pa < 0 ? S : tk.records + pa * tk.record_stride + h * head_state;
#pragma unroll
        for (int ii = 0; ii < RPW; ++ii) r[ii] = from[static_cast<int64_t>(i0 + ii) * dv + j];
      }
    }
    for (int i = threadIdx.x; i < dk; i += blockDim.x) {
      sq[i] = q[i];
      sk[i] = k[i];
    }
    __syncthreads();
    if (qk_norm) {  // deltanet_qk_norm's L2 norms (eps 1e-6), done here instead of in the conv launch
      double ssq = 0.0, ssk = 0.0;
      for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        ssq += static_cast<double>(sq[i]) * sq[i];
        ssk += static_cast<double>(sk[i]) * sk[i];
      }
      ssq = block_sum_d(ssq);
      ssk = block_sum_d(ssk);
      const float iq = static_cast<float>(1.0 / sqrt(ssq + 1e-6f)), ik = static_cast<float>(1.0 / sqrt(ssk + 1e-6f));
      __syncthreads();  // every thread has read sq/sk for its sums
      for (int i = threadIdx.x; i < dk; i += blockDim.x) {
        sq[i] = sq[i] * iq * q_scale;
        sk[i] = sk[i] * ik;
      }
      __syncthreads();
    }
    const int64_t hb = t * tk.gate_stride + h;
    const float beta = sigmoid_dev(b[hb]);
    const float decay = expf(a[h] * softplus_dev(alpha[hb] + dt_bias[h]));
    float acc = 0.0f;
    if (col) {
#pragma unroll
      for (int ii = 0; ii < RPW; ++ii) {
        r[ii] *= decay;
        acc += r[ii] * sk[i0 + ii];
      }
    }
    part[rg * 32 + lane] = acc;
    __syncthreads();
    float o = 0.0f;
    if (col) {
      float mem = 0.0f;
      for (int g = 0; g < R; ++g) mem += part[g * 32 + lane];
      const float delta = beta * (v[j] - mem);
#pragma unroll
      for (int ii = 0; ii < RPW; ++ii) {
        r[ii] += sk[i0 + ii] * delta;
        S_out[static_cast<int64_t>(i0 + ii) * dv + j] = r[ii];
        o += r[ii] * sq[i0 + ii];
      }
    }
    __syncthreads();  // every column has read part[]
    part[rg * 32 + lane] = o;
    __syncthreads();
    if (rg == 0) {
      float ot = 0.0f;
      for (int g = 0; g < R; ++g) ot += part[g * 32 + lane];
      double sq2 = col ? static_cast<double>(ot) * ot : 0.0;
      for (int off = 16; off > 0; off >>= 1) sq2 += __shfl_xor_sync(0xffffffffu, sq2, off);
      if (col) out[t * tk.out_stride + static_cast<int64_t>(h) * dv + j] = ot;  // raw; normalised below
      if (lane == 0) ss_part[(static_cast<int64_t>(t) * n_v_heads + h) * nsl + slice] = sq2;
    }
  }
  if (rg == 0) {
    __threadfence();  // every lane's writes are visible device-wide before the block is counted
    __syncwarp();
    if (lane == 0) last = atomicAdd(counters + h, 1u) == static_cast<unsigned>(nsl - 1);
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The head's last block applies the gated RMSNorm to every token's outputs (slices summed in order).
  for (int t = 0; t < tk.n; ++t) {
    if (threadIdx.x == 0) {
      double ss = 0.0;
      for (int sl = 0; sl < nsl; ++sl) ss += __ldcg(ss_part + (static_cast<int64_t>(t) * n_v_heads + h) * nsl + sl);
      wss[0] = ss;
      if (t + 1 == tk.n) counters[h] = 0;
    }
    __syncthreads();
    const float inv = static_cast<float>(1.0 / sqrt(wss[0] / static_cast<double>(dv) + eps));
    for (int jj = threadIdx.x; jj < dv; jj += blockDim.x) {
      const int64_t idx = t * tk.out_stride + static_cast<int64_t>(h) * dv + jj;
      float res = __ldcg(out + idx) * inv * norm_w[jj];
      res *= silu_dev(z[idx]);
      out[idx] = res;
    }
    __syncthreads();  // wss[0] is read before the next token's sum is written
  }
}

// x += routed experts (ascending expert id) + gated shared expert, then xn = rmsnorm(x) * norm_w.
// One block: the whole row is reduced for the norm.
// Launched with 1024 threads: the bound keeps the combine's loads in flight within 64 registers.
__global__ void __launch_bounds__(1024)
    moe_combine_norm_kernel(float* x, const float* ye, const int* ids, const float* weights, int k, int d,
                            const float* ys, const float* shared_gate, const float* norm_w, float eps, float* xn) {
  pdl_enter();
  moe_combine_norm_block(x, ye, ids, weights, k, d, ys, shared_gate, norm_w, eps, xn);
}

// Arg-max over many blocks: each block's best as an orderable key (value bits, then ~index so that the
// lower index wins ties) in partial[blockIdx.x]; the last block to finish reduces them (counter reset
// for the next launch).
// Larger logit, larger key; the lower index among equals. NaN and -inf (and, with finite_only, +inf) get
// key 0 and never win, as the host's argmax_logit skips them (and the sampler's max is over finite logits).
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i, bool finite_only) {
  if (isnan(v) || v == -INFINITY || (finite_only && isinf(v))) return 0ull;
  return (static_cast<unsigned long long>(float_order_key(v)) << 32) |
         static_cast<unsigned long long>(~static_cast<uint32_t>(i));
}

// copy_batch: copy blockIdx.y, its words spread over the x blocks.
struct CopyRows {
  uint32_t* dst;
  const uint32_t* src;
  size_t row_words, rows, dst_pitch, src_pitch;
};
struct CopyBatch {
  CopyRows c[kMaxDeviceCopies];
  int n;
};

// Launched without programmatic dependence and never releasing its dependents early: like a memcpy, it
// starts after the previous work of the stream and whatever follows starts after it (kernels that read
// their state before their programmatic wait rely on that).
__global__ void copy_batch_kernel(const __grid_constant__ CopyBatch b) {
  const CopyRows& c = b.c[blockIdx.y];
  const size_t total = c.row_words * c.rows;
  for (size_t w = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < total;
       w += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = w / c.row_words, col = w - r * c.row_words;
    c.dst[r * c.dst_pitch + col] = c.src[r * c.src_pitch + col];
  }
}

__global__ void argmax_wide_kernel(const float* x, int64_t n, unsigned long long* partial, unsigned int* counter,
                                   int* out, bool finite_only, int* pub_io, unsigned long long* pub_count,
                                   unsigned long long* pub_host, int64_t row_stride) {
  __shared__ unsigned long long best[32];
  pdl_enter();
  __shared__ bool last;
  // Row blockIdx.y of a rows launch: its own logits, partials, counter and pick.
  x += static_cast<int64_t>(blockIdx.y) * row_stride;
  partial += static_cast<size_t>(blockIdx.y) * gridDim.x;
  counter += blockIdx.y;
  out += blockIdx.y;
  unsigned long long k = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    k = max(k, argmax_key(x[i], i, finite_only));
  for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
  if ((threadIdx.x & 31) == 0) best[threadIdx.x >> 5] = k;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) k = max(k, best[w]);
    partial[blockIdx.x] = k;
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  unsigned long long m = 0;
  for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) m = max(m, __ldcg(partial + b));
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __syncthreads();  // best[] of the first pass has been read
  if ((threadIdx.x & 31) == 0) best[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) m = max(m, best[w]);
    const int pick = m == 0 ? -1 : static_cast<int>(~static_cast<uint32_t>(m & 0xffffffffull));  // -1: none
    *out = pick;
    *counter = 0;
    if (pub_io) publish_pick_dev(pick, pub_io, pub_count, pub_host);
  }
}

// Decode attention split over the cache (flash-decoding): block (h, c) takes chunk c of the n_ctx
// positions (gridDim.y chunks at most, each of at least kAttnMinChunk positions and sized from n_ctx so
// every active block has work): scores with a warp per position, four positions per step (lanes along
// head_dim, coalesced key rows, four rows' loads in flight), softmax statistics of the chunk, and the
// unnormalised value sum with a thread per dim, eight value rows' loads in flight per step (summed in
// position order). One active chunk writes the output; otherwise each block leaves (max, sum, partial
// output) in scratch and the last block of the head merges them in chunk order (a deterministic result).
// Short chunks keep each block's chain of dependent loads short: long chunks made short contexts pay a
// long serial chain per attention layer inside the decode graph (docs/PERF.md has the comparison).

__device__ __forceinline__ float out_gate(const AttnOutGate& G, const float* qh, int h, int head_dim, int d) {
  switch (G.kind) {
    case AttnOutGate::SigmoidAfterQuery: return sigmoid_dev(qh[head_dim + d]);
    case AttnOutGate::SoftplusPerHead: return softplus_dev(G.g[h]);
    case AttnOutGate::SoftplusPerElement: return softplus_dev(G.g[static_cast<int64_t>(h) * head_dim + d]);
    default: return 1.0f;
  }
}

template <typename TK, typename TV>
__global__ void attn_split_kernel(const float* q, int q_head_stride, const TK* k_cache, const TV* v_cache,
                                  int64_t kv_stride, int group, int head_dim, float scale, AttnOutGate gate,
                                  const int* pos_ptr, int window, int ring_rows, float* scratch, unsigned int* counters,
                                  float* out, AttnTokens ts) {
  const int tok = static_cast<int>(blockIdx.z);  // a token grid's token (0 in a one-token launch)
  q += tok * ts.q;
  out += tok * ts.out;
  if (gate.g) gate.g += tok * ts.gate;
  scratch += tok * ts.scratch;
  counters += tok * ts.counters;
  pos_ptr += tok;
  pdl_launch_dependents();
  extern __shared__ float sm[];  // q[head_dim], scores[chunk]
  __shared__ bool last;
  const int h = blockIdx.x, c = blockIdx.y, S = gridDim.y;
  const int g = h / group;
  // The position was written before this step began (attention_decode_split's contract), so the chunk
  // is known before the wait on the previous kernel, and the chunk's cache rows older than this step's
  // (written by earlier steps) are pulled into L2 meanwhile: the scores' dependent loads then hit L2.
  // Positions lo .. *pos are attended (lo > 0 only in a sliding window); p below is relative to lo.
  const int n_all = *pos_ptr + 1;
  // A tree's pending positions are read from its token's root-path rows (AttnTokens::path).
  const int path_base = ts.path ? *ts.base : n_all;
  const int* path = ts.path ? ts.path + tok * ts.path_stride : nullptr;
  auto row_at = [&](int P) -> int64_t { return ring_row(P >= path_base ? path[P - path_base] : P, ring_rows); };
  int lo = window > 0 ? max(0, n_all - window) : 0;
  if (ts.first) lo = min(max(lo, *ts.first), n_all - 1);
  const int n_ctx = n_all - lo;
  const int per = attention_chunk(n_ctx, S);  // <= the launch's chunk (attention_decode_split)
  const int n_act = (n_ctx + per - 1) / per;
  if (c >= n_act) return;  // block-uniform
  const int p0 = c * per, p1 = min(n_ctx, p0 + per);
  {
    // 128-byte lines of a head's key and value rows.
    const int k_lines = (head_dim * static_cast<int>(sizeof(TK)) + 127) / 128;
    const int v_lines = (head_dim * static_cast<int>(sizeof(TV)) + 127) / 128;
    const int rows = min(p1, n_ctx - 1) - p0;
    const int nk = rows * k_lines, n = nk + rows * v_lines;
    const int64_t off = static_cast<int64_t>(g) * head_dim;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const bool is_k = i < nk;
      const int j = is_k ? i : i - nk, lines = is_k ? k_lines : v_lines;
      const int64_t e = row_at(lo + p0 + j / lines) * kv_stride + off;
      const char* base = is_k ? reinterpret_cast<const char*>(k_cache + e) : reinterpret_cast<const char*>(v_cache + e);
      asm volatile("prefetch.global.L2 [%0];" ::"l"(base + 128 * (j % lines)));
    }
  }
  pdl_wait();
  float* sq = sm;
  float* sc = sm + head_dim;
  const float* qh = q + static_cast<int64_t>(h) * q_head_stride;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) sq[d] = qh[d];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  const int64_t koff = static_cast<int64_t>(g) * head_dim;
  for (int p = p0 + warp; p < p1; p += 4 * nw) {
    const TK* k[4];
    float dot[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int pu = p + u * nw < p1 ? p + u * nw : p;  // past the chunk: row p again, result dropped
      k[u] = k_cache + row_at(lo + pu) * kv_stride + koff;
      dot[u] = 0.0f;
    }
    for (int d = lane; d < head_dim; d += 32) {
      const float qd = sq[d];
#pragma unroll
      for (int u = 0; u < 4; ++u) dot[u] += qd * kv_load(k[u] + d);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dot[u] += __shfl_xor_sync(0xffffffffu, dot[u], o);
      if (lane == 0 && p + u * nw < p1) sc[p + u * nw - p0] = dot[u] * scale;
    }
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < p1 - p0; i += blockDim.x) mx = fmaxf(mx, sc[i]);
  mx = block_max(mx);
  double l = 0.0;
  for (int i = threadIdx.x; i < p1 - p0; i += blockDim.x) {
    const float e = expf(sc[i] - mx);
    sc[i] = e;
    l += e;
  }
  l = block_sum_d(l);
  __syncthreads();
  const int64_t voff = static_cast<int64_t>(g) * head_dim;
  float* part = scratch + (static_cast<int64_t>(h) * S + c) * (head_dim + 2);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    const TV* vd = v_cache + voff + d;
    int p = p0;
    for (; p + 8 <= p1; p += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = kv_load(vd + row_at(lo + p + u) * kv_stride);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc += sc[p + u - p0] * v[u];
    }
    for (; p < p1; ++p) acc += sc[p - p0] * kv_load(vd + row_at(lo + p) * kv_stride);
    if (n_act == 1) {
      float r = acc * static_cast<float>(1.0 / l);
      if (gate.kind != AttnOutGate::None) r *= out_gate(gate, qh, h, head_dim, d);
      out[static_cast<int64_t>(h) * head_dim + d] = r;
    } else {
      part[2 + d] = acc;
    }
  }
  if (n_act == 1) return;
  if (threadIdx.x == 0) {
    part[0] = mx;
    part[1] = static_cast<float>(l);
  }
  __syncthreads();  // the block's partial outputs are ordered before thread 0's fence (last_block_of's pattern)
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counters + h, 1u) == static_cast<unsigned>(n_act - 1);
    if (last) __threadfence();
  }
  __syncthreads();
  if (!last) return;
  // The merge: every partial's statistics read at once (each an L2 round trip; read one after another,
  // they made the merge the longest chain of the launch), the sums still taken in chunk order.
  const float* base = scratch + static_cast<int64_t>(h) * S * (head_dim + 2);
  __shared__ float m_sh[kAttnMaxSplits], w_sh[kAttnMaxSplits];
  __shared__ double l_sh[kAttnMaxSplits];
  for (int i = threadIdx.x; i < n_act; i += blockDim.x) {
    m_sh[i] = __ldcg(base + static_cast<int64_t>(i) * (head_dim + 2));
    l_sh[i] = static_cast<double>(__ldcg(base + static_cast<int64_t>(i) * (head_dim + 2) + 1));
  }
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < n_act; ++i) M = fmaxf(M, m_sh[i]);
  for (int i = threadIdx.x; i < n_act; i += blockDim.x) {
    l_sh[i] *= exp(static_cast<double>(m_sh[i]) - M);
    w_sh[i] = expf(m_sh[i] - M);
  }
  __syncthreads();
  double L = 0.0;
  for (int i = 0; i < n_act; ++i) L += l_sh[i];
  const float invL = static_cast<float>(1.0 / L);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    const float* pd = base + 2 + d;
    float acc = 0.0f;
    int i = 0;
    for (; i + 4 <= n_act; i += 4) {  // four loads in flight, added in order
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = __ldcg(pd + static_cast<int64_t>(i + u) * (head_dim + 2));
#pragma unroll
      for (int u = 0; u < 4; ++u) acc += v[u] * w_sh[i + u];
    }
    for (; i < n_act; ++i) acc += __ldcg(pd + static_cast<int64_t>(i) * (head_dim + 2)) * w_sh[i];
    float r = acc * invL;
    if (gate.kind != AttnOutGate::None) r *= out_gate(gate, qh, h, head_dim, d);
    out[static_cast<int64_t>(h) * head_dim + d] = r;
  }
  if (threadIdx.x == 0) counters[h] = 0;
}

}  // namespace

bool supported_type(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K: return true;
    default: return false;
  }
}

const char* supported_type_names() { return "f32, f16, bf16, q8_0, q4_k, q5_k, q6_k"; }

namespace {
__global__ void attn_gate_mul_kernel(float* o, const float* gate, int n, int head_dim, bool per_head) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) o[i] *= softplus_dev(gate[per_head ? i / head_dim : i]);
}
}  // namespace

void attn_gate_mul(float* o, const float* gate, int n_head, int head_dim, bool per_head, cudaStream_t s) {
  const int n = n_head * head_dim;
  attn_gate_mul_kernel<<<(n + 255) / 256, 256, 0, s>>>(o, gate, n, head_dim, per_head);
  check_launch("attn_gate_mul");
}

void matvec(const DevMatrix& w, const float* x, float* y, cudaStream_t s) {
  GemvJob j;
  j.w = &w;
  j.x = x;
  j.y = y;
  gemv_batch(&j, 1, s);
}

void embed_row(const DevMatrix& t, const int* token, float* x, cudaStream_t s) {
  switch (t.type) {
    case GgmlType::F32: return launch_embed_t<GgmlType::F32>(t, token, x, s);
    case GgmlType::F16: return launch_embed_t<GgmlType::F16>(t, token, x, s);
    case GgmlType::BF16: return launch_embed_t<GgmlType::BF16>(t, token, x, s);
    case GgmlType::Q8_0: return launch_embed_t<GgmlType::Q8_0>(t, token, x, s);
    case GgmlType::Q4_K: return launch_embed_t<GgmlType::Q4_K>(t, token, x, s);
    case GgmlType::Q5_K: return launch_embed_t<GgmlType::Q5_K>(t, token, x, s);
    case GgmlType::Q6_K: return launch_embed_t<GgmlType::Q6_K>(t, token, x, s);
    default: fail_unsupported_type("embed_row", t.type);
  }
}

void rmsnorm_rows(const float* x, const float* w, float eps, int n_rows, int d, float* out, cudaStream_t s) {
  launch_pdl("rmsnorm_rows", rmsnorm_kernel, dim3(n_rows), dim3(256), 0, s, x, w, eps, d, out);
}

void rmsnorm_rows_pair(const float* x0, const float* w0, const float* x1, const float* w1, float eps, int n_rows, int d,
                       float* out, int64_t out_stride, cudaStream_t s) {
  check_arg(out_stride >= 2 * static_cast<int64_t>(d), "rmsnorm_rows_pair: an output row holds both halves");
  launch_pdl("rmsnorm_rows_pair", rmsnorm_pair_kernel, dim3(n_rows, 2), dim3(256), 0, s, x0, w0, x1, w1, eps, d, out,
             out_stride);
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, y, n);
  check_launch("add_inplace");
}

void route_topk(const float* logits, int n_expert, int k, bool norm_topk, int* ids, float* weights, cudaStream_t s,
                unsigned long long* counts) {
  check_arg(n_expert <= 1024 && k <= 64 && k <= n_expert, "route_topk: n_expert <= 1024 and k <= 64");
  route_kernel<<<1, 32, 0, s>>>(logits, n_expert, k, norm_topk, ids, weights, counts);
  check_launch("route_topk");
}

YarnDev yarn_dev(const RopeYarn* yarn, int rope_dims, float freq_base) {
  YarnDev y;
  if (!yarn || !yarn->on()) return y;
  // The ramp's ends as rope_neox_yarn_inplace computes them.
  const int half = rope_dims / 2;
  auto corr = [&](float rotations) {
    return static_cast<double>(rope_dims) * std::log(yarn->orig_ctx / (rotations * 2.0 * M_PI)) /
           (2.0 * std::log(static_cast<double>(freq_base)));
  };
  const double low = std::max(0.0, std::floor(corr(yarn->beta_fast)));
  const double high = std::min(static_cast<double>(half - 1), std::ceil(corr(yarn->beta_slow)));
  y.factor = yarn->factor, y.low = low, y.span = std::max(0.001, high - low), y.mscale = yarn->mscale;
  return y;
}

void attn_prep(float* q, int q_head_stride, const float* kk, const float* vv, void* k_cache, void* v_cache,
               int kv_width, int n_head, int n_kv, int head_dim, const float* q_norm, const float* k_norm, float eps,
               int rope_dims, float freq_base, const int* pos, cudaStream_t s, KvCacheTypes kv, int rows,
               const RopeYarn* yarn, const AttnTokens& tokens) {
  check_arg(head_dim <= kGpuMaxHeadDim && rope_dims <= head_dim && rope_dims % 2 == 0, "attn_prep: head_dim/rope_dims");
  check_arg(tokens.n >= 1, "attn_prep: at least one token");
  if (rows <= 0) rows = std::numeric_limits<int>::max();
  const YarnDev y = yarn_dev(yarn, rope_dims, freq_base);
  with_kv_types(kv, [&](auto tk, auto tv) {
    using TK = decltype(tk);
    using TV = decltype(tv);
    launch_pdl("attn_prep", attn_prep_kernel<TK, TV>, dim3(n_head + n_kv + 1, tokens.n), dim3(warp_round(head_dim)),
               head_dim * sizeof(float), s, q, q_head_stride, kk, vv, static_cast<TK*>(k_cache),
               static_cast<TV*>(v_cache), kv_width, n_head, n_kv, head_dim, q_norm, k_norm, eps, rope_dims, freq_base,
               pos, rows, y, tokens);
  });
}

void conv_qk_norm(const float* x, const float* weight, int K, float* state, float* out, int n_k_heads, int n_v_heads,
                  int dk, int dv, float q_scale, cudaStream_t s, float* state_out) {
  const int channels = 2 * n_k_heads * dk + n_v_heads * dv;
  float* st_out = state_out ? state_out : state;
  launch_pdl("conv_qk_norm", conv_qk_norm_kernel, dim3(2 * n_k_heads + n_v_heads), dim3(128),
             std::max(dk, dv) * sizeof(float), s, x, weight, K, channels, static_cast<const float*>(state), st_out, out,
             n_k_heads, dk, dv, q_scale);
}

size_t deltanet_scratch_doubles(int n_v_heads, int dv) { return static_cast<size_t>(n_v_heads) * ((dv + 31) / 32); }

// The column kernel's launcher (deltanet_step_fast's fallback).
static void deltanet_step_columns(float* S, const float* mixed, const float* b, const float* alpha, const float* a,
                                  const float* dt_bias, const float* norm_w, const float* z, float eps, int n_k_heads,
                                  int n_v_heads, int dk, int dv, float* out, cudaStream_t s) {
  check_arg(dv <= kGpuMaxHeadDim, "deltanet_step_fast: value head dim > 1024");
  deltanet_step_kernel<<<n_v_heads, warp_round(dv), 2 * dk * sizeof(float), s>>>(S, mixed, b, alpha, a, dt_bias,
                                                                                   norm_w, z, eps, n_k_heads, dk, dv,
                                                                                   out);
  check_launch("deltanet_step_fast");
}

// Rows per warp of the split DeltaNet kernel for key-head size dk; 0: not covered.
int split_rows_per_warp(int dk) {
  for (int cand : {32, 16, 8})
    if (dk % cand == 0 && dk / cand <= 32) return cand;
  return 0;
}

bool deltanet_step_fuses_qk_norm(int dk) { return split_rows_per_warp(dk) != 0; }

void deltanet_step_fast(float* S, const float* mixed, const float* b, const float* alpha, const float* a,
                        const float* dt_bias, const float* norm_w, const float* z, float eps, int n_k_heads,
                        int n_v_heads, int dk, int dv, double* scratch, unsigned int* counters, float* out,
                        cudaStream_t s, bool qk_norm, float q_scale, float* S_out, bool after_previous,
                        const DeltaNetTokens& tokens) {
  const int nsl = (dv + 31) / 32;
  const int rpw = split_rows_per_warp(dk);
  check_arg(tokens.n >= 1 && (tokens.n == 1 || (rpw != 0 && tokens.records)),
            "deltanet_step_fast: several tokens need the split kernel's head sizes and step records");
  if (rpw == 0) {  // shapes the split kernel does not cover: the one-thread-per-column kernel (in place)
    if (qk_norm) fail("deltanet_step_fast: the q/k norm is fused only for head sizes the split kernel takes (dk ", dk, ")");
    if (S_out && S_out != S)
      check_cuda(cudaMemcpyAsync(S_out, S, sizeof(float) * static_cast<size_t>(n_v_heads) * dk * dv,
                                 cudaMemcpyDeviceToDevice, s),
                 "deltanet_step_fast: state copy");
    deltanet_step_columns(S_out ? S_out : S, mixed, b, alpha, a, dt_bias, norm_w, z, eps, n_k_heads, n_v_heads, dk,
                          dv, out, s);
    return;
  }
  const float* S_in = S;
  if (!S_out) S_out = S;
  const dim3 grid(n_v_heads, nsl), block((dk / rpw) * 32);
  const size_t smem = (2 * static_cast<size_t>(dk) + static_cast<size_t>(dk / rpw) * 32) * sizeof(float);
  switch (rpw) {
    case 32:
      launch_programmatic("deltanet_step_fast", !after_previous, deltanet_step_split_kernel<32>, grid, block, smem, s,
                          S_in, S_out, mixed, b, alpha, a, dt_bias, norm_w, z, eps, n_k_heads, dk, dv, scratch, counters,
                          out, qk_norm, q_scale, tokens);
      break;
    case 16:
      launch_programmatic("deltanet_step_fast", !after_previous, deltanet_step_split_kernel<16>, grid, block, smem, s,
                          S_in, S_out, mixed, b, alpha, a, dt_bias, norm_w, z, eps, n_k_heads, dk, dv, scratch, counters,
                          out, qk_norm, q_scale, tokens);
      break;
    default:
      launch_programmatic("deltanet_step_fast", !after_previous, deltanet_step_split_kernel<8>, grid, block, smem, s,
                          S_in, S_out, mixed, b, alpha, a, dt_bias, norm_w, z, eps, n_k_heads, dk, dv, scratch, counters,
                          out, qk_norm, q_scale, tokens);
      break;
  }
}

void moe_combine_add_norm(float* x, const float* ye, const int* ids, const float* weights, int k, int d,
                          const float* ys, const float* shared_gate, const float* norm_w, float eps, float* xn,
                          cudaStream_t s) {
  check_arg(k <= 64, "moe_combine_add_norm: k <= 64");
  launch_pdl("moe_combine_add_norm", moe_combine_norm_kernel, dim3(1), dim3(1024), 0, s, x, ye, ids, weights, k, d, ys,
             shared_gate, norm_w, eps, xn);
}

int argmax_wide_blocks(int64_t n) { return static_cast<int>(std::min<int64_t>(264, std::max<int64_t>(1, (n + 1023) / 1024))); }

void argmax_wide(const float* x, int64_t n, unsigned long long* partial, unsigned int* counter, int* out,
                 cudaStream_t s, bool finite_only, const LookaheadLink* publish, int* io, int rows, int64_t row_stride) {
  check_arg(rows >= 1 && (rows == 1 || (row_stride >= n && !publish)),
            "argmax_wide: rows need a stride of at least a row and no publish");
  launch_pdl("argmax_wide", argmax_wide_kernel, dim3(argmax_wide_blocks(n), rows), dim3(256), 0, s, x, n, partial,
             counter, out, finite_only, publish ? io : nullptr, publish ? publish->dev_count : nullptr,
             publish ? publish->dev_pick : nullptr, rows > 1 ? row_stride : int64_t{0});
}

void copy_batch(const DeviceCopy* copies, int n, cudaStream_t s) {
  check_arg(n >= 0, "copy_batch: a negative count");
  for (; n > kMaxDeviceCopies; copies += kMaxDeviceCopies, n -= kMaxDeviceCopies) copy_batch(copies, kMaxDeviceCopies, s);
  if (n == 0) return;
  CopyBatch b{};
  b.n = n;
  size_t most = 0;
  for (int i = 0; i < n; ++i) {
    const DeviceCopy& c = copies[i];
    const size_t dp = c.dst_pitch ? c.dst_pitch : c.row_bytes, sp = c.src_pitch ? c.src_pitch : c.row_bytes;
    check_arg(c.dst && c.src && c.rows >= 1 && c.row_bytes % 4 == 0 && dp % 4 == 0 && sp % 4 == 0 &&
                  reinterpret_cast<uintptr_t>(c.dst) % 4 == 0 && reinterpret_cast<uintptr_t>(c.src) % 4 == 0 &&
                  dp >= c.row_bytes && sp >= c.row_bytes,
              "copy_batch: a copy needs 4-byte multiples and pitches of at least a row");
    b.c[i] = CopyRows{static_cast<uint32_t*>(c.dst), static_cast<const uint32_t*>(c.src), c.row_bytes / 4, c.rows,
                      dp / 4, sp / 4};
    most = std::max(most, c.row_bytes / 4 * c.rows);
  }
  const int blocks = static_cast<int>(std::min<size_t>(132, (most + 1023) / 1024));
  launch_programmatic("copy_batch", false, copy_batch_kernel, dim3(std::max(1, blocks), n), dim3(256), 0, s, b);
}

int attention_splits(int max_ctx) {
  const int by_len = (max_ctx + kAttnMinChunk - 1) / kAttnMinChunk;  // chunks of kAttnMinChunk at full context
  const int by_smem = (max_ctx + 8191) / 8192;  // at most 8192 scores of shared memory per block
  return std::max(1, std::max(std::min(64, by_len), by_smem));
}

size_t attention_scratch_floats(int n_head, int head_dim, int max_ctx) {
  return static_cast<size_t>(n_head) * attention_splits(max_ctx) * (head_dim + 2);
}

void attention_decode_split(const float* q, int q_head_stride, const void* k_cache, const void* v_cache,
                            int64_t kv_stride, int n_head, int n_head_kv, int head_dim, float scale,
                            AttnOutGate gate, const int* pos, int max_ctx, float* scratch, unsigned int* counters,
                            float* out, cudaStream_t s, KvCacheTypes kv, int window, int rows,
                            const AttnTokens& tokens) {
  if (rows <= 0) rows = max_ctx;
  check_arg(tokens.n >= 1, "attention_decode_split: at least one token");
  check_arg(n_head % n_head_kv == 0, "attention_decode_split: n_head must be a multiple of n_head_kv");
  const int S = attention_splits(max_ctx);
  check_arg(S <= kAttnMaxSplits, "attention_decode_split: a context this long needs more chunks than the merge holds");
  const int chunk = attention_chunk(max_ctx, S);  // the kernel's largest chunk
  const size_t smem = (static_cast<size_t>(head_dim) + chunk) * sizeof(float);
  with_kv_types(kv, [&](auto tk, auto tv) {
    using TK = decltype(tk);
    using TV = decltype(tv);
    launch_pdl("attention_decode_split", attn_split_kernel<TK, TV>, dim3(n_head, S, tokens.n), dim3(256), smem, s, q,
               q_head_stride, static_cast<const TK*>(k_cache), static_cast<const TV*>(v_cache), kv_stride,
               n_head / n_head_kv, head_dim, scale, gate, pos, window, rows, scratch, counters, out, tokens);
  });
}

}  // namespace strata::cuda
