// Block-level pieces of the decode matvec (gemv_batch, matvec_kernels.cu: one launch of up to
// kMaxGemvJobs jobs): the staging of the input, routing, the tile loop and the epilogues. The row space of a launch's jobs is cut into
// tiles (256 threads / G rows) and the grid loops over the tiles. Each row is handled by a group of G
// threads (a power of two, 1..256; above 32 the row spans several warps that meet in shared memory),
// chosen so that every thread takes about units_per_thread units of its row, read by small rolled loops
// (matvec_rows.cuh) that stay in the instruction cache. Values other blocks of the same launch may have
// written (the residual stream, router logits, expert outputs, ids) are read through L2 (__ldcg).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/decode_combine.cuh"
#include "strata/cuda/device_math.cuh"
#include "strata/cuda/matvec_kernels.h"
#include "strata/cuda/matvec_rows.cuh"
#include "strata/cuda/route_warp.cuh"

namespace strata::cuda::mv {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCols = 16384;

// Resident blocks per SM the register budget is sized for: 3 = 80 registers per thread, no spills (at 4,
// 64 registers, the int8 path spills and decodes slower; docs/PERF.md has the comparisons).
constexpr int kMinBlocksPerSm = 3;


struct DJob {
  const uint8_t* w;
  const uint8_t* w2;
  const float* x;
  float* y;
  const int* ids;
  const int* slot_of_expert;
  size_t row_bytes;
  size_t row_bytes2;
  size_t expert_stride;
  size_t expert_stride2;
  int n_rows;
  int n_cols;
  GgmlType type;
  GgmlType type2;
  GemvMode mode;
  int slot;
  int g_log2;     // threads per row = 1 << g_log2 (1..256)
  int tile_rows;  // rows per tile = kThreads / G
  int tile_begin;
  const float* norm_w;  // GemvJob::norm_w
  float norm_eps;
  const float* conv_w;  // GemvJob::conv_*
  const float* conv_state;
  float* conv_out;  // conv_state itself, or the other buffer of a ping-pong pair
  int conv_k;
  int conv_channels;
  int64_t x_ts, y_ts, ids_ts;  // GemvJob's token strides (token-grid launches only)
};

// The token of this block in a token-grid launch (blockIdx.y); 0, a constant, in a single-token launch,
// so that instantiation compiles to the single-token code.
template <bool Tokens>
__device__ __forceinline__ int block_token() {
  if constexpr (Tokens) return static_cast<int>(blockIdx.y);
  return 0;
}

// Softmax + top-k (route_warp.cuh) by warp 0 of the block (the caller's threads 0..31; no block barrier).
// The k picks end in chosen[] (shared memory); with write_out the warp also writes ids / weights /
// counts. (A rank count by the whole block, n_expert^2 comparisons, made the routed launches
// issue-bound: every block of the expert launch routes for itself.) Inlined: as a called function, its
// call inside the tile loop made ptxas keep kernel registers on the stack (local memory, spill loads in
// the row loops) and the decode slower (docs/PERF.md); warp_route itself stays a call.
// Tokens: a token grid's block routes its own token's logits (and replayed picks) into that token's ids /
// weights.
template <bool Tokens = false>
static __device__ __forceinline__ void route_warp0(const GemvRoute& r, int* chosen, bool write_out) {
  __shared__ float p[1024];
  __shared__ float chosen_p[64];
  const int tok = block_token<Tokens>();
  warp_route(r.logits + tok * r.logits_token_stride, r.n_expert, r.k, chosen, chosen_p, p, &r.rule, tok);
  if (write_out)
    warp_route_store(chosen, chosen_p, r.k, r.norm_topk, r.ids + tok * r.k, r.weights + tok * r.k, r.counts,
                     r.rule.scale);
}

// route_warp0 while the other warps wait; chosen[] is visible to every thread on return.
template <bool Tokens = false>
static __device__ void route_block(const GemvRoute& r, int* chosen, bool write_out) {
  if (threadIdx.x < 32) route_warp0<Tokens>(r, chosen, write_out);
  __syncthreads();
}

static __device__ __noinline__ void route_epilogue(const GemvRoute& r) {
  if (!last_block_of(r.counter)) return;
  __shared__ int chosen[64];
  route_block(r, chosen, true);
}

static __device__ __noinline__ void combine_epilogue(const GemvCombine& c) {
  if (!last_block_of(c.counter)) return;
  moe_combine_norm_block(c.x, c.ye, c.ids, c.weights, c.k, c.d, c.ys, c.shared_gate, c.norm_w, c.eps, c.xn);
}

// The epilogue norm, run by the last block to finish. Reads through L2 (__ldcg): other blocks wrote x.
static __device__ __noinline__ void norm_epilogue(const GemvNorm& nm) {
  if (!last_block_of(nm.counter)) return;
  double ss = 0.0;
  for (int i = threadIdx.x; i < nm.n; i += blockDim.x) {
    const float v = __ldcg(nm.x + i);
    ss += static_cast<double>(v) * v;
  }
  ss = block_sum_d(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(nm.n) + nm.eps));
  for (int i = threadIdx.x; i < nm.n; i += blockDim.x) nm.out[i] = __ldcg(nm.x + i) * inv * nm.w[i];
}

