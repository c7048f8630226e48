// Row-wise prefill kernels (prefill_kernels.h): weight decoding to float/half scratch, embedding rows,
// q/k norm + rotary, the DeltaNet conv window and norms, routing, SwiGLU and the MoE combine. Each is
// the batched twin of a decode kernel of kernels.cu, with the same float expressions per element.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/kv_cache.cuh"
#include "strata/cuda/prefill_common.cuh"
#include "strata/cuda/prefill_kernels.h"
#include "strata/cuda/quant_decode.cuh"
#include "strata/cuda/route_warp.cuh"
#include "strata/moe/gpu_support.h"

namespace strata::cuda::prefill {
namespace {

// ---- weight decoding --------------------------------------------------------------------------------
__device__ __forceinline__ void store32(float* dst, const float* v) {
  float4* d4 = reinterpret_cast<float4*>(dst);
#pragma unroll
  for (int i = 0; i < 8; ++i) d4[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}
__device__ __forceinline__ void store32(__half* dst, const float* v) {
  __half2* d2 = reinterpret_cast<__half2*>(dst);
#pragma unroll
  for (int i = 0; i < 16; ++i) d2[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
}
__device__ __forceinline__ void store1(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void store1(__half* dst, float v) { *dst = __float2half_rn(v); }

// One thread per 32-weight chunk (quantised types) or per element (float types).
template <GgmlType T, class Out>
__global__ void dequant_kernel(const uint8_t* w, size_t row_bytes, int64_t row0, int64_t n_rows, int64_t n_cols,
                               Out* out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (is_float_type<T>()) {
    if (idx >= n_rows * n_cols) return;
    const int64_t r = idx / n_cols, c = idx % n_cols;
    store1(out + idx, float_elem<T>(w + static_cast<size_t>(row0 + r) * row_bytes, c));
  } else {
    const int64_t chunks = n_cols / 32;
    if (idx >= n_rows * chunks) return;
    const int64_t r = idx / chunks, c = idx % chunks;
    float v[32];
    decode_chunk<T>(w + static_cast<size_t>(row0 + r) * row_bytes, c, v);
    store32(out + r * n_cols + c * 32, v);
  }
}

template <class Out>
void launch_dequant(const DevMatrix& w, int64_t row0, int64_t n_rows, Out* out, cudaStream_t s) {
  const bool is_float = w.type == GgmlType::F32 || w.type == GgmlType::F16 || w.type == GgmlType::BF16;
  check_arg(is_float || w.n_cols % 32 == 0, "prefill dequant: quantised rows must be a multiple of 32 long");
  const int64_t work = is_float ? n_rows * w.n_cols : n_rows * (w.n_cols / 32);
  const int grid = blocks_for(work, 256);
  const size_t rb = w.row_bytes;
  switch (w.type) {
    case GgmlType::F32: dequant_kernel<GgmlType::F32><<<grid, 256, 0, s>>>(w.data, rb, row0, n_rows, w.n_cols, out); break;
    case GgmlType::F16: dequant_kernel<GgmlType::F16><<<grid, 256, 0, s>>>(w.data, rb, row0, n_rows, w.n_cols, out); break;
    case GgmlType::BF16: dequant_kernel<GgmlType::BF16><<<grid, 256, 0, s>>>(w.data, rb, row0, n_rows, w.n_cols, out); break;
    case GgmlType::Q8_0: dequant_kernel<GgmlType::Q8_0><<<grid, 256, 0, s>>>(w.data, rb, row0, n_rows, w.n_cols, out); break;
    case GgmlType::Q4_K: dequant_kernel<GgmlType::Q4_K><<<grid, 256, 0, s>>>(w.data, rb, row0, n_rows, w.n_cols, out); break;
    case GgmlType::Q5_K: dequant_kernel<GgmlType::Q5_K><<<grid, 256, 0, s>>>(w.data, rb, row0, n_rows, w.n_cols, out); break;
    case GgmlType::Q6_K: dequant_kernel<GgmlType::Q6_K><<<grid, 256, 0, s>>>(w.data, rb, row0, n_rows, w.n_cols, out); break;
    default: fail_unsupported_type("prefill dequant", w.type);
  }
  check_launch("prefill dequant");
}

__global__ void to_half_kernel(const float* x, int64_t n, __half* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

// ---- embedding ----------------------------------------------------------------------------------------
template <GgmlType T>
__global__ void embed_rows_kernel(const uint8_t* table, size_t row_bytes, int64_t n_cols, const int* tokens, float* x) {
  const int t = blockIdx.y;
  const uint8_t* r = table + static_cast<size_t>(tokens[t]) * row_bytes;
  float* xr = x + static_cast<int64_t>(t) * n_cols;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (is_float_type<T>()) {
    if (i < n_cols) xr[i] = float_elem<T>(r, i);
  } else {
    if (i >= n_cols / 32) return;
    float wv[32];
    decode_chunk<T>(r, i, wv);
#pragma unroll
    for (int l = 0; l < 32; ++l) xr[i * 32 + l] = wv[l];
  }
}

template <GgmlType T>
void launch_embed(const DevMatrix& t, const int* tokens, int n, float* x, cudaStream_t s) {
  const int64_t work = is_float_type<T>() ? t.n_cols : t.n_cols / 32;
  embed_rows_kernel<T><<<dim3(blocks_for(work, 128), n), 128, 0, s>>>(t.data, t.row_bytes, t.n_cols, tokens, x);
  check_launch("prefill embed_rows");
}

// ---- q/k norm + rotary (as attn_prep_kernel of kernels.cu, one block per (head, token)) ---------------
template <typename T>
__global__ void norm_rope_rows_kernel(const float* src, int64_t src_tok_stride, int src_head_stride, T* dst,
                                      int64_t dst_tok_stride, int dst_head_stride, int head_dim, const float* w,
                                      float eps, int rope_dims, float freq_base, YarnDev yarn, int pos0, int dst_rows) {
  extern __shared__ float buf[];  // head_dim
  const int h = blockIdx.x, t = blockIdx.y;
  const int64_t pos = pos0 + t;
  const int64_t row = dst_rows > 0 ? ring_row(static_cast<int>(pos), dst_rows) : t;
  const float* x = src + t * src_tok_stride + static_cast<int64_t>(h) * src_head_stride;
  T* o = dst + row * dst_tok_stride + static_cast<int64_t>(h) * dst_head_stride;
  norm_rope_head(x, o, pos, head_dim, w, eps, rope_dims, freq_base, yarn, buf);
}

// Cache row ring_row(pos0 + t, rows) = src row t, in the cache's element type.
template <typename T>
__global__ void store_rows_kernel(const float* src, int64_t width, T* cache, int rows, int pos0) {
  const int t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= width) return;
  kv_store(cache + ring_row(pos0 + t, rows) * width + i, src[t * width + i]);
}

// ---- DeltaNet conv window and norms -----------------------------------------------------------------
__global__ void conv_chunk_kernel(const float* x, const float* weight, int K, int channels, const float* state,
                                  float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  if (c >= channels) return;
  const float* w = weight + static_cast<int64_t>(c) * K;
  float acc = w[K - 1] * x[static_cast<int64_t>(t) * channels + c];
  for (int j = 0; j < K - 1; ++j) {
    const int tau = t - (K - 1) + j;
    const float in = tau >= 0 ? x[static_cast<int64_t>(tau) * channels + c]
                              : state[static_cast<int64_t>(K - 1 + tau) * channels + c];
    acc += w[j] * in;
  }
  out[static_cast<int64_t>(t) * channels + c] = silu_dev(acc);
}

constexpr int kMaxConvK = 16;
static_assert(kMaxConvK == kGpuPrefillMaxConvK, "gpu_prefill_unsupported_feature checks the conv length");

// After the chunk: state row j = in(n - (K-1) + j). Reads every old value before writing (one thread per
// channel owns its column).
__global__ void conv_state_kernel(const float* x, int K, int channels, int n, float* state) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float nw[kMaxConvK];
  for (int j = 0; j < K - 1; ++j) {
    const int tau = n - (K - 1) + j;
    nw[j] = tau >= 0 ? x[static_cast<int64_t>(tau) * channels + c] : state[static_cast<int64_t>(K - 1 + tau) * channels + c];
  }
  for (int j = 0; j < K - 1; ++j) state[static_cast<int64_t>(j) * channels + c] = nw[j];
}

// windows[t] = the state after token t (row j = in(t + 1 - (K-1) + j)), read before the state is updated.
__global__ void conv_windows_kernel(const float* x, int K, int channels, const float* state, float* windows) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int t = blockIdx.y;
  if (c >= channels) return;
  float* w = windows + static_cast<int64_t>(t) * (K - 1) * channels;
  for (int j = 0; j < K - 1; ++j) {
    const int tau = t + 1 - (K - 1) + j;
    w[static_cast<int64_t>(j) * channels + c] =
        tau >= 0 ? x[static_cast<int64_t>(tau) * channels + c] : state[static_cast<int64_t>(K - 1 + tau) * channels + c];
  }
}

// Block per (head, q|k, token), as qk_l2norm_kernel of kernels.cu.
__global__ void qk_norm_rows_kernel(float* mixed, int64_t row_stride, int n_k_heads, int dk, float q_scale) {
  const int h = blockIdx.x;
  const bool is_q = blockIdx.y == 0;
  float* x = mixed + static_cast<int64_t>(blockIdx.z) * row_stride + (is_q ? 0 : static_cast<int64_t>(n_k_heads) * dk) +
             static_cast<int64_t>(h) * dk;
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

// Block per (value head, token), one thread per value dim (as the tail of deltanet_step_kernel).
__global__ void gated_rmsnorm_kernel(float* o_all, const float* z_all, const float* norm_w, float eps, int n_v_heads,
                                     int dv) {
  const int h = blockIdx.x, t = blockIdx.y, j = threadIdx.x;
  const int64_t base = (static_cast<int64_t>(t) * n_v_heads + h) * dv;
  const float o = j < dv ? o_all[base + j] : 0.0f;
  const double ss = block_sum_d(static_cast<double>(o) * o);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dv) + eps));
  if (j < dv) {
    float r = o * inv * norm_w[j];
    r *= silu_dev(z_all[base + j]);
    o_all[base + j] = r;
  }
}

// ---- routing: one warp per token (route_warp.cuh: the routine every GPU routing path shares) ----------
constexpr int kRouteWarps = 4;  // tokens per block
__global__ void route_rows_kernel(const float* logits_all, int n, int n_expert, int k, bool norm_topk, RouteRule rule,
                                  int* ids_all, float* weights_all) {
  __shared__ float p[kRouteWarps][1024];
  __shared__ int chosen[kRouteWarps][64];
  __shared__ float chosen_p[kRouteWarps][64];
  const int w = threadIdx.x >> 5;
  const int64_t tok = static_cast<int64_t>(blockIdx.x) * kRouteWarps + w;
  if (tok >= n) return;  // warp-uniform
  RouteRule r = rule;
  if (r.replay) r.replay += tok * r.replay_stride;
  warp_route(logits_all + tok * n_expert, n_expert, k, chosen[w], chosen_p[w], p[w], &r);
  warp_route_store(chosen[w], chosen_p[w], k, norm_topk, ids_all + tok * k, weights_all + tok * k, nullptr, rule.scale);
}

__global__ void swiglu_rows_kernel(const float* g, const float* u, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = silu_dev(g[i]) * u[i];
}

__global__ void swiglu_rows_h_kernel(const float* g, const float* u, int64_t n, __half* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(silu_dev(g[i]) * u[i]);
}

// As moe_combine_kernel of kernels.cu, one row of blocks per token; expert rows found through pair_row.
__global__ void combine_rows_kernel(float* x_all, const float* ye, const int* ids_all, const float* weights_all,
                                    const int* pair_row_all, int k, int d, const float* ys_all,
                                    const float* shared_gate) {
  __shared__ int order[64];
  const int t = blockIdx.y;
  const int* ids = ids_all + static_cast<int64_t>(t) * k;
  const float* weights = weights_all + static_cast<int64_t>(t) * k;
  const int* pair_row = pair_row_all + static_cast<int64_t>(t) * k;
  if (threadIdx.x == 0) {
    slots_in_ascending_id(ids, k, order);
  }
  __syncthreads();
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= d) return;
  float acc = 0.0f;
  for (int s = 0; s < k; ++s) acc += weights[order[s]] * ye[static_cast<int64_t>(pair_row[order[s]]) * d + j];
  if (ys_all) acc += (shared_gate ? sigmoid_dev(shared_gate[t]) : 1.0f) * ys_all[static_cast<int64_t>(t) * d + j];
  x_all[static_cast<int64_t>(t) * d + j] += acc;
}

}  // namespace

