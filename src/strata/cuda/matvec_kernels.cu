// The batched matvec kernel (matvec_kernels.h). One launch covers up to kMaxGemvJobs jobs; the row
// space of all jobs is cut into tiles (256 threads / G rows) and a grid sized to fill the GPU loops
// over the tiles. Each row is handled by a group of G threads (a power of two, 1..256; above 32 the
// row spans several warps that meet in shared memory), chosen so that every thread holds
// rows::units_in_flight units (up to 8, ~256 bytes) and issues all their loads before the first use:
// these small matrices are latency-bound, so the bytes in flight per round trip are what counts. A
// block's first tile of a plain matrix is fetched before the kernel waits on the previous one
// (programmatic dependent launch), overlapping that kernel's tail.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_combine.cuh"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/device_math.cuh"
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
  const float* norm_w;  // GemvJob::norm_w
  float norm_eps;
  const float* conv_w;  // GemvJob::conv_*
  float* conv_state;
  int conv_k;
  int conv_channels;
};

struct DBatch {
  DJob j[kMaxGemvJobs];
  int n_jobs;
  int n_tiles;
  GemvNorm norm;    // norm.counter == nullptr: none
  GemvRoute route;  // route.counter == nullptr: none
  GemvCombine combine;  // combine.counter == nullptr: none
  GemvRoute route_in;   // route_in.logits == nullptr: none (see gemv_batch)
};

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

// Softmax + rank top-k, as route_kernel in kernels.cu (the same arithmetic and tie rule), by one whole
// block. The k picks end in chosen[] (shared memory, visible to every thread on return); with
// write_out the block also writes ids / weights / counts.
__device__ __noinline__ void route_block(const GemvRoute& r, int* chosen, bool write_out) {
  __shared__ float p[1024];
  const int t = threadIdx.x;
  float mx = -INFINITY;
  for (int i = t; i < r.n_expert; i += blockDim.x) {
    p[i] = __ldcg(r.logits + i);
    mx = fmaxf(mx, p[i]);
  }
  mx = block_max(mx);
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
    int j = 0;
    // Rank = how many experts come before i (larger probability, or equal and a lower id); four at a
    // time so the shared-memory reads overlap.
    for (; j + 4 <= r.n_expert; j += 4) {
      const float o0 = p[j], o1 = p[j + 1], o2 = p[j + 2], o3 = p[j + 3];
      rank += ((o0 > v) || (o0 == v && j < i)) + ((o1 > v) || (o1 == v && j + 1 < i)) +
              ((o2 > v) || (o2 == v && j + 2 < i)) + ((o3 > v) || (o3 == v && j + 3 < i));
    }
    for (; j < r.n_expert; ++j) {
      const float o = p[j];
      rank += (o > v) || (o == v && j < i);
    }
    if (rank < r.k) chosen[rank] = i;
  }
  __syncthreads();
  if (write_out) {
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
  __syncthreads();  // p[] and chosen[] are read above before a later call may overwrite them
}