// The conv1d + SiLU step of channel c whose newest input is v (conv1d_silu_kernel's arithmetic);
// writes that channel's advanced window to conv_out (which may be conv_state: each row is read before
// it is written).
static __device__ __noinline__ float conv_silu_channel(const DJob& J, int c, float v) {
  const int K = J.conv_k, ch = J.conv_channels;
  const float* w = J.conv_w + static_cast<int64_t>(c) * K;
  const float* st = J.conv_state;
  float* out = J.conv_out;
  float acc = w[K - 1] * v;
  for (int j = 0; j < K - 1; ++j) acc += w[j] * st[static_cast<int64_t>(j) * ch + c];
  if (K > 1) {
    for (int j = 0; j < K - 2; ++j) out[static_cast<int64_t>(j) * ch + c] = st[static_cast<int64_t>(j + 1) * ch + c];
    out[static_cast<int64_t>(K - 2) * ch + c] = v;
  }
  return silu_dev(acc);
}

// A group of the block's threads that stages the input: thread t of nt (threads first .. first + nt - 1,
// whole warps), meeting at hardware barrier `bar` (0: the whole block, __syncthreads). The routed
// launches stage with warps 1.. while warp 0 routes (run_tiles).
struct Group {
  int t, nt, bar;
};
__device__ __forceinline__ Group whole_block() {
  return Group{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), 0};
}
__device__ __forceinline__ void group_sync(const Group& g) {
  if (g.bar == 0) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(g.bar), "r"(g.nt) : "memory");
  }
}
// The group's sum in double: warp sums, then the warps' sums in warp order (block_sum_d's arithmetic for
// the whole block).
__device__ __forceinline__ double group_sum_d(double v, const Group& g) {
  __shared__ double part[32];
  v = warp_sum_d(v);
  group_sync(g);  // part[] may still be read by a previous call
  if ((g.t & 31) == 0) part[g.t >> 5] = v;
  group_sync(g);
  double s = 0.0;
  for (int i = 0; i < g.nt >> 5; ++i) s += part[i];
  return s;
}

