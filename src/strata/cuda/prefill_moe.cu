// Routed experts of the prefill (prefill_kernels.h): the (token, slot) pairs are grouped by expert on the
// device with a counting sort (count, scan, scatter), cut into tiles of at most kGroupTileM rows of one
// expert, and one grouped GEMM launch computes every tile: each block decodes a TN x KS tile of its
// expert's weight rows from the stored blocks into shared memory and multiplies the tile's gathered input
// rows against it, so an expert's weights are read once per tile of its tokens and no host round trip or
// per-expert launch is needed.
// Two arithmetic modes: exact (grouped_gemm: fp32 FMA, each thread a 4 x 4 block of outputs) and fast
// (grouped_gemm_h: inputs already in half, weights rounded to half in shared memory, WMMA 16x16x16
// tensor-core products accumulated in fp32).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/prefill_common.cuh"
#include "strata/cuda/prefill_kernels.h"
#include "strata/cuda/prefill_decode.cuh"
#include "strata/cuda/quant_decode.cuh"

namespace strata::cuda::prefill {
namespace {

// ---- grouping ------------------------------------------------------------------------------------------
__global__ void count_kernel(const int* ids, int n_pairs, int* counts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n_pairs) atomicAdd(&counts[ids[i]], 1);
}

constexpr int kMaxExperts = 2048;

// One block: exclusive scans of the counts (rows) and of the tiles per expert, then every expert writes
// its own tiles. The scans run on thread 0 over shared memory (a few hundred additions). With a slot
// map (hybrid hot/cold experts) only resident experts get tiles, named by their slot in the hot stack;
// the rows of the others are still laid out (their outputs come from the CPU). The streamed tiles
// (plan_tiles) take an expert only when exclude[e] < 0 and its slot is below limit; cursor is null then.
__global__ void plan_kernel(const int* counts, int n_expert, int tile_m, const int* slot_of, const int* exclude,
                            int limit, int* cursor, int* tile_expert, int* tile_row0, int* tile_rows, int* n_tiles) {
  __shared__ int cnt[kMaxExperts];
  __shared__ int row_start[kMaxExperts];
  __shared__ int tile_start[kMaxExperts];
  __shared__ int slot[kMaxExperts];
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
    cnt[e] = counts[e];
    int sl = slot_of ? slot_of[e] : e;
    if ((exclude && exclude[e] >= 0) || (limit >= 0 && sl >= limit)) sl = -1;
    slot[e] = sl;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int rows = 0, tiles = 0;
    for (int e = 0; e < n_expert; ++e) {
      row_start[e] = rows;
      tile_start[e] = tiles;
      rows += cnt[e];
      if (slot[e] >= 0) tiles += (cnt[e] + tile_m - 1) / tile_m;
    }
    *n_tiles = tiles;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
    if (cursor) cursor[e] = row_start[e];
    if (slot[e] < 0) continue;
    int ti = tile_start[e];
    for (int r0 = 0; r0 < cnt[e]; r0 += tile_m, ++ti) {
      tile_expert[ti] = slot[e];
      tile_row0[ti] = row_start[e] + r0;
      tile_rows[ti] = min(tile_m, cnt[e] - r0);
    }
  }
}

// dst[e] += counts[e] (routing statistics).
__global__ void add_counts_kernel(const int* counts, int n, unsigned long long* dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += static_cast<unsigned long long>(counts[i]);
}

// ye row pair_row[pairs[i]] = src row i (the CPU's cold expert outputs into the sorted rows).
__global__ void scatter_rows_kernel(const float* src, const int* pairs, const int* pair_row, int d, float* ye) {
  const int i = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  ye[static_cast<int64_t>(pair_row[pairs[i]]) * d + c] = src[static_cast<int64_t>(i) * d + c];
}

__global__ void scatter_kernel(const int* ids, int n_pairs, int* cursor, int* src_pair, int* pair_row) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_pairs) return;
  const int pos = atomicAdd(&cursor[ids[i]], 1);
  src_pair[pos] = i;
  pair_row[i] = pos;
}

// ---- grouped GEMM --------------------------------------------------------------------------------------
constexpr int TM = kGroupTileM;  // rows (tokens) per tile
constexpr int TN = 64;           // weight rows (outputs) per block
constexpr int KS = 64;           // columns per shared-memory step (two 32-weight chunks)
constexpr int kThreads = 128;