__device__ __noinline__ void route_epilogue(const GemvRoute& r) {
  if (!last_block(r.counter)) return;
  __shared__ int chosen[64];
  route_block(r, chosen, true);
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

// The conv1d + SiLU step of channel c whose newest input is v (conv1d_silu_kernel's arithmetic);
// advances that channel's state.
__device__ __noinline__ float conv_silu_channel(const DJob& J, int c, float v) {
  const int K = J.conv_k, ch = J.conv_channels;
  const float* w = J.conv_w + static_cast<int64_t>(c) * K;
  float* st = J.conv_state;
  float acc = w[K - 1] * v;
  for (int j = 0; j < K - 1; ++j) acc += w[j] * st[static_cast<int64_t>(j) * ch + c];
  if (K > 1) {
    for (int j = 0; j < K - 2; ++j) st[static_cast<int64_t>(j) * ch + c] = st[static_cast<int64_t>(j + 1) * ch + c];
    st[static_cast<int64_t>(K - 2) * ch + c] = v;
  }
  return silu_f(acc);
}

// Copies x (n floats) into the padded shared layout and computes the 16-element sums. With norm_w, the
// staged vector is rmsnorm(x) * norm_w (norm_epilogue's arithmetic; every block computes the same sum).
// The common case (16-byte aligned, n <= 4 * kHeld * blockDim.x: the 2048-float residual stream) holds
// x and norm_w in registers, every load issued before the first use: a loop that loads, scales and
// stores one element at a time waits about one L2 round trip per step.
constexpr int kHeld = 2;  // float4 of x (and of norm_w) per thread; 4 would spill registers
__device__ void stage_x(const float* x, int n, float* xs, float* s16, const float* norm_w, float eps) {
  const int bd = static_cast<int>(blockDim.x), t = static_cast<int>(threadIdx.x);
  const bool aligned = (n % 4 == 0) && ((reinterpret_cast<uintptr_t>(x) & 15) == 0) &&
                       (!norm_w || (reinterpret_cast<uintptr_t>(norm_w) & 15) == 0);
  if (aligned && n / 4 <= kHeld * bd) {  // block-uniform
    const int n4 = n / 4;
    float4 xv[kHeld], wv[kHeld];
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int q = t + i * bd;
      xv[i] = q < n4 ? reinterpret_cast<const float4*>(x)[q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      wv[i] = norm_w && q < n4 ? __ldg(reinterpret_cast<const float4*>(norm_w) + q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (norm_w) {
      double ss = 0.0;
#pragma unroll
      for (int i = 0; i < kHeld; ++i)
        ss += static_cast<double>(xv[i].x) * xv[i].x + static_cast<double>(xv[i].y) * xv[i].y +
              static_cast<double>(xv[i].z) * xv[i].z + static_cast<double>(xv[i].w) * xv[i].w;
      ss = block_sum_d(ss);
      const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
#pragma unroll
      for (int i = 0; i < kHeld; ++i) {
        xv[i].x = xv[i].x * inv * wv[i].x;
        xv[i].y = xv[i].y * inv * wv[i].y;
        xv[i].z = xv[i].z * inv * wv[i].z;
        xv[i].w = xv[i].w * inv * wv[i].w;
      }
    }
#pragma unroll
    for (int i = 0; i < kHeld; ++i) {
      const int q = t + i * bd;
      if (q < n4) *reinterpret_cast<float4*>(xs + rows::xpad(4 * q)) = xv[i];
    }
  } else if (aligned) {  // longer rows: float4 steps
    const int n4 = n / 4;
    double ss = 0.0;
    for (int q = t; q < n4; q += bd) {
      const float4 v = reinterpret_cast<const float4*>(x)[q];
      *reinterpret_cast<float4*>(xs + rows::xpad(4 * q)) = v;
      if (norm_w)
        ss += static_cast<double>(v.x) * v.x + static_cast<double>(v.y) * v.y + static_cast<double>(v.z) * v.z +
              static_cast<double>(v.w) * v.w;
    }
    if (norm_w) {  // block-uniform
      ss = block_sum_d(ss);  // synchronises: every element is staged
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
      const float v = x[i];
      xs[rows::xpad(i)] = v;
      if (norm_w) ss += static_cast<double>(v) * v;
    }
    if (norm_w) {  // block-uniform
      ss = block_sum_d(ss);  // synchronises: every element is staged
      const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(n) + eps));
      for (int i = t; i < n; i += bd) {
        float& v = xs[rows::xpad(i)];
        v = v * inv * norm_w[i];
      }
    }
  }
  __syncthreads();
  for (int c = t; c < n / 16; c += bd) {
    const float* p = xs + rows::xpad(16 * c);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) s += p[i];
    s16[c] = s;
  }
}

// The ready() step of rows::row_dot (see the kernel).
struct TileReady {
  bool* waited;
  bool restage;
  const float* x;
  int n;
  float* xs;
  float* s16;
  const float* norm_w;
  float eps;
  __device__ __forceinline__ void operator()() const {
    if (!*waited) {
      pdl_wait();
      *waited = true;
    }
    if (restage) {
      __syncthreads();  // the previous tile's readers of xs are done
      stage_x(x, n, xs, s16, norm_w, eps);
      __syncthreads();
    }
  }
};
struct NoReady {
  __device__ __forceinline__ void operator()() const {}
};