// Copies x (n floats) into the padded shared layout and computes the 16-element sums. With norm_w, the
// staged vector is rmsnorm(x) * norm_w (norm_epilogue's arithmetic). Every block staging with the whole
// block computes the same sum; the 224-thread group of a routed launch sums in another grouping (equal
// to rounding), and a given launch shape on a given GPU always stages each tile the same way.
// The common case (16-byte aligned, n <= 4 * H * nt: the 2048-float residual stream) holds x and norm_w
// in registers, every load issued before the first use: a loop that loads, scales and stores one
// element at a time waits about one L2 round trip per step. H = 2 for the whole block; 3 for the
// 224-thread group (4 would spill registers).
template <int H>
static __device__ void stage_x(const float* x, int n, float* xs, float* s16, const float* norm_w, float eps, bool sums,
                               const Group& g) {
  const int bd = g.nt, t = g.t;
  const bool aligned = (n % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0) &&
                       (!norm_w || (reinterpret_cast<uintptr_t>(norm_w) & 15) == 0);
  if (aligned && n / 4 <= H * bd) {  // block-uniform
    const int n4 = n / 4;
    float4 xv[H], wv[H];
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const int q = t + i * bd;
      xv[i] = q < n4 ? __ldcg(reinterpret_cast<const float4*>(x) + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      wv[i] = norm_w && q < n4 ? __ldg(reinterpret_cast<const float4*>(norm_w) + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (norm_w) {
      double ss = 0.0;
#pragma unroll
      for (int i = 0; i < H; ++i)
        ss += static_cast<double>(xv[i].x) * xv[i].x + static_cast<double>(xv[i].y) * xv[i].y +
              static_cast<double>(xv[i].z) * xv[i].z + static_cast<double>(xv[i].w) * xv[i].w;
      ss = group_sum_d(ss, g);
      const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
#pragma unroll
      for (int i = 0; i < H; ++i) {
        xv[i].x = xv[i].x * inv * wv[i].x;
        xv[i].y = xv[i].y * inv * wv[i].y;
        xv[i].z = xv[i].z * inv * wv[i].z;
        xv[i].w = xv[i].w * inv * wv[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const int q = t + i * bd;
      if (q < n4) *reinterpret_cast<float4*>(xs + rows::xpad(4 * q)) = xv[i];
    }
  } else if (aligned) {  // longer rows: float4 steps
    const int n4 = n / 4;
    double ss = 0.0;
    for (int q = t; q < n4; q += bd) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(x) + q);
      *reinterpret_cast<float4*>(xs + rows::xpad(4 * q)) = v;
      if (norm_w)
        ss += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y + static_cast<double>(v.z) * v.z +
              static_cast<double>(v.w) * v.w;
    }
    if (norm_w) {  // block-uniform
      ss = group_sum_d(ss, g);  // synchronises: every element is staged
      const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
      for (int q = t; q < n4; q += bd) {
        float4& v = *reinterpret_cast<float4*>(xs + rows::xpad(4 * q));
        const float4 w = __ldg(reinterpret_cast<const float4*>(norm_w) + q);
        v.x = v.x * inv * w.x;
        v.y = v.y * inv * w.y;
        v.z = v.z * inv * w.z;
        v.w = v.w * inv * w.w;
      }
    }
  } else {  // any n and alignment: one element per step
    double ss = 0.0;
    for (int i = t; i < n; i += bd) {
      const float v = __ldcg(x + i);
      xs[rows::xpad(i)] = v;
      if (norm_w) ss += static_cast<double>(v) * v;
    }
    if (norm_w) {  // block-uniform
      ss = group_sum_d(ss, g);  // synchronises: every element is staged
      const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
      for (int i = t; i < n; i += bd) {
        float& v = xs[rows::xpad(i)];
        v = v * inv * norm_w[i];
      }
    }
  }
  if (!sums) return;  // the caller synchronises before xs is read
  group_sync(g);
  for (int c = t; c < n / 16; c += bd) {
    const float* p = xs + rows::xpad(16 * c);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) s += p[i];
    s16[c] = s;
  }
}

// The end of a tile row: the G lanes of a row add their partial sums (across warps through red[] /
// red2[] when G > 32, in warp order), and lane 0 stores the row by the job's mode.
// y: the job's output (J.y, or its token's rows in a token-grid launch). y_old: y[row] read earlier by
// the caller (Accumulate), or null to read it here.
__device__ __forceinline__ void finish_row(const DJob& J, float* y, int row, bool live, int sub, int G, bool skip,
                                           float a, float a2, float* red, float* red2, const float* y_old = nullptr) {
  for (int o = (G < 32 ? G : 32) >> 1; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    a2 += __shfl_xor_sync(0xffffffffu, a2, o);
  }
  if (G > 32) {  // block-uniform: the G/32 warps of a row add their sums in warp order
    const int warp = threadIdx.x >> 5;
    __syncthreads();  // the previous tile's readers of red[] are done
    if ((threadIdx.x & 31) == 0) {
      red[warp] = a;
      red2[warp] = a2;
    }
    __syncthreads();
    if (sub == 0) {
      const int w0 = warp, nw = G >> 5;
      a = 0.0f;
      a2 = 0.0f;
      for (int w = 0; w < nw; ++w) {
        a += red[w0 + w];
        a2 += red2[w0 + w];
      }
    }
  }
  if (live && sub == 0) {
    if (skip) {
      y[row] = 0.0f;
    } else if (J.mode == GemvMode::Store) {
      y[row] = J.conv_w ? conv_silu_channel(J, row, a) : a;
    } else if (J.mode == GemvMode::Accumulate) {
      y[row] = (y_old ? *y_old : __ldcg(y + row)) + a;
    } else {
      y[row] = silu_dev(a) * a2;
    }
  }
}

// Shared-memory layout of the staged input for n columns (in floats): xs (padded), s16, then the int8
// form (q as n bytes, 16-byte aligned; d32; sum16; isum16).
struct StageLayout {
  int s16, q, d32, sum16, isum16, total;
};
__host__ __device__ inline StageLayout stage_layout(int n) {
  StageLayout l{};
  l.s16 = rows::xpad_size(n);
  l.q = (l.s16 + n / 16 + 3) & ~3;
  l.d32 = l.q + (n + 15) / 16 * 4;
  l.sum16 = l.d32 + n / 32;
  l.isum16 = l.sum16 + n / 16;
  l.total = l.isum16 + n / 16;
  return l;
}

// The int8 form of the staged x (quantize_activations_i8_scalar's arithmetic: the same q, d32 and
// sum16 as the CPU engine computes for this vector). Eight lanes per block of 32 values, four values
// each, so a 2048-float vector takes two passes of the whole block (three of the 224-thread group).
// n % 256 == 0 (the K-quant widths), so every warp's lanes take the same number of passes.
static __device__ void stage_i8(const float* xs, int n, int8_t* q, float* d32, float* sum16, int* isum16,
                                const Group& g) {
  const int lane = threadIdx.x & 31;
  for (int base = 4 * g.t; base < n; base += 4 * g.nt) {
    const float4 v = *reinterpret_cast<const float4*>(xs + rows::xpad(base));
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int c[4] = {__float2int_rn(v.x * inv), __float2int_rn(v.y * inv), __float2int_rn(v.z * inv),
                __float2int_rn(v.w * inv)};
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      c[i] = c[i] > 127 ? 127 : (c[i] < -127 ? -127 : c[i]);
      sum += c[i];
    }
    *reinterpret_cast<int*>(q + base) =
        (c[0] & 0xff) | ((c[1] & 0xff) << 8) | ((c[2] & 0xff) << 16) | (static_cast<int>(static_cast<unsigned>(c[3]) << 24));
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);  // four lanes = 16 values
    if ((lane & 7) == 0) d32[base >> 5] = d;
    if ((lane & 3) == 0) {
      isum16[base >> 4] = sum;
      sum16[base >> 4] = d * static_cast<float>(sum);
    }
  }
}

