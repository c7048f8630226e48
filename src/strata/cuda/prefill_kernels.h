// CUDA kernels of the batched prefill (GpuPrefill, prefill.h): every one works on a chunk of n
// consecutive tokens at positions pos0 .. pos0+n-1, rows stored row-major [n x width]. Each mirrors the
// per-token decode kernel of kernels.h (and so the CPU engine's blocks) with the same float
// expressions, except where a batched form reorders a sum (GEMMs, the attention's online softmax, the
// DeltaNet column reductions): those agree with the per-token path to float rounding of the sums.
// Plain C++17 header (no CUDA language features): included by prefill.cpp and the prefill_*.cu files.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/kernels.h"

namespace strata::cuda::prefill {

// ---- weights ---------------------------------------------------------------------------------------
// Rows [row0, row0 + n_rows) of the plain matrix w decoded to float / half, row-major [n_rows x n_cols].
// n_cols must be a multiple of 32 for the quantised types.
void dequant_rows_f32(const DevMatrix& w, int64_t row0, int64_t n_rows, float* out, cudaStream_t s);
void dequant_rows_f16(const DevMatrix& w, int64_t row0, int64_t n_rows, __half* out, cudaStream_t s);
// out[i] = half(x[i]).
void to_half(const float* x, int64_t n, __half* out, cudaStream_t s);

// x[t] = row tokens[t] (device memory) of the table, decoded to float, for t < n.
void embed_rows(const DevMatrix& table, const int* tokens, int n, float* x, cudaStream_t s);

// ---- attention ---------------------------------------------------------------------------------------
// For token t < n and head h < n_heads: the head vector at src + t * src_tok_stride + h * src_head_stride
// (head_dim long) gets RMSNorm with w, then NEOX rotary on its first rope_dims dims at position pos0 + t
// (YaRN-scaled when yarn is set and on, as attn_prep), and is written to dst + row * dst_tok_stride +
// h * dst_head_stride as dst_type (f32 or f16 elements: a KV cache's keys); row = t (dst may equal src:
// in place), or with dst_rows > 0 the cache row of position pos0 + t in a cache of dst_rows rows (a
// sliding layer's ring: p % dst_rows; dst is then the cache's first row).
void norm_rope_rows(const float* src, int64_t src_tok_stride, int src_head_stride, void* dst, int64_t dst_tok_stride,
                    int dst_head_stride, int n, int n_heads, int head_dim, const float* w, float eps, int rope_dims,
                    float freq_base, const RopeYarn* yarn, int pos0, cudaStream_t s, KvType dst_type = KvType::F32,
                    int dst_rows = 0);

// The value rows of a chunk into a KV cache of `rows` rows: the row of position pos0 + t (p % rows in a
// sliding layer's ring) = src row t ([n x width] floats), rounded to the cache's type.
void store_cache_rows(const float* src, int n, int64_t width, void* cache, KvType type, int rows, int pos0,
                      cudaStream_t s);

// Causal GQA attention of a chunk: query t (position P = pos0 + t) of head h, at q + t * q_tok_stride +
// h * q_head_stride, against positions 0 .. P (window > 0: only P - window + 1 .. P, a sliding layer) of
// KV head h / (n_head / n_head_kv): position p's key at k_cache + row(p) * kv_stride + g * head_dim,
// values alike, row(p) = p, or p % rows when rows > 0 (a sliding layer's ring); the chunk's own keys
// already stored there, and every position a query sees still held (a ring of at least the window +
// n - 1 rows). out[t * n_head * head_dim + h * head_dim + d] = softmax(q.k * scale) . v, times sigmoid of
// the gate value q[head_dim + d] when gated. head_dim a multiple of 4, <= kGpuPrefillMaxHeadDim
// (moe/gpu_support.h: longer heads run through the decode step). The caches hold kv's types (f32 or f16).
void attention_prefill(const float* q, int64_t q_tok_stride, int q_head_stride, const void* k_cache,
                       const void* v_cache, int64_t kv_stride, int n, int n_head, int n_head_kv, int head_dim,
                       float scale, bool gated, int pos0, float* out, cudaStream_t s, KvCacheTypes kv = {},
                       int window = 0, int rows = 0);

// ---- gated DeltaNet ------------------------------------------------------------------------------------
// Causal depthwise conv + SiLU over a chunk: out[t][c] = silu(w[c][K-1] x[t][c] + sum_{j<K-1} w[c][j] in(t-K+1+j)[c])
// with in(tau) = x[tau] for tau >= 0, else state row K-1+tau (oldest first). Then the state keeps the
// chunk's last K-1 inputs. x, out: [n x channels].
// windows (optional): the state after each token, [n x (K-1) x channels] (speculative verification keeps
// any prefix of the chunk by copying one of them back).
void conv1d_silu_chunk(const float* x, const float* weight, int K, int channels, int n, float* state, float* out,
                       cudaStream_t s, float* windows = nullptr);

// L2-normalise (eps 1e-6) each q and k head of every token row of mixed ([n x row_stride], q heads at 0,
// k heads at n_k_heads * dk), then scale q by q_scale. In place.
void deltanet_qk_norm_rows(float* mixed, int64_t row_stride, int n, int n_k_heads, int dk, float q_scale,
                           cudaStream_t s);

// The gated delta rule over a chunk for every value head h (state S [n_v x dk x dv], updated in place):
// per token t, beta = sigmoid(b[t][h]), g = a[h] * softplus(alpha[t][h] + dt_bias[h]),
// S = exp(g) S; S += k (beta (v - S^T k))^T; o[t][h*dv + j] = (S^T q)_j (raw, before the gated norm).
// q/k of key head h % n_k_heads at mixed row t (q at 0, k at n_k*dk, v at 2*n_k*dk). dk <= 256.
// An exact sequential scan over the tokens (inputs staged through shared memory).
// steps (optional): the state after each token, [n x n_v x dk x dv] (as conv1d_silu_chunk's windows).
void deltanet_scan(float* S, const float* mixed, int64_t mixed_stride, const float* b, const float* alpha,
                   const float* a, const float* dt_bias, int n, int n_k_heads, int n_v_heads, int dk, int dv,
                   float* o, cudaStream_t s, float* steps = nullptr);

// The same rule in its chunkwise-parallel form (prefill_deltanet_chunked.cu): 32-token chunks whose
// inputs-only parts (the UT transform) run for every chunk at once, then one pass per head over the
// chunks with the state. Same contract as deltanet_scan (dk, dv <= 256); scratch: at least
// deltanet_chunked_scratch_floats(n, n_v_heads, dk, dv) floats of device memory. Takes the shapes
// deltanet_chunked_supported accepts (dk a multiple of 4, 16-byte aligned mixed rows); fails on others.
int64_t deltanet_chunked_scratch_floats(int n, int n_v_heads, int dk, int dv);
bool deltanet_chunked_supported(int dk, int dv, int64_t mixed_stride);
void deltanet_scan_chunked(float* S, const float* mixed, int64_t mixed_stride, const float* b, const float* alpha,
                           const float* a, const float* dt_bias, int n, int n_k_heads, int n_v_heads, int dk, int dv,
                           float* o, float* scratch, cudaStream_t s);

// o[t][h*dv + j] = rmsnorm(o[t][h*dv ..])[j] * norm_w[j] * silu(z[t][h*dv + j]), in place, for all t, h.
void gated_rmsnorm_rows(float* o, const float* z, const float* norm_w, float eps, int n, int n_v_heads, int dv,
                        cudaStream_t s);

// ---- mixture of experts ------------------------------------------------------------------------------------
// Router for n tokens: per row of logits [n x n_expert], warp_route's rule (route_warp.cuh, the
// decode's): softmax or rule's sigmoid, top-k (ties: lower id), weights renormalised when norm_topk,
// times rule.scale: ids/weights [n x k] in pick order.
void route_topk_rows(const float* logits, int n, int n_expert, int k, bool norm_topk, const RouteRule& rule, int* ids,
                     float* weights, cudaStream_t s);

// Token groups of the grouped expert GEMM, built on the device by a counting sort of the n*k (token,
// slot) pairs by expert id. Sorted row r (0 .. n*k) holds the pair src_pair[r] = t * k + j; pair_row[t*k+j]
// = its sorted row. Tiles of at most tile_m consecutive sorted rows of one expert: tile_expert[i],
// tile_row0[i], tile_rows[i], for i < *n_tiles (<= max_tiles(n*k, n_expert, tile_m)).
struct ExpertGroups {
  int* counts = nullptr;      // [n_expert]
  int* cursor = nullptr;      // [n_expert]
  int* src_pair = nullptr;    // [n*k]
  int* pair_row = nullptr;    // [n*k]
  int* tile_expert = nullptr; // [max_tiles]
  int* tile_row0 = nullptr;
  int* tile_rows = nullptr;
  int* n_tiles = nullptr;     // [1]
};
// slot_of (device [n_expert], optional; hybrid hot/cold experts): tiles only for experts with
// slot_of[e] >= 0, tile_expert = that slot (the expert's row block in a hot-only stack); the rows of the
// other experts' pairs are still laid out (counts, src_pair, pair_row cover every pair) but no tile
// computes them.
int max_tiles(int n_pairs, int n_expert, int tile_m);
void group_by_expert(const int* ids, int n_pairs, int k, int n_expert, int tile_m, const ExpertGroups& g,
                     cudaStream_t s, const int* slot_of = nullptr);

// More tiles over g's sorted rows (after group_by_expert): tiles.tile_* / n_tiles get the experts e with
// slot_of[e] in [0, limit) and exclude[e] < 0 (exclude may be null), named by that slot; tiles' other
// arrays are g's. The streamed experts of a hybrid prefill (hybrid_stream.h): slot_of their place in
// the stream buffer, exclude the layer's resident slot map.
void plan_tiles(const ExpertGroups& g, int n_expert, int tile_m, const int* slot_of, const int* exclude, int limit,
                const ExpertGroups& tiles, cudaStream_t s);

// dst[i] += counts[i] for i < n (routing statistics per expert).
void add_counts(const int* counts, int n, unsigned long long* dst, cudaStream_t s);

// For i < n_rows: ye[pair_row[pairs[i]] * d ..] = src[i * d ..] (d floats): rows computed elsewhere
// (the CPU's cold experts) placed at their pairs' sorted rows.
void scatter_rows(const float* src, const int* pairs, const int* pair_row, int n_rows, int d, float* ye,
                  cudaStream_t s);

// Grouped expert GEMM over the tiles of g: for sorted row r of tile i (expert e = tile_expert[i]),
// y[r * N + c] = dot(W_e row c, x row in(r)) with in(r) = src_pair[r] / k when gather (the token of the
// pair: the FFN input xn), else r (rows already in sorted order). N = stack.n_rows, x rows n_cols long.
// fp32 FMA (PrefillMath::Exact). grid_tiles is the launch bound (max_tiles); tiles beyond *n_tiles exit
// at once.
constexpr int kGroupTileM = 32;
void grouped_gemm(const DevMatrix& stack, const float* x, bool gather, int k, const ExpertGroups& g, int grid_tiles,
                  float* y, cudaStream_t s);

// The fast form (PrefillMath::Fast): inputs already in half, weights rounded to half in shared memory,
// 128 outputs per block, tensor-core products with fp32 accumulation.
void grouped_gemm_h(const DevMatrix& stack, const __half* x, bool gather, int k, const ExpertGroups& g,
                    int grid_tiles, float* y, cudaStream_t s);

// out[i] = half(silu(gate[i]) * up[i]) (the input of the fast down projection).
void swiglu_rows_h(const float* gate, const float* up, int64_t n, __half* out, cudaStream_t s);

// out[i] = silu(gate[i]) * up[i].
void swiglu_rows(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s);

// x[t][j] += sum over token t's k slots in ascending expert id of weights[t*k+s] * ye[pair_row[t*k+s]][j]
//            (+ sigmoid(shared_gate[t]) * ys[t][j] when ys is not null; 1 * ys[t][j] when shared_gate is
//            null: an ungated shared expert).
void moe_combine_rows(float* x, const float* ye, const int* ids, const float* weights, const int* pair_row, int n,
                      int k, int d, const float* ys, const float* shared_gate, cudaStream_t s);

}  // namespace strata::cuda::prefill