void dequant_rows_f32(const DevMatrix& w, int64_t row0, int64_t n_rows, float* out, cudaStream_t s) {
  launch_dequant(w, row0, n_rows, out, s);
}
void dequant_rows_f16(const DevMatrix& w, int64_t row0, int64_t n_rows, __half* out, cudaStream_t s) {
  launch_dequant(w, row0, n_rows, out, s);
}

void to_half(const float* x, int64_t n, __half* out, cudaStream_t s) {
  to_half_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, n, out);
  check_launch("prefill to_half");
}

void embed_rows(const DevMatrix& t, const int* tokens, int n, float* x, cudaStream_t s) {
  switch (t.type) {
    case GgmlType::F32: return launch_embed<GgmlType::F32>(t, tokens, n, x, s);
    case GgmlType::F16: return launch_embed<GgmlType::F16>(t, tokens, n, x, s);
    case GgmlType::BF16: return launch_embed<GgmlType::BF16>(t, tokens, n, x, s);
    case GgmlType::Q8_0: return launch_embed<GgmlType::Q8_0>(t, tokens, n, x, s);
    case GgmlType::Q4_K: return launch_embed<GgmlType::Q4_K>(t, tokens, n, x, s);
    case GgmlType::Q5_K: return launch_embed<GgmlType::Q5_K>(t, tokens, n, x, s);
    case GgmlType::Q6_K: return launch_embed<GgmlType::Q6_K>(t, tokens, n, x, s);
    default: fail_unsupported_type("prefill embed_rows", t.type);
  }
}