// Decodes 32 weights (chunk c of weight row `row`) into v; zeros past the matrix.
template <GgmlType T>
__device__ __forceinline__ void load_weight_chunk(const uint8_t* w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                                                  int64_t row, int64_t c, float* v) {
  if (row >= n_rows || c * 32 >= n_cols) {
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = 0.0f;
    return;
  }
  const uint8_t* r = w + static_cast<size_t>(row) * row_bytes;
  if constexpr (is_float_type<T>()) {
#pragma unroll
    for (int l = 0; l < 32; ++l) v[l] = float_elem<T>(r, c * 32 + l);
  } else {
    decode_chunk<T>(r, c, v);
  }
}

template <GgmlType T>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(
    const uint8_t* w_all, size_t row_bytes, size_t expert_stride, int64_t N, int64_t K, const float* x, bool gather,
    int k_slots, const int* src_pair, const int* tile_expert, const int* tile_row0, const int* tile_rows,
    const int* n_tiles, float* y) {
  const int tile = blockIdx.y;
  if (tile >= *n_tiles) return;
  const int e = tile_expert[tile];
  const int row0 = tile_row0[tile];
  const int rows = tile_rows[tile];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * TN;
  const uint8_t* w = w_all + static_cast<size_t>(e) * expert_stride;
  const int tid = threadIdx.x;

  // Input rows of this thread's share of the X tile: 4 rows x 4 floats per k-step (row xr + 8 i, cols xc..xc+3).
  const int xr = tid / 16, xc = (tid % 16) * 4;
  const float* xrow[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = xr + 8 * i;
    if (r < rows) {
      const int sr = row0 + r;
      const int64_t src = gather ? src_pair[sr] / k_slots : sr;
      xrow[i] = x + src * K;
    } else {
      xrow[i] = nullptr;
    }
  }
  // Weight chunk of this thread per k-step: row wr (of the TN), chunk wc (of the 2).
  const int wr = tid / 2, wc = tid % 2;

  constexpr int LDF = KS + 1;
  __shared__ float xs[TM * LDF];
  __shared__ float ws[TN * LDF];
  const int rg = tid % 16, tg = tid / 16;  // outputs: weight rows rg + 16 i, tile rows tg + 8 j
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += KS) {
    float v[32];
    load_weight_chunk<T>(w, row_bytes, N, K, n0 + wr, k0 / 32 + wc, v);
#pragma unroll
    for (int l = 0; l < 32; ++l) ws[wr * LDF + wc * 32 + l] = v[l];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (xrow[i] && k0 + xc < K) xv = *reinterpret_cast<const float4*>(xrow[i] + k0 + xc);
      float* xd = xs + (xr + 8 * i) * LDF + xc;
      xd[0] = xv.x;
      xd[1] = xv.y;
      xd[2] = xv.z;
      xd[3] = xv.w;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < KS; ++kk) {
      float wv[4], xv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) wv[i] = ws[(rg + 16 * i) * LDF + kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) xv[j] = xs[(tg + 8 * j) * LDF + kk];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += wv[i] * xv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int r = tg + 8 * j;
    if (r >= rows) continue;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t c = n0 + rg + 16 * i;
      if (c < N) y[static_cast<int64_t>(row0 + r) * N + c] = acc[i][j];
    }
  }
}

template <GgmlType T>
void launch_grouped(const DevMatrix& m, const float* x, bool gather, int k, const ExpertGroups& g, int grid_tiles,
                    float* y, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((m.n_rows + TN - 1) / TN), static_cast<unsigned>(grid_tiles));
  grouped_gemm_kernel<T><<<grid, kThreads, 0, s>>>(m.data, m.row_bytes, m.expert_stride, m.n_rows, m.n_cols, x, gather,
                                                   k, g.src_pair, g.tile_expert, g.tile_row0, g.tile_rows, g.n_tiles,
                                                   y);
  check_launch("grouped_gemm");
}

// ---- fast grouped GEMM with half inputs ----------------------------------------------------------------
// The tensor-core form used by PrefillMath::Fast: inputs arrive in half (converted once per layer, or
// written in half by the SwiGLU), 128 weight rows per block (so each gathered input tile is read by a
// quarter as many blocks as with 64), 8 warps each owning a 16 x 32 piece of the 32 x 128 output tile.
// The next k-step's input vector and weight bytes are loaded into registers before the current step's
// products, so their latency overlaps the tensor-core work.
constexpr int TN2 = 128;
constexpr int kThreads2 = 256;

