// CUDA kernels of the decode step (see kernels.h for each one's contract). First version: correct and
// graph-capturable, one simple kernel per operation; fusion and bandwidth tuning come later.
#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/kernels.h"
#include "strata/cuda/quant_decode.cuh"

namespace strata::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

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
__device__ double block_sum_d(double v) {
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

__device__ float block_max(float v) {
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

__device__ __forceinline__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_dev(float x) { return x / (1.0f + expf(-x)); }

int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

// ---- matvec ---------------------------------------------------------------------------------------
// One warp per row; float types read element-strided (coalesced), quantised types one 32-weight chunk
// per lane.
template <GgmlType T>
__global__ void matvec_kernel(const uint8_t* w, size_t row_bytes, size_t expert_stride, int64_t n_rows,
                              int64_t n_cols, const int* ids, const float* x, int64_t x_slot_stride, float* y) {
  const int slot = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= n_rows) return;
  const size_t expert = ids ? static_cast<size_t>(ids[slot]) : 0;
  const uint8_t* r = w + expert * expert_stride + static_cast<size_t>(row) * row_bytes;
  const float* xs = x + slot * x_slot_stride;
  float acc = 0.0f;
  if constexpr (is_float_type<T>()) {
    for (int64_t i = lane; i < n_cols; i += 32) acc += float_elem<T>(r, i) * xs[i];
  } else {
    const int64_t n_chunks = n_cols / 32;
    float wv[32];
    for (int64_t c = lane; c < n_chunks; c += 32) {
      decode_chunk<T>(r, c, wv);
      const float* xc = xs + c * 32;
#pragma unroll
      for (int l = 0; l < 32; ++l) acc += wv[l] * xc[l];
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) y[slot * n_rows + row] = acc;
}

template <GgmlType T>
void launch_matvec_t(const DevMatrix& w, const int* ids, int n_slots, const float* x, int64_t x_slot_stride, float* y,
                     cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((w.n_rows + kWarpsPerBlock - 1) / kWarpsPerBlock), static_cast<unsigned>(n_slots));
  matvec_kernel<T><<<grid, kWarpsPerBlock * 32, 0, s>>>(w.data, w.row_bytes, w.expert_stride, w.n_rows, w.n_cols, ids,
                                                         x, x_slot_stride, y);
  check_launch("matvec");
}

void launch_matvec(const DevMatrix& w, const int* ids, int n_slots, const float* x, int64_t x_slot_stride, float* y,
                   cudaStream_t s) {
  switch (w.type) {
    case GgmlType::F32: return launch_matvec_t<GgmlType::F32>(w, ids, n_slots, x, x_slot_stride, y, s);
    case GgmlType::F16: return launch_matvec_t<GgmlType::F16>(w, ids, n_slots, x, x_slot_stride, y, s);
    case GgmlType::BF16: return launch_matvec_t<GgmlType::BF16>(w, ids, n_slots, x, x_slot_stride, y, s);
    case GgmlType::Q8_0: return launch_matvec_t<GgmlType::Q8_0>(w, ids, n_slots, x, x_slot_stride, y, s);
    case GgmlType::Q4_K: return launch_matvec_t<GgmlType::Q4_K>(w, ids, n_slots, x, x_slot_stride, y, s);
    case GgmlType::Q5_K: return launch_matvec_t<GgmlType::Q5_K>(w, ids, n_slots, x, x_slot_stride, y, s);
    case GgmlType::Q6_K: return launch_matvec_t<GgmlType::Q6_K>(w, ids, n_slots, x, x_slot_stride, y, s);
    default: fail_unsupported_type("matvec", w.type);
  }
}

// ---- embedding row --------------------------------------------------------------------------------
template <GgmlType T>
__global__ void embed_kernel(const uint8_t* table, size_t row_bytes, int64_t n_cols, const int* token, float* x) {
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
  embed_kernel<T><<<blocks_for(t.n_cols, 256), 256, 0, s>>>(t.data, t.row_bytes, t.n_cols, token, x);
  check_launch("embed_row");
}

// ---- norms, rotary, attention ---------------------------------------------------------------------
__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int d, float* out) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * d;
  float* o = out + static_cast<int64_t>(blockIdx.x) * d;
  double ss = 0.0;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  ss = block_sum_d(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

// One block per head; head_dim <= 1024 (the block has head_dim rounded up to a warp multiple threads).
__global__ void norm_rope_kernel(const float* src, int src_head_stride, float* dst, int dst_head_stride,
                                 int64_t dst_pos_stride, int head_dim, const float* w, float eps, int rope_dims,
                                 float freq_base, const int* pos_ptr) {
  extern __shared__ float buf[];  // head_dim
  const int h = blockIdx.x;
  const int i = threadIdx.x;
  const int64_t pos = *pos_ptr;
  const float* x = src + static_cast<int64_t>(h) * src_head_stride;
  const float xi = i < head_dim ? x[i] : 0.0f;
  const double ss = block_sum_d(static_cast<double>(xi) * xi);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(head_dim) + eps));
  if (i < head_dim) buf[i] = xi * inv * w[i];
  __syncthreads();
  float* o = dst + pos * dst_pos_stride + static_cast<int64_t>(h) * dst_head_stride;
  const int half = rope_dims / 2;
  if (i < half) {
    // As rope_neox_inplace: inverse frequency in double rounded to float, angle rounded to float,
    // cos/sin in double.
    const float inv_freq = static_cast<float>(pow(static_cast<double>(freq_base), -2.0 * i / rope_dims));
    const double angle = static_cast<float>(static_cast<float>(pos) * inv_freq);
    const float c = static_cast<float>(cos(angle));
    const float sn = static_cast<float>(sin(angle));
    const float a = buf[i], b = buf[i + half];
    o[i] = a * c - b * sn;
    o[i + half] = b * c + a * sn;
  } else if (i >= rope_dims && i < head_dim) {
    o[i] = buf[i];
  }
}