void norm_rope_rows(const float* src, int64_t src_tok_stride, int src_head_stride, void* dst, int64_t dst_tok_stride,
                    int dst_head_stride, int n, int n_heads, int head_dim, const float* w, float eps, int rope_dims,
                    float freq_base, const RopeYarn* yarn, int pos0, cudaStream_t s, KvType dst_type, int dst_rows) {
  check_arg(head_dim <= 1024 && rope_dims <= head_dim && rope_dims % 2 == 0, "prefill norm_rope_rows: head_dim/rope_dims");
  const YarnDev y = yarn_dev(yarn, rope_dims, freq_base);
  // The destination's type chooses the instance (the V type is not involved).
  with_kv_types({dst_type, KvType::F32}, [&](auto td, auto) {
    using T = decltype(td);
    norm_rope_rows_kernel<T><<<dim3(n_heads, n), warp_round(head_dim), head_dim * sizeof(float), s>>>(
        src, src_tok_stride, src_head_stride, static_cast<T*>(dst), dst_tok_stride, dst_head_stride, head_dim, w, eps,
        rope_dims, freq_base, y, pos0, dst_rows);
  });
  check_launch("prefill norm_rope_rows");
}

void store_cache_rows(const float* src, int n, int64_t width, void* cache, KvType type, int rows, int pos0,
                      cudaStream_t s) {
  check_arg(rows > 0, "prefill store_cache_rows: the cache needs rows");
  with_kv_types({type, KvType::F32}, [&](auto td, auto) {
    using T = decltype(td);
    store_rows_kernel<T><<<dim3(blocks_for(width, 256), n), 256, 0, s>>>(src, width, static_cast<T*>(cache), rows, pos0);
  });
  check_launch("prefill store_cache_rows");
}