template <GgmlType T>
__global__ void __launch_bounds__(kThreads2) grouped_gemm_h_kernel(
    const uint8_t* w_all, size_t row_bytes, size_t expert_stride, int64_t N, int64_t K, const __half* x, bool gather,
    int k_slots, const int* src_pair, const int* tile_expert, const int* tile_row0, const int* tile_rows,
    const int* n_tiles, float* y) {
  using namespace nvcuda;
  constexpr int LDH = KS + 8;
  constexpr int LDC = TN2 + 4;
  __shared__ __align__(32) __half xs[TM * LDH];
  __shared__ __align__(32) __half ws[TN2 * LDH];
  __shared__ __align__(32) float cs[TM * LDC];
  const int tile = blockIdx.y;
  if (tile >= *n_tiles) return;
  const int e = tile_expert[tile];
  const int row0 = tile_row0[tile];
  const int rows = tile_rows[tile];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * TN2;
  const uint8_t* w = w_all + static_cast<size_t>(e) * expert_stride;
  const int tid = threadIdx.x;

  // This thread's input piece per k-step: row xr, 8 halves from column xc.
  const int xr = tid / 8, xc = (tid % 8) * 8;
  const __half* xrow = nullptr;
  if (xr < rows) {
    const int sr = row0 + xr;
    const int64_t src = gather ? src_pair[sr] / k_slots : sr;
    xrow = x + src * K;
  }
  // This thread's weight chunk per k-step: row wr of the block's 128, chunk wc of the step's 2.
  const int wr = tid / 2, wc = tid % 2;
  const int64_t wrow = n0 + wr;
  const uint8_t* wptr = w + static_cast<size_t>(wrow < N ? wrow : 0) * row_bytes;

  const int warp = tid / 32;
  const int fm = warp & 1;         // 16-row block of the tile
  const int fn = (warp >> 1) * 2;  // first of two 16-column blocks
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2];
  wmma::fill_fragment(acc[0], 0.0f);
  wmma::fill_fragment(acc[1], 0.0f);

  RawChunk<T> wn;
  uint4 xn = make_uint4(0u, 0u, 0u, 0u);
  auto load = [&](int64_t k0) {
    const int64_t c = k0 / 32 + wc;
    wn.load(wptr, c, wrow < N && c * 32 < K);
    xn = (xrow && k0 + xc < K) ? *reinterpret_cast<const uint4*>(xrow + k0 + xc) : make_uint4(0u, 0u, 0u, 0u);
  };
  load(0);
  for (int64_t k0 = 0; k0 < K; k0 += KS) {
    {
      float v[32];
      wn.decode(v);
      // 32 halves as four 16-byte stores (row offsets are multiples of 16 bytes: LDH * 2 = 144).
      uint4* wd = reinterpret_cast<uint4*>(ws + wr * LDH + wc * 32);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        unsigned u[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const __half2 h2 = __floats2half2_rn(v[8 * i + 2 * j], v[8 * i + 2 * j + 1]);
          u[j] = *reinterpret_cast<const unsigned*>(&h2);
        }
        wd[i] = make_uint4(u[0], u[1], u[2], u[3]);
      }
      *reinterpret_cast<uint4*>(xs + xr * LDH + xc) = xn;
    }
    __syncthreads();
    if (k0 + KS < K) load(k0 + KS);
#pragma unroll
    for (int kk = 0; kk < KS; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
      wmma::load_matrix_sync(fa, xs + fm * 16 * LDH + kk, LDH);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, ws + (fn + b) * 16 * LDH + kk, LDH);
        wmma::mma_sync(acc[b], fa, fb, acc[b]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int b = 0; b < 2; ++b)
    wmma::store_matrix_sync(cs + fm * 16 * LDC + (fn + b) * 16, acc[b], LDC, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < TM * TN2; idx += kThreads2) {
    const int r = idx / TN2, c = idx % TN2;
    if (r < rows && n0 + c < N) y[static_cast<int64_t>(row0 + r) * N + n0 + c] = cs[r * LDC + c];
  }
}

template <GgmlType T>
void launch_grouped_h(const DevMatrix& m, const __half* x, bool gather, int k, const ExpertGroups& g, int grid_tiles,
                      float* y, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((m.n_rows + TN2 - 1) / TN2), static_cast<unsigned>(grid_tiles));
  grouped_gemm_h_kernel<T><<<grid, kThreads2, 0, s>>>(m.data, m.row_bytes, m.expert_stride, m.n_rows, m.n_cols, x,
                                                      gather, k, g.src_pair, g.tile_expert, g.tile_row0, g.tile_rows,
                                                      g.n_tiles, y);
  check_launch("grouped_gemm_h");
}

}  // namespace