// Resident blocks per SM the register budget is sized for (128 registers per thread at 2). Measured on the
// H100 (docs/PERF.md): 3 (80 registers, 4 KB of spills) and 4 (64 registers, 8 KB) decode slower.
#ifndef STRATA_GEMV_MIN_BLOCKS
#define STRATA_GEMV_MIN_BLOCKS 2
#endif
__global__ void __launch_bounds__(kThreads, STRATA_GEMV_MIN_BLOCKS) gemv_kernel(const __grid_constant__ DBatch b) {
  // The next kernel may start now (it waits for this one's completion before touching its outputs).
  pdl_launch_dependents();
  extern __shared__ float smem[];
  __shared__ float red[kWarps], red2[kWarps];
  __shared__ int route_ids[64];  // route_in's picks, computed by this block
  const float* staged = nullptr;
  const float* staged_norm = nullptr;
  int staged_n = -1;
  bool waited = false;  // block-uniform: griddepcontrol.wait done
  bool routed = false;  // block-uniform: route_ids[] holds route_in's picks
  const int warp = threadIdx.x >> 5;
  for (int tile = blockIdx.x; tile < b.n_tiles; tile += gridDim.x) {
    int ji = 0;
    while (ji + 1 < b.n_jobs && tile >= b.j[ji + 1].tile_begin) ++ji;
    const DJob& J = b.j[ji];
    float* xs = smem;
    float* s16 = smem + rows::xpad_size(J.n_cols);
    const bool restage = J.x != staged || J.n_cols != staged_n || J.norm_w != staged_norm;  // block-uniform
    // Called once by every thread, after the first weight loads of the tile are in flight: waits for
    // the previous kernel (first tile only: x and the expert ids are its outputs) and stages x. So for
    // plain matrices the fetch of the block's first tile overlaps the previous kernel's tail.
    TileReady ready{&waited, restage, J.x, J.n_cols, xs, s16, J.norm_w, J.norm_eps};
    const uint8_t* base = J.w;
    const uint8_t* base2 = J.w2;
    bool skip = false;
    if (J.ids) {  // the expert ids are the previous kernel's output: wait first
      if (!waited) {
        pdl_wait();
        waited = true;
      }
      int e;
      if (b.route_in.logits) {
        if (!routed) {  // block-uniform
          route_block(b.route_in, route_ids, blockIdx.x == 0);
          routed = true;
        }
        e = route_ids[J.slot];
      } else {
        e = J.ids[J.slot];
      }
      const int s = J.slot_of_expert ? J.slot_of_expert[e] : e;
      if (s < 0) {
        skip = true;  // not resident: the rows of slot 0 are read (harmlessly) and zeros stored
      } else {
        base += static_cast<size_t>(s) * J.expert_stride;
        if (base2) base2 += static_cast<size_t>(s) * J.expert_stride2;
      }
    }
    const int G = 1 << J.g_log2;
    const int sub = threadIdx.x & (G - 1);
    const int row = (tile - J.tile_begin) * J.tile_rows + (threadIdx.x >> J.g_log2);
    const bool live = row < J.n_rows;
    // Threads past the last row work on the last row (every thread must call ready()) and store nothing.
    const int row_c = live ? row : J.n_rows - 1;
    float a = 0.0f, a2 = 0.0f;
    const uint8_t* ra = base + static_cast<size_t>(row_c) * J.row_bytes;
    if (J.mode != GemvMode::SwigluPair) {
      a = rows::row_dot(J.type, ra, J.n_cols, xs, s16, sub, G, ready);
    } else {
      const uint8_t* rb = base2 + static_cast<size_t>(row_c) * J.row_bytes2;
      if (J.type == J.type2) {
        rows::row_dot2(J.type, ra, rb, J.n_cols, xs, s16, sub, G, a, a2, ready);
      } else {
        a = rows::row_dot(J.type, ra, J.n_cols, xs, s16, sub, G, ready);
        a2 = rows::row_dot(J.type2, rb, J.n_cols, xs, s16, sub, G, NoReady{});
      }
    }
    if (restage) {
      staged = J.x;
      staged_n = J.n_cols;
      staged_norm = J.norm_w;
    }
    for (int o = (G < 32 ? G : 32) >> 1; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      a2 += __shfl_xor_sync(0xffffffffu, a2, o);
    }
    if (G > 32) {  // block-uniform: the G/32 warps of a row add their sums in warp order
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
        J.y[row] = 0.0f;
      } else if (J.mode == GemvMode::Store) {
        J.y[row] = J.conv_w ? conv_silu_channel(J, row, a) : a;
      } else if (J.mode == GemvMode::Accumulate) {
        J.y[row] += a;
      } else {
        J.y[row] = silu_f(a) * a2;
      }
    }
  }
  if (!waited) pdl_wait();  // a block without tiles still orders its epilogue after the previous kernel
  if (b.route_in.logits && blockIdx.x == 0 && !routed) route_block(b.route_in, route_ids, true);  // block-uniform
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
                const GemvCombine* combine, const GemvRoute* route_in) {
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
    d.norm_w = in.norm_w;
    d.norm_eps = in.norm_eps;
    d.conv_w = in.conv_w;
    d.conv_state = in.conv_state;
    d.conv_k = in.conv_k;
    d.conv_channels = in.conv_channels;
    if (in.conv_w)
      check_arg(in.mode == GemvMode::Store && in.conv_state && in.conv_k >= 1 && in.conv_channels >= w.n_rows,
                "gemv_batch: a conv job needs Store mode, a state and K >= 1 with channels >= rows");
    if (route_in && in.ids)
      check_arg(in.ids == route_in->ids, "gemv_batch: with route_in, routed jobs must read route_in->ids");
    // Threads per row: as few as give each thread units_in_flight units (all loads issued before the
    // first use), half that of each row for gate/up pairs. Fewer threads per row = more rows per tile =
    // fewer memory round trips per block.
    const int per_thread =
        in.mode == GemvMode::SwigluPair ? rows::units_in_flight_pair(w.type) : rows::units_in_flight(w.type);
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
  if (route_in) {
    check_arg(route_in->logits && route_in->ids && route_in->weights, "gemv_batch: incomplete route_in");
    check_arg(route_in->n_expert <= 1024 && route_in->k <= 64 && route_in->k <= route_in->n_expert &&
                  route_in->k >= 1,
              "gemv_batch: route_in needs n_expert <= 1024 and 1 <= k <= 64");
    b.route_in = *route_in;
  }
  const DeviceLimits& lim = limits();
  const int grid = std::max(1, std::min(tiles, lim.sms * lim.blocks_per_sm));
  const size_t smem = (static_cast<size_t>(rows::xpad_size(max_cols)) + max_cols / 16) * sizeof(float);
  launch_pdl("gemv_batch", gemv_kernel, dim3(grid), dim3(kThreads), smem, s, b);
}

}  // namespace strata::cuda