void conv1d_silu_chunk(const float* x, const float* weight, int K, int channels, int n, float* state, float* out,
                       cudaStream_t s, float* windows) {
  check_arg(K >= 1 && K <= kMaxConvK, "prefill conv1d_silu_chunk: conv kernel length must be 1..16");
  conv_chunk_kernel<<<dim3(blocks_for(channels, 256), n), 256, 0, s>>>(x, weight, K, channels, state, out);
  check_launch("prefill conv1d_silu_chunk");
  if (K > 1 && windows) {
    conv_windows_kernel<<<dim3(blocks_for(channels, 256), n), 256, 0, s>>>(x, K, channels, state, windows);
    check_launch("prefill conv windows");
  }
  if (K > 1) {
    conv_state_kernel<<<blocks_for(channels, 256), 256, 0, s>>>(x, K, channels, n, state);
    check_launch("prefill conv state");
  }
}

void deltanet_qk_norm_rows(float* mixed, int64_t row_stride, int n, int n_k_heads, int dk, float q_scale,
                           cudaStream_t s) {
  qk_norm_rows_kernel<<<dim3(n_k_heads, 2, n), 128, 0, s>>>(mixed, row_stride, n_k_heads, dk, q_scale);
  check_launch("prefill deltanet_qk_norm_rows");
}