int max_tiles(int n_pairs, int n_expert, int tile_m) {
  // Each expert's last tile may be partial: at most one extra tile per expert that has any pair.
  return (n_pairs + tile_m - 1) / tile_m + (n_expert < n_pairs ? n_expert : n_pairs);
}

void group_by_expert(const int* ids, int n_pairs, int k, int n_expert, int tile_m, const ExpertGroups& g,
                     cudaStream_t s, const int* slot_of) {
  (void)k;
  check_arg(n_expert <= kMaxExperts, "group_by_expert: more than 2048 experts");
  check_cuda(cudaMemsetAsync(g.counts, 0, sizeof(int) * static_cast<size_t>(n_expert), s), "group_by_expert memset");
  count_kernel<<<blocks_for(n_pairs, 256), 256, 0, s>>>(ids, n_pairs, g.counts);
  check_launch("group_by_expert count");
  plan_kernel<<<1, 256, 0, s>>>(g.counts, n_expert, tile_m, slot_of, nullptr, -1, g.cursor, g.tile_expert, g.tile_row0,
                                g.tile_rows, g.n_tiles);
  check_launch("group_by_expert plan");
  scatter_kernel<<<blocks_for(n_pairs, 256), 256, 0, s>>>(ids, n_pairs, g.cursor, g.src_pair, g.pair_row);
  check_launch("group_by_expert scatter");
}

void plan_tiles(const ExpertGroups& g, int n_expert, int tile_m, const int* slot_of, const int* exclude, int limit,
                const ExpertGroups& tiles, cudaStream_t s) {
  check_arg(n_expert <= kMaxExperts, "plan_tiles: more than 2048 experts");
  plan_kernel<<<1, 256, 0, s>>>(g.counts, n_expert, tile_m, slot_of, exclude, limit, nullptr, tiles.tile_expert,
                                tiles.tile_row0, tiles.tile_rows, tiles.n_tiles);
  check_launch("plan_tiles");
}

void add_counts(const int* counts, int n, unsigned long long* dst, cudaStream_t s) {
  if (n <= 0) return;
  add_counts_kernel<<<blocks_for(n, 256), 256, 0, s>>>(counts, n, dst);
  check_launch("add_counts");
}

void scatter_rows(const float* src, const int* pairs, const int* pair_row, int n_rows, int d, float* ye,
                  cudaStream_t s) {
  if (n_rows <= 0) return;
  scatter_rows_kernel<<<dim3(blocks_for(d, 256), n_rows), 256, 0, s>>>(src, pairs, pair_row, d, ye);
  check_launch("scatter_rows");
}

void grouped_gemm(const DevMatrix& stack, const float* x, bool gather, int k, const ExpertGroups& g, int grid_tiles,
                  float* y, cudaStream_t s) {
  check_arg(stack.n_cols % 32 == 0, "grouped_gemm: expert rows must be a multiple of 32 long");
  if (grid_tiles <= 0) return;
  switch (stack.type) {
    case GgmlType::F32: return launch_grouped<GgmlType::F32>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::F16: return launch_grouped<GgmlType::F16>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::BF16: return launch_grouped<GgmlType::BF16>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q8_0: return launch_grouped<GgmlType::Q8_0>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q4_K: return launch_grouped<GgmlType::Q4_K>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q5_K: return launch_grouped<GgmlType::Q5_K>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q6_K: return launch_grouped<GgmlType::Q6_K>(stack, x, gather, k, g, grid_tiles, y, s);
    default: fail_unsupported_type("grouped_gemm", stack.type);
  }
}

void grouped_gemm_h(const DevMatrix& stack, const __half* x, bool gather, int k, const ExpertGroups& g,
                    int grid_tiles, float* y, cudaStream_t s) {
  check_arg(stack.n_cols % 32 == 0, "grouped_gemm_h: expert rows must be a multiple of 32 long");
  if (grid_tiles <= 0) return;
  switch (stack.type) {
    case GgmlType::F32: return launch_grouped_h<GgmlType::F32>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::F16: return launch_grouped_h<GgmlType::F16>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::BF16: return launch_grouped_h<GgmlType::BF16>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q8_0: return launch_grouped_h<GgmlType::Q8_0>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q4_K: return launch_grouped_h<GgmlType::Q4_K>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q5_K: return launch_grouped_h<GgmlType::Q5_K>(stack, x, gather, k, g, grid_tiles, y, s);
    case GgmlType::Q6_K: return launch_grouped_h<GgmlType::Q6_K>(stack, x, gather, k, g, grid_tiles, y, s);
    default: fail_unsupported_type("grouped_gemm_h", stack.type);
  }
}

}  // namespace strata::cuda::prefill