__global__ void store_row_kernel(const float* src, float* dst, int64_t n, const int* pos) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[static_cast<int64_t>(*pos) * n + i] = src[i];
}

// One block per query head: scores for every cached position into the scratch row, softmax, then
// one thread per output dim sums over positions. (Split-K over the cache is the next step for long
// contexts.)
__global__ void attention_decode_kernel(const float* q, int q_head_stride, const float* k_cache, const float* v_cache,
                                        int64_t kv_stride, int group, int head_dim, float scale, bool gated,
                                        const int* pos_ptr, int max_ctx, float* scores, float* out) {
  extern __shared__ float sq[];  // head_dim
  const int h = blockIdx.x;
  const int g = h / group;
  const int n_ctx = *pos_ptr + 1;
  const float* qh = q + static_cast<int64_t>(h) * q_head_stride;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) sq[d] = qh[d];
  __syncthreads();
  float* sc = scores + static_cast<int64_t>(h) * max_ctx;
  float mx = -INFINITY;
  for (int p = threadIdx.x; p < n_ctx; p += blockDim.x) {
    const float* k = k_cache + static_cast<int64_t>(p) * kv_stride + static_cast<int64_t>(g) * head_dim;
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot += sq[d] * k[d];
    dot *= scale;
    sc[p] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = block_max(mx);
  double sum = 0.0;
  for (int p = threadIdx.x; p < n_ctx; p += blockDim.x) {
    const float e = expf(sc[p] - mx);
    sc[p] = e;
    sum += e;
  }
  sum = block_sum_d(sum);
  const float inv = static_cast<float>(1.0 / sum);
  for (int p = threadIdx.x; p < n_ctx; p += blockDim.x) sc[p] *= inv;
  __syncthreads();
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    const float* v = v_cache + static_cast<int64_t>(g) * head_dim + d;
    float acc = 0.0f;
    for (int p = 0; p < n_ctx; ++p) acc += sc[p] * v[static_cast<int64_t>(p) * kv_stride];
    if (gated) acc *= sigmoid_dev(qh[head_dim + d]);
    out[static_cast<int64_t>(h) * head_dim + d] = acc;
  }
}

// ---- gated DeltaNet --------------------------------------------------------------------------------
__global__ void conv1d_silu_kernel(const float* x, const float* weight, int K, int channels, float* state, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const float* w = weight + static_cast<int64_t>(c) * K;
  float acc = w[K - 1] * x[c];
  for (int j = 0; j < K - 1; ++j) acc += w[j] * state[static_cast<int64_t>(j) * channels + c];
  out[c] = silu_dev(acc);
  if (K > 1) {
    for (int j = 0; j < K - 2; ++j)
      state[static_cast<int64_t>(j) * channels + c] = state[static_cast<int64_t>(j + 1) * channels + c];
    state[static_cast<int64_t>(K - 2) * channels + c] = x[c];
  }
}

// Block per head, blockIdx.y: 0 = q, 1 = k.
__global__ void qk_l2norm_kernel(float* mixed, int n_k_heads, int dk, float q_scale) {
  const int h = blockIdx.x;
  const bool is_q = blockIdx.y == 0;
  float* x = mixed + (is_q ? 0 : static_cast<int64_t>(n_k_heads) * dk) + static_cast<int64_t>(h) * dk;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
  ss = block_sum_d(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss + 1e-6f));
  for (int i = threadIdx.x; i < dk; i += blockDim.x) {
    float v = x[i] * inv;
    if (is_q) v *= q_scale;
    x[i] = v;
  }
}