// What a block has staged in shared memory (block-uniform), and whose route_in picks route_ids holds;
// kept across the tiles of a launch.
struct BlockStage {
  const float* x = nullptr;
  const float* norm = nullptr;
  int n = -1;
  bool i8 = false;
  bool s16 = false;
  const float* routed_from = nullptr;  // the route_in logits route_ids[] was computed from
  bool by_group = false;               // staged by warps 1.. while warp 0 routed (run_tiles)
  __device__ void note_staged(const DJob& J, bool sums, bool int8) {
    x = J.x;
    n = J.n_cols;
    norm = J.norm_w;
    s16 = sums;
    i8 = int8;
  }
};

// The row dots' view of an input staged at smem in layout L.
__device__ __forceinline__ rows::XStage stage_view(const float* smem, const StageLayout& L) {
  return rows::XStage{smem, smem + L.s16, reinterpret_cast<const int8_t*>(smem + L.q), smem + L.d32, smem + L.sum16,
                      reinterpret_cast<const int*>(smem + L.isum16)};
}

// The int8 form (stage_i8) of the n floats already staged at smem in layout L, by thread group g.
__device__ __forceinline__ void stage_int8(float* smem, const StageLayout& L, int n, const Group& g) {
  stage_i8(smem, n, reinterpret_cast<int8_t*>(smem + L.q), smem + L.d32, smem + L.sum16,
           reinterpret_cast<int*>(smem + L.isum16), g);
}

