// The batched matvec kernel (matvec_kernels.h). One launch covers up to kMaxGemvJobs jobs; the row
// space of all jobs is cut into tiles (256 threads / G rows) and a grid sized to fill the GPU loops
// over the tiles. Each row is handled by a group of G threads (a power of two, 1..256; above 32 the
// row spans several warps that meet in shared memory), chosen so that every thread has one or two
// units and issues all its loads before the first use: a row costs one memory round trip whether it
// is a 512-column expert row or a 2048-float router row.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_combine.cuh"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/matvec_kernels.h"
#include "strata/cuda/matvec_rows.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxCols = 16384;

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
};

struct DBatch {
  DJob j[kMaxGemvJobs];
  int n_jobs;
  int n_tiles;
  GemvNorm norm;    // norm.counter == nullptr: none
  GemvRoute route;  // route.counter == nullptr: none
  GemvCombine combine;  // combine.counter == nullptr: none
};

// Block-wide sum in double (blockDim.x a multiple of 32); every thread gets the result.
__device__ double block_sum_d(double v) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  double t = 0.0;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) t += part[i];
  return t;
}

// Whether this block is the last of the grid to get here (then every other block's outputs are visible
// to it through L2); the last block resets the counter for the next launch.
__device__ bool last_block(unsigned int* counter) {
  __shared__ bool last;
  __threadfence();  // this thread's outputs are visible device-wide before the block is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();
  if (threadIdx.x == 0) *counter = 0;
  return true;
}

__device__ float block_max_f(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = part[0];
  for (int i = 1; i < static_cast<int>(blockDim.x >> 5); ++i) t = fmaxf(t, part[i]);
  return t;
}

// Softmax + rank top-k, as route_kernel in kernels.cu.
__device__ __noinline__ void route_epilogue(const GemvRoute& r) {
  if (!last_block(r.counter)) return;
  __shared__ float p[1024];
  __shared__ int chosen[64];
  const int t = threadIdx.x;
  float mx = -INFINITY;
  for (int i = t; i < r.n_expert; i += blockDim.x) {
    p[i] = __ldcg(r.logits + i);
    mx = fmaxf(mx, p[i]);
  }
  mx = block_max_f(mx);
  double sum = 0.0;
  for (int i = t; i < r.n_expert; i += blockDim.x) {
    p[i] = expf(p[i] - mx);
    sum += p[i];
  }
  sum = block_sum_d(sum);
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = t; i < r.n_expert; i += blockDim.x) p[i] *= inv;
  __syncthreads();
  for (int i = t; i < r.n_expert; i += blockDim.x) {
    const float v = p[i];
    int rank = 0;
    for (int j = 0; j < r.n_expert; ++j) {
      const float o = p[j];
      rank += (o > v) || (o == v && j < i);
    }
    if (rank < r.k) chosen[rank] = i;
  }
  __syncthreads();
  if (t == 0) {
    double s = 0.0;
    for (int j = 0; j < r.k; ++j) s += p[chosen[j]];
    for (int j = 0; j < r.k; ++j) {
      r.ids[j] = chosen[j];
      r.weights[j] = r.norm_topk ? static_cast<float>(p[chosen[j]] / s) : p[chosen[j]];
    }
  }
  if (r.counts && t < r.k) atomicAdd(r.counts + chosen[t], 1ull);
}

__device__ __noinline__ void combine_epilogue(const GemvCombine& c) {
  if (!last_block(c.counter)) return;
  moe_combine_norm_block(c.x, c.ye, c.ids, c.weights, c.k, c.d, c.ys, c.shared_gate, c.norm_w, c.eps, c.xn);
}

// The epilogue norm, run by the last block to finish. Reads through L2 (__ldcg): other blocks wrote x.
__device__ __noinline__ void norm_epilogue(const GemvNorm& nm) {
  if (!last_block(nm.counter)) return;
  double ss = 0.0;
  for (int i = threadIdx.x; i < nm.n; i += blockDim.x) {
    const float v = __ldcg(nm.x + i);
    ss += static_cast<double>(v) * v;
  }
  ss = block_sum_d(ss);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(nm.n) + nm.eps));
  for (int i = threadIdx.x; i < nm.n; i += blockDim.x) nm.out[i] = __ldcg(nm.x + i) * inv * nm.w[i];
}

__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }

// Copies x (n floats) into the padded shared layout and computes the 16-element sums.
__device__ void stage_x(const float* x, int n, float* xs, float* s16) {
  const bool vec = (n % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0);
  if (vec) {
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x)
      *reinterpret_cast<float4*>(xs + rows::xpad(4 * i)) = reinterpret_cast<const float4*>(x)[i];
  } else {
    for (int i = threadIdx.x; i < n; i += blockDim.x) xs[rows::xpad(i)] = x[i];
  }
  __syncthreads();
  for (int c = threadIdx.x; c < n / 16; c += blockDim.x) {
    const float* p = xs + rows::xpad(16 * c);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) s += p[i];
    s16[c] = s;
  }
}