// Block per value head, one thread per value dim j (blockDim.x = dv rounded up to 32).
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
  const float xa = alpha[h] + dt_bias[h];
  const float sp = xa > 20.0f ? xa : log1pf(expf(xa));
  const float g = a[h] * sp;
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
// One block of 1024 threads at most; the probabilities live in shared memory.
__global__ void route_kernel(const float* logits, int n_expert, int k, bool norm_topk, int* ids, float* weights) {
  __shared__ float p[1024];
  __shared__ float best_val[32];
  __shared__ int best_idx[32];
  __shared__ int chosen[64];
  const int t = threadIdx.x;
  float mx = -INFINITY;
  for (int i = t; i < n_expert; i += blockDim.x) {
    p[i] = logits[i];
    mx = fmaxf(mx, p[i]);
  }
  mx = block_max(mx);
  double sum = 0.0;
  for (int i = t; i < n_expert; i += blockDim.x) {
    p[i] = expf(p[i] - mx);
    sum += p[i];
  }
  sum = block_sum_d(sum);
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = t; i < n_expert; i += blockDim.x) p[i] *= inv;
  __syncthreads();
  // Top-k by repeated arg-max (ties: lower index), as cpu top_k.
  for (int r = 0; r < k; ++r) {
    float bv = -INFINITY;
    int bi = -1;
    for (int i = t; i < n_expert; i += blockDim.x) {
      bool used = false;
      for (int q = 0; q < r; ++q) used |= chosen[q] == i;
      if (used) continue;
      if (bi < 0 || p[i] > bv) {
        bv = p[i];
        bi = i;
      }
    }
    // Warp then block reduction of (value, index), preferring larger value then lower index.
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if ((t & 31) == 0) {
      best_val[t >> 5] = bv;
      best_idx[t >> 5] = bi;
    }
    __syncthreads();
    if (t == 0) {
      float v0 = best_val[0];
      int i0 = best_idx[0];
      for (int w = 1; w < static_cast<int>((blockDim.x + 31) >> 5); ++w) {
        const float ov = best_val[w];
        const int oi = best_idx[w];
        if (oi >= 0 && (i0 < 0 || ov > v0 || (ov == v0 && oi < i0))) {
          v0 = ov;
          i0 = oi;
        }
      }
      chosen[r] = i0;
    }
    __syncthreads();
  }
  if (t == 0) {
    double s = 0.0;
    for (int j = 0; j < k; ++j) s += p[chosen[j]];
    for (int j = 0; j < k; ++j) {
      ids[j] = chosen[j];
      weights[j] = norm_topk ? static_cast<float>(p[chosen[j]] / s) : p[chosen[j]];
    }
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = silu_dev(g[i]) * u[i];
}

__global__ void moe_combine_kernel(float* x, const float* ye, const int* ids, const float* weights, int k, int d,
                                   const float* ys, const float* shared_gate) {
  __shared__ int order[64];
  if (threadIdx.x == 0) {
    // Slots in ascending expert id (the CPU engine sums experts in that order).
    for (int s = 0; s < k; ++s) order[s] = s;
    for (int a = 1; a < k; ++a)
      for (int b = a; b > 0 && ids[order[b]] < ids[order[b - 1]]; --b) {
        const int tmp = order[b];
        order[b] = order[b - 1];
        order[b - 1] = tmp;
      }
  }
  __syncthreads();
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0.0f;
  for (int s = 0; s < k; ++s) acc += weights[order[s]] * ye[static_cast<int64_t>(order[s]) * d + j];
  if (ys) acc += sigmoid_dev(*shared_gate) * ys[j];
  x[j] += acc;
}

__global__ void argmax_kernel(const float* x, int64_t n, int* out) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  float bv = -INFINITY;
  int64_t bi = -1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    if (bi < 0 || x[i] > bv) {
      bv = x[i];
      bi = i;
    }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
      bv = ov;
      bi = oi;
    }
  }
  if ((threadIdx.x & 31) == 0) {
    sv[threadIdx.x >> 5] = bv;
    si[threadIdx.x >> 5] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
      if (si[w] >= 0 && (bi < 0 || sv[w] > bv || (sv[w] == bv && si[w] < bi))) {
        bv = sv[w];
        bi = si[w];
      }
    *out = static_cast<int>(bi < 0 ? 0 : bi);
  }
}

int warp_round(int n) { return ((n + 31) / 32) * 32; }

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

void matvec(const DevMatrix& w, const float* x, float* y, cudaStream_t s) { launch_matvec(w, nullptr, 1, x, 0, y, s); }