// Stages job J's input x (J.x, or its token's row) (stage_x, then the int8 form when int8) by thread
// group g; the caller synchronises the block before the staged input is read.
template <int H>
__device__ __forceinline__ void stage_input(const DJob& J, const float* x, const StageLayout& L, bool sums, bool int8,
                                            float* smem, const Group& g) {
  stage_x<H>(x, J.n_cols, smem, smem + L.s16, J.norm_w, J.norm_eps, sums, g);
  if (int8) {
    group_sync(g);
    stage_int8(smem, L, J.n_cols, g);
  }
}

// The block's shared scratch of one launch.
struct BlockScratch {
  float* smem;    // the staged input (stage_layout of the widest row)
  float* red;     // kWarps floats
  float* red2;    // kWarps floats
  int* route_ids; // 64 ints: route_in's picks
};

// The expert slot of a routed job's tile. With route_in, the block routes once per logits vector and
// keeps the picks in route_ids (block 0 also writes ids / weights / counts). Returns the slot, or -1
// when the expert is not resident.
template <bool Tokens>
__device__ __forceinline__ int routed_slot(const GemvRoute& rin, const DJob& J, BlockStage& st, const BlockScratch& S) {
  int e;
  if (rin.logits) {
    if (st.routed_from != rin.logits) {  // block-uniform
      route_block<Tokens>(rin, S.route_ids, blockIdx.x == 0);
      st.routed_from = rin.logits;
    }
    e = S.route_ids[J.slot];
  } else {
    e = __ldcg(J.ids + block_token<Tokens>() * J.ids_ts + J.slot);
  }
  return J.slot_of_expert ? __ldcg(J.slot_of_expert + e) : e;
}