// Asks L2 for this thread's share of the block's first row tile (weights only, which no kernel writes):
// issued before waiting on the previous kernel, so the fetch overlaps its tail. Routed jobs are
// skipped (their expert ids come from the previous kernel).
__device__ __forceinline__ void prefetch_first_tile(const DBatch& b) {
  const int tile = blockIdx.x;
  if (tile >= b.n_tiles) return;
  int ji = 0;
  while (ji + 1 < b.n_jobs && tile >= b.j[ji + 1].tile_begin) ++ji;
  const DJob& J = b.j[ji];
  if (J.ids) return;
  const int G = 1 << J.g_log2;
  const int sub = threadIdx.x & (G - 1);
  const int row = (tile - J.tile_begin) * J.tile_rows + (threadIdx.x >> J.g_log2);
  if (row >= J.n_rows) return;
  const uint8_t* ra = J.w + static_cast<size_t>(row) * J.row_bytes;
  for (size_t off = static_cast<size_t>(sub) * 128; off < J.row_bytes; off += static_cast<size_t>(G) * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(ra + off));
  if (J.w2) {
    const uint8_t* rb = J.w2 + static_cast<size_t>(row) * J.row_bytes2;
    for (size_t off = static_cast<size_t>(sub) * 128; off < J.row_bytes2; off += static_cast<size_t>(G) * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(rb + off));
  }
}

__global__ void __launch_bounds__(kThreads, 3) gemv_kernel(const __grid_constant__ DBatch b) {
  pdl_launch_dependents();
  prefetch_first_tile(b);
  pdl_wait();
  extern __shared__ float smem[];
  __shared__ float red[kWarps], red2[kWarps];
  const float* staged = nullptr;
  int staged_n = -1;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int tile = blockIdx.x; tile < b.n_tiles; tile += gridDim.x) {
    int ji = 0;
    while (ji + 1 < b.n_jobs && tile >= b.j[ji + 1].tile_begin) ++ji;
    const DJob& J = b.j[ji];
    float* xs = smem;
    float* s16 = smem + rows::xpad_size(J.n_cols);
    if (J.x != staged || J.n_cols != staged_n) {  // block-uniform
      __syncthreads();
      stage_x(J.x, J.n_cols, xs, s16);
      __syncthreads();
      staged = J.x;
      staged_n = J.n_cols;
    }
    const uint8_t* base = J.w;
    const uint8_t* base2 = J.w2;
    bool skip = false;
    if (J.ids) {
      const int e = J.ids[J.slot];
      const int s = J.slot_of_expert ? J.slot_of_expert[e] : e;
      if (s < 0) {
        skip = true;
      } else {
        base += static_cast<size_t>(s) * J.expert_stride;
        if (base2) base2 += static_cast<size_t>(s) * J.expert_stride2;
      }
    }
    const int G = 1 << J.g_log2;
    const int sub = threadIdx.x & (G - 1);
    const int row = (tile - J.tile_begin) * J.tile_rows + (threadIdx.x >> J.g_log2);
    const bool live = row < J.n_rows;
    float a = 0.0f, a2 = 0.0f;
    if (live && !skip) {
      const uint8_t* ra = base + static_cast<size_t>(row) * J.row_bytes;
      if (J.mode != GemvMode::SwigluPair) {
        a = rows::row_dot(J.type, ra, J.n_cols, xs, s16, sub, G);
      } else {
        const uint8_t* rb = base2 + static_cast<size_t>(row) * J.row_bytes2;
        if (J.type == J.type2) {
          rows::row_dot2(J.type, ra, rb, J.n_cols, xs, s16, sub, G, a, a2);
        } else {
          a = rows::row_dot(J.type, ra, J.n_cols, xs, s16, sub, G);
          a2 = rows::row_dot(J.type2, rb, J.n_cols, xs, s16, sub, G);
        }
      }
    }
    for (int o = (G < 32 ? G : 32) >> 1; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      a2 += __shfl_xor_sync(0xffffffffu, a2, o);
    }
    if (G > 32) {  // block-uniform: the G/32 warps of a row add their sums in warp order
      __syncthreads();  // the previous tile's readers of red[] are done
      if (lane == 0) {
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
        J.y[row] = 0.0f;
      } else if (J.mode == GemvMode::Store) {
        J.y[row] = a;
      } else if (J.mode == GemvMode::Accumulate) {
        J.y[row] += a;
      } else {
        J.y[row] = silu_f(a) * a2;
      }
    }
  }
  if (b.norm.counter) norm_epilogue(b.norm);
  if (b.route.counter) route_epilogue(b.route);
  if (b.combine.counter) combine_epilogue(b.combine);
}

int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p <<= 1;
  return p;
}

int log2_of(int p) {
  int l = 0;
  while ((1 << l) < p) ++l;
  return l;
}

struct DeviceLimits {
  int sms = 0;
  int blocks_per_sm = 0;
};