void gated_rmsnorm_rows(float* o, const float* z, const float* norm_w, float eps, int n, int n_v_heads, int dv,
                        cudaStream_t s) {
  check_arg(dv <= 1024, "prefill gated_rmsnorm_rows: value head dim > 1024");
  gated_rmsnorm_kernel<<<dim3(n_v_heads, n), warp_round(dv), 0, s>>>(o, z, norm_w, eps, n_v_heads, dv);
  check_launch("prefill gated_rmsnorm_rows");
}

void route_topk_rows(const float* logits, int n, int n_expert, int k, bool norm_topk, const RouteRule& rule, int* ids,
                     float* weights, cudaStream_t s) {
  check_arg(n_expert <= 1024 && k <= 64 && k <= n_expert, "prefill route_topk_rows: n_expert <= 1024 and k <= 64");
  route_rows_kernel<<<(n + kRouteWarps - 1) / kRouteWarps, 32 * kRouteWarps, 0, s>>>(logits, n, n_expert, k, norm_topk,
                                                                                   rule, ids, weights);
  check_launch("prefill route_topk_rows");
}

void swiglu_rows(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
  swiglu_rows_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, n, out);
  check_launch("prefill swiglu_rows");
}

void swiglu_rows_h(const float* gate, const float* up, int64_t n, __half* out, cudaStream_t s) {
  swiglu_rows_h_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, n, out);
  check_launch("prefill swiglu_rows_h");
}

void moe_combine_rows(float* x, const float* ye, const int* ids, const float* weights, const int* pair_row, int n,
                      int k, int d, const float* ys, const float* shared_gate, cudaStream_t s) {
  check_arg(k <= 64, "prefill moe_combine_rows: k <= 64");
  combine_rows_kernel<<<dim3(blocks_for(d, 256), n), 256, 0, s>>>(x, ye, ids, weights, pair_row, k, d, ys, shared_gate);
  check_launch("prefill moe_combine_rows");
}

}  // namespace strata::cuda::prefill