// The tiles blockIdx.x, + gridDim.x, ... of n_tiles over jobs[0..n_jobs) (tile_begin ascending from 0).
// The caller has waited for the previous kernel. Ends with route_in's outputs written (block 0 routes
// here when it had no routed tile). Tokens: a token grid, this block on token blockIdx.y's rows (the
// same tiles and arithmetic as a single-token launch; the staged-input and route checks compare the
// jobs' base pointers, which identify the token's rows as well since a block keeps its token).
template <bool Tokens>
__device__ __forceinline__ void run_tiles(const DJob* jobs, int n_jobs, int n_tiles, const GemvRoute& rin, bool i8,
                                          BlockStage& st, const BlockScratch& S) {
  for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    int ji = 0;
    while (ji + 1 < n_jobs && tile >= jobs[ji + 1].tile_begin) ++ji;
    const DJob& J = jobs[ji];
    const int tok = block_token<Tokens>();
    const float* jx = J.x + tok * J.x_ts;
    const StageLayout L = stage_layout(J.n_cols);
    float* smem = S.smem;
    const rows::XStage X = stage_view(smem, L);
    const bool i8a = i8 && rows::int8_path_type(J.type);
    const bool i8b = i8 && J.w2 && rows::int8_path_type(J.type2);
    // The float path's 16-sums are read by K-quant rows only.
    const bool want_s16 = (!i8a && rows::int8_path_type(J.type)) || (J.w2 && !i8b && rows::int8_path_type(J.type2));
    // block-uniform
    bool restage = J.x != st.x || J.n_cols != st.n || J.norm_w != st.norm || ((i8a || i8b) && !st.i8) ||
                         (want_s16 && !st.s16);
    const int G = 1 << J.g_log2;
    const int sub = threadIdx.x & (G - 1);
    const int row = (tile - J.tile_begin) * J.tile_rows + (threadIdx.x >> J.g_log2);
    const bool live = row < J.n_rows;
    const int row_c = live ? row : J.n_rows - 1;  // threads past the last row work on it and store nothing
    const uint8_t* base = J.w;
    const uint8_t* base2 = J.w2;
    bool skip = false;
    // A routed tile of a launch that routes itself is staged by warps 1.. (warp 0 routes meanwhile, so the
    // block does not wait for the routing before staging), any other tile by the whole block. The two forms
    // add the rmsnorm sum in different orders, so a tile whose input was staged in the other form restages:
    // every tile sees the staging a block that runs it alone gives it, whatever tiles its block ran before
    // (a token grid's blocks run several).
    const bool group_tile = J.ids && rin.logits && blockDim.x > 32;
    if (group_tile != st.by_group) restage = true;
    if (group_tile && restage) {  // block-uniform
      __syncthreads();  // the previous tile's readers of the staged input are done
      if (threadIdx.x < 32) {
        if (st.routed_from != rin.logits) route_warp0<Tokens>(rin, S.route_ids, blockIdx.x == 0);
      } else {
        const Group g{static_cast<int>(threadIdx.x) - 32, static_cast<int>(blockDim.x) - 32, 1};
        stage_input<3>(J, jx, L, want_s16, i8a || i8b, smem, g);
      }
      __syncthreads();
      st.routed_from = rin.logits;
      st.note_staged(J, want_s16, i8a || i8b);
      st.by_group = true;
      restage = false;
    }
    if (J.ids) {
      const int s = routed_slot<Tokens>(rin, J, st, S);
      if (s < 0) {
        skip = true;  // not resident: no rows to read (a layer may have no resident expert), zeros stored
      } else {
        base += static_cast<size_t>(s) * J.expert_stride;
        if (base2) base2 += static_cast<size_t>(s) * J.expert_stride2;
      }
    }
    if (restage) {
      __syncthreads();  // the previous tile's readers of the staged input are done
      stage_input<2>(J, jx, L, want_s16, i8a || i8b, smem, whole_block());
      __syncthreads();
      st.note_staged(J, want_s16, i8a || i8b);
      st.by_group = false;
    }
    float a = 0.0f, a2 = 0.0f;
    // The residual's old value is read before the row's weights, so its L2 round trip overlaps theirs
    // (single-token launches: the token grid's registers have no room for it).
    const bool early = !Tokens && J.mode == GemvMode::Accumulate && live && sub == 0 && !skip;
    const float y_old = early ? __ldcg(J.y + tok * J.y_ts + row) : 0.0f;
    const uint8_t* ra = base + static_cast<size_t>(row_c) * J.row_bytes;
    if (skip) {  // block-uniform: the whole tile is one job's expert
    } else if (J.mode != GemvMode::SwigluPair) {
      a = rows::row_dot_rolled(J.type, i8a, ra, J.n_cols, X, sub, G);
    } else {
      const uint8_t* rb = base2 + static_cast<size_t>(row_c) * J.row_bytes2;
      if (J.type == J.type2) {
        rows::row_dot2_rolled(J.type, i8a, ra, rb, J.n_cols, X, sub, G, a, a2);
      } else {
        a = rows::row_dot_rolled(J.type, i8a, ra, J.n_cols, X, sub, G);
        a2 = rows::row_dot_rolled(J.type2, i8b, rb, J.n_cols, X, sub, G);
      }
    }
    finish_row(J, J.y + tok * J.y_ts, row, live, sub, G, skip, a, a2, S.red, S.red2, Tokens ? nullptr : &y_old);
  }
  if (rin.logits && blockIdx.x == 0 && st.routed_from != rin.logits) {  // block-uniform
    route_block<Tokens>(rin, S.route_ids, true);
    st.routed_from = rin.logits;
  }
}