const DeviceLimits& limits() {
  static const DeviceLimits lim = [] {
    DeviceLimits l;
    int dev = 0;
    check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    const int smem = (rows::xpad_size(kMaxCols) + kMaxCols / 16) * static_cast<int>(sizeof(float));
    check_cuda(cudaFuncSetAttribute(gemv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
               "cudaFuncSetAttribute(gemv)");
    // Occupancy at the common 2048..4096-column size; larger inputs simply run fewer blocks per SM.
    const int smem_typ = (rows::xpad_size(4096) + 4096 / 16) * static_cast<int>(sizeof(float));
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&l.blocks_per_sm, gemv_kernel, kThreads, smem_typ),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    l.blocks_per_sm = std::max(1, l.blocks_per_sm);
    return l;
  }();
  return lim;
}

}  // namespace

int64_t max_gemv_cols() { return kMaxCols; }

void gemv_batch(const GemvJob* jobs, int n_jobs, cudaStream_t s, const GemvNorm* norm, const GemvRoute* route,
                const GemvCombine* combine) {
  check_arg(n_jobs >= 1 && n_jobs <= kMaxGemvJobs, "gemv_batch: 1..kMaxGemvJobs jobs");
  DBatch b{};
  b.n_jobs = n_jobs;
  int tiles = 0, max_cols = 0;
  for (int i = 0; i < n_jobs; ++i) {
    const GemvJob& in = jobs[i];
    const DevMatrix& w = *in.w;
    if (!supported_type(w.type)) fail_unsupported_type("gemv_batch", w.type);
    if (w.n_cols > kMaxCols || w.n_cols < 1)
      fail("CUDA backend: gemv_batch: a row of ", w.n_cols, " columns is outside 1..", kMaxCols);
    if (w.n_cols % type_traits(w.type).block_elems != 0)
      fail("CUDA backend: gemv_batch: ", w.n_cols, " columns is not a whole number of ", type_traits(w.type).name,
           " blocks");
    const int U = rows::units_per_row(w.type, static_cast<int>(w.n_cols));
    DJob& d = b.j[i];
    d.w = w.data;
    d.row_bytes = w.row_bytes;
    d.expert_stride = w.expert_stride;
    d.type = w.type;
    d.type2 = w.type;
    d.w2 = nullptr;
    d.row_bytes2 = 0;
    d.expert_stride2 = 0;
    if (in.mode == GemvMode::SwigluPair) {
      check_arg(in.w2 != nullptr, "gemv_batch: SwigluPair needs w2");
      const DevMatrix& u = *in.w2;
      if (!supported_type(u.type)) fail_unsupported_type("gemv_batch", u.type);
      check_arg(u.n_rows == w.n_rows && u.n_cols == w.n_cols, "gemv_batch: gate/up shapes differ");
      d.w2 = u.data;
      d.row_bytes2 = u.row_bytes;
      d.expert_stride2 = u.expert_stride;
      d.type2 = u.type;
    }
    d.x = in.x;
    d.y = in.y;
    d.ids = in.ids;
    d.slot = in.slot;
    d.slot_of_expert = in.slot_of_expert;
    d.n_rows = static_cast<int>(w.n_rows);
    d.n_cols = static_cast<int>(w.n_cols);
    d.mode = in.mode;
    // Threads per row: two units each (the single-row loops keep two units' loads in flight), or one
    // unit of each row for gate/up pairs (two rows' loads in flight).
    const int per_thread = in.mode == GemvMode::SwigluPair ? 1 : 2;
    const int G = std::min(kThreads, pow2_ceil(std::max(1, (U + per_thread - 1) / per_thread)));
    d.g_log2 = log2_of(G);
    d.tile_rows = kThreads / G;
    d.tile_begin = tiles;
    tiles += static_cast<int>((w.n_rows + d.tile_rows - 1) / d.tile_rows);
    max_cols = std::max(max_cols, d.n_cols);
  }
  b.n_tiles = tiles;
  if (norm) {
    check_arg(norm->counter && norm->x && norm->w && norm->out && norm->n > 0, "gemv_batch: incomplete GemvNorm");
    b.norm = *norm;
  }
  if (route) {
    check_arg(!norm, "gemv_batch: one epilogue at most");
    check_arg(route->counter && route->logits && route->ids && route->weights, "gemv_batch: incomplete GemvRoute");
    check_arg(route->n_expert <= 1024 && route->k <= 64 && route->k <= route->n_expert && route->k >= 1,
              "gemv_batch: route needs n_expert <= 1024 and 1 <= k <= 64");
    b.route = *route;
  }
  if (combine) {
    check_arg(!norm && !route, "gemv_batch: one epilogue at most");
    check_arg(combine->counter && combine->x && combine->ye && combine->ids && combine->weights && combine->k >= 1 &&
                  combine->k <= 64 && combine->d > 0 && (!combine->ys || combine->shared_gate) &&
                  (!combine->norm_w || combine->xn),
              "gemv_batch: incomplete GemvCombine (k must be 1..64)");
    b.combine = *combine;
  }
  const DeviceLimits& lim = limits();
  const int grid = std::max(1, std::min(tiles, lim.sms * lim.blocks_per_sm));
  const size_t smem = (static_cast<size_t>(rows::xpad_size(max_cols)) + max_cols / 16) * sizeof(float);
  launch_pdl("gemv_batch", gemv_kernel, dim3(grid), dim3(kThreads), smem, s, b);
}

}  // namespace strata::cuda