void matvec_routed(const DevMatrix& stack, const int* ids, int n_slots, const float* x, int64_t x_slot_stride,
                   float* y, cudaStream_t s) {
  launch_matvec(stack, ids, n_slots, x, x_slot_stride, y, s);
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
  rmsnorm_kernel<<<n_rows, 256, 0, s>>>(x, w, eps, d, out);
  check_launch("rmsnorm_rows");
}

void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, y, n);
  check_launch("add_inplace");
}

void norm_rope_heads(const float* src, int src_head_stride, float* dst, int dst_head_stride, int64_t dst_pos_stride,
                     int n_heads, int head_dim, const float* w, float eps, int rope_dims, float freq_base,
                     const int* pos, cudaStream_t s) {
  check_arg(head_dim <= 1024 && rope_dims <= head_dim && rope_dims % 2 == 0, "norm_rope_heads: head_dim/rope_dims");
  norm_rope_kernel<<<n_heads, warp_round(head_dim), head_dim * sizeof(float), s>>>(
      src, src_head_stride, dst, dst_head_stride, dst_pos_stride, head_dim, w, eps, rope_dims, freq_base, pos);
  check_launch("norm_rope_heads");
}

void store_row_at_pos(const float* src, float* dst, int64_t n, const int* pos, cudaStream_t s) {
  store_row_kernel<<<blocks_for(n, 256), 256, 0, s>>>(src, dst, n, pos);
  check_launch("store_row_at_pos");
}

void attention_decode(const float* q, int q_head_stride, const float* k_cache, const float* v_cache, int64_t kv_stride,
                      int n_head, int n_head_kv, int head_dim, float scale, bool gated, const int* pos, int max_ctx,
                      float* scores, float* out, cudaStream_t s) {
  check_arg(n_head % n_head_kv == 0, "attention_decode: n_head must be a multiple of n_head_kv");
  attention_decode_kernel<<<n_head, 256, head_dim * sizeof(float), s>>>(q, q_head_stride, k_cache, v_cache, kv_stride,
                                                                         n_head / n_head_kv, head_dim, scale, gated,
                                                                         pos, max_ctx, scores, out);
  check_launch("attention_decode");
}

void conv1d_silu_step(const float* x, const float* weight, int K, int channels, float* state, float* out,
                      cudaStream_t s) {
  conv1d_silu_kernel<<<blocks_for(channels, 256), 256, 0, s>>>(x, weight, K, channels, state, out);
  check_launch("conv1d_silu_step");
}

void deltanet_qk_norm(float* mixed, int n_k_heads, int dk, float q_scale, cudaStream_t s) {
  qk_l2norm_kernel<<<dim3(n_k_heads, 2), 128, 0, s>>>(mixed, n_k_heads, dk, q_scale);
  check_launch("deltanet_qk_norm");
}

void deltanet_step_gated(float* S, const float* mixed, const float* b, const float* alpha, const float* a,
                         const float* dt_bias, const float* norm_w, const float* z, float eps, int n_k_heads,
                         int n_v_heads, int dk, int dv, float* out, cudaStream_t s) {
  check_arg(dv <= 1024, "deltanet_step_gated: value head dim > 1024");
  deltanet_step_kernel<<<n_v_heads, warp_round(dv), 2 * dk * sizeof(float), s>>>(S, mixed, b, alpha, a, dt_bias,
                                                                                   norm_w, z, eps, n_k_heads, dk, dv,
                                                                                   out);
  check_launch("deltanet_step_gated");
}

void route_topk(const float* logits, int n_expert, int k, bool norm_topk, int* ids, float* weights, cudaStream_t s) {
  check_arg(n_expert <= 1024 && k <= 64 && k <= n_expert, "route_topk: n_expert <= 1024 and k <= 64");
  route_kernel<<<1, 256, 0, s>>>(logits, n_expert, k, norm_topk, ids, weights);
  check_launch("route_topk");
}

void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
  swiglu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, n, out);
  check_launch("swiglu");
}

void moe_combine_add(float* x, const float* ye, const int* ids, const float* weights, int k, int d, const float* ys,
                     const float* shared_gate, cudaStream_t s) {
  check_arg(k <= 64, "moe_combine_add: k <= 64");
  moe_combine_kernel<<<blocks_for(d, 256), 256, 0, s>>>(x, ye, ids, weights, k, d, ys, shared_gate);
  check_launch("moe_combine_add");
}

void argmax(const float* x, int64_t n, int* out, cudaStream_t s) {
  argmax_kernel<<<1, 1024, 0, s>>>(x, n, out);
  check_launch("argmax");
}

}  // namespace strata::cuda