// The token-shared launch (gemv_batch's choice for a token grid whose jobs are all unrouted K-quant rows
// on the int8 path): block (x, y) runs the tiles blockIdx.x, + gridDim.x, ... for its tokens t0 .. t0 +
// nt - 1 (t0 = blockIdx.y * per), stages each token's int8 input once per job input (through the
// scratch xs at smem[0], into token t's area at smem + tok_base + t * token_floats(n)) and reads each
// weight unit once for all of them. Each token's staging (stage_input's, whole block) and row sums
// (row_dot_tokens_t) are the single-token launch's, so every token's outputs are bitwise those of a
// single-token launch on its rows.
template <int NT>
__device__ __forceinline__ void run_tiles_tokens(const DJob* jobs, int n_jobs, int n_tiles, int n_tokens, int per,
                                                 int tok_base, BlockStage& st, const BlockScratch& S) {
  const int t0 = static_cast<int>(blockIdx.y) * per;
  const int nt = min(per, n_tokens - t0);
  for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    int ji = 0;
    while (ji + 1 < n_jobs && tile >= jobs[ji + 1].tile_begin) ++ji;
    const DJob& J = jobs[ji];
    const int n = J.n_cols;
    const int ts = rows::token_floats(n);
    const float* tok0 = S.smem + tok_base;
    if (J.x != st.x || n != st.n || J.norm_w != st.norm) {  // block-uniform
      for (int t = 0; t < nt; ++t) {
        __syncthreads();  // the scratch (and, for t = 0, every token's area) is free
        stage_x<2>(J.x + (t0 + t) * J.x_ts, n, S.smem, S.smem, J.norm_w, J.norm_eps, false, whole_block());
        __syncthreads();
        float* a = S.smem + tok_base + t * ts;
        stage_i8(S.smem, n, reinterpret_cast<int8_t*>(a), a + n / 4, a + n / 4 + n / 32,
                 reinterpret_cast<int*>(a + n / 4 + n / 32 + n / 16), whole_block());
      }
      __syncthreads();
      st.x = J.x, st.n = n, st.norm = J.norm_w;
    }
    const int G = 1 << J.g_log2;
    const int sub = threadIdx.x & (G - 1);
    const int row = (tile - J.tile_begin) * J.tile_rows + (threadIdx.x >> J.g_log2);
    const bool live = row < J.n_rows;
    const int row_c = live ? row : J.n_rows - 1;  // threads past the last row work on it and store nothing
    const uint8_t* ra = J.w + static_cast<size_t>(row_c) * J.row_bytes;
    float a[NT], a2[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      a[t] = __int_as_float(0x7fc00000);  // NaN for a type the kernels do not take (the host refuses it)
      a2[t] = 0.0f;
    }
    if (J.mode != GemvMode::SwigluPair) {
      rows::with_int8_type(J.type, [&](auto type) {
        rows::row_dot_tokens_t<decltype(type)::value, NT>(ra, n, tok0, ts, nt, sub, G, a);
      });
    } else {
      const uint8_t* rb = J.w2 + static_cast<size_t>(row_c) * J.row_bytes2;
      if (J.type == J.type2) {
        rows::with_int8_type(J.type, [&](auto type) {
          rows::row_dot2_tokens_t<decltype(type)::value, NT>(ra, rb, n, tok0, ts, nt, sub, G, a, a2);
        });
      } else {
        rows::with_int8_type(J.type, [&](auto type) {
          rows::row_dot_tokens_t<decltype(type)::value, NT>(ra, n, tok0, ts, nt, sub, G, a);
        });
        rows::with_int8_type(J.type2, [&](auto type) {
          rows::row_dot_tokens_t<decltype(type)::value, NT>(rb, n, tok0, ts, nt, sub, G, a2);
        });
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < nt) finish_row(J, J.y + (t0 + t) * J.y_ts, row, live, sub, G, false, a[t], a2[t], S.red, S.red2);
  }
}

}  // namespace strata::cuda::mv
