// gemv_down_sum (matvec_kernels.h): the MoE down projection fused with the combine. One warp per output
// row walks the (expert, unit) pairs of that row across all k picked experts (then the shared expert),
// each unit's dot scaled by its expert's weight, so the row's combined value comes out of one warp
// reduction and is added into the residual directly: no per-expert outputs, no fences or counter, no
// last block. Rows are read with the matvec's unit loads and dots (matvec_rows.cuh) and the inputs
// staged as gemv_batch stages them (matvec_block.cuh), the experts' inputs side by side.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/matvec_block.cuh"
#include "strata/cuda/matvec_kernels.h"

namespace strata::cuda {
namespace mv {
namespace {

constexpr int kMaxDownSlots = 64;  // k routed + 1 shared
constexpr int kRowsPerBlock = kWarps;

struct DownSumArgs {
  const uint8_t* stack;
  size_t row_bytes, stride;
  GgmlType type;
  int ff;
  const int* ids;
  const int* slot_of;  // null: expert e is slot e
  const float* weights;
  int k;
  const float* g;
  const uint8_t* shared;  // null: none
  size_t shared_row_bytes;
  GgmlType shared_type;
  int shared_ff;
  const float* gs;
  const float* shared_gate;
  float* x;
  int d;
  bool i8;
  int64_t g_ts, gs_ts, x_ts;  // GemvDownSum's token strides (token-grid launches only)
};

// The staged input of slot s, whose values start at column off of the side-by-side vector (off % 64 == 0,
// so the padded layout of the whole is the layouts of the parts one after another).
__device__ __forceinline__ rows::XStage shifted(const rows::XStage& X, int off) {
  return rows::XStage{X.xs + rows::xpad(off), X.s16 + off / 16, X.q + off, X.d32 + off / 32, X.sum16 + off / 16,
                      X.isum16 + off / 16};
}

// This lane's share of sum_s scale[s] * (row row_off of base[s] . input s), over n_slots slots of ff
// columns (input s at column s * ff of X): units t = lane, lane + 32, ... of the n_slots * U units, kStep
// per loop step with every load issued first (as row_dot_rolled_t).
template <GgmlType T, bool I8>
__device__ __forceinline__ float slots_dot_t(const uint8_t* const* base, const float* scale, int n_slots, size_t row_off,
                                             int ff, const rows::XStage& X, int lane) {
  using Op = rows::Unit<T>;
  constexpr int K = rows::kStep;
  const int U = rows::units_per_row(T, ff);
  const int total = n_slots * U;
  float acc = 0.0f;
#pragma unroll 1
  for (int t = lane; t < total; t += 32 * K) {
    typename Op::Raw r[K];
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int ti = t + 32 * i < total ? t + 32 * i : t;  // unconditional: keeps r[] in registers
      const int s = ti / U;
      r[i] = Op::load(base[s] + row_off, ti - s * U, ff);
    }
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int ti = t + 32 * i;
      if (ti < total) {
        const int s = ti / U;
        acc += scale[s] * rows::unit_value<T, I8>(r[i], ti - s * U, shifted(X, s * ff), ff);
      }
    }
  }
  return acc;
}

__device__ __forceinline__ float slots_dot(GgmlType t, bool i8, const uint8_t* const* base, const float* scale,
                                           int n_slots, size_t row_off, int ff, const rows::XStage& X, int lane) {
  float acc = __int_as_float(0x7fc00000);  // NaN for a type the kernels do not take
  rows::with_row_type(t, i8, [&](auto type, auto math) {
    acc = slots_dot_t<decltype(type)::value, decltype(math)::int8>(base, scale, n_slots, row_off, ff, X, lane);
  });
  return acc;
}

// kSlotMap: the picks go through a.slot_of (the hybrid MoE's hot stack); a separate instantiation, so
// the all-GPU kernel stays as it is without one. kTokens: a token grid, the block on token blockIdx.y's
// picks, inputs and residual row; a constant 0 token otherwise.
template <bool kSlotMap, bool kTokens>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) down_sum_kernel(const __grid_constant__ DownSumArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  const int tok = block_token<kTokens>();
  extern __shared__ float smem[];
  __shared__ const uint8_t* base[kMaxDownSlots];
  __shared__ float scale[kMaxDownSlots];
  __shared__ int src[kMaxDownSlots];  // with a slot map: the pick whose input is staged j-th
  __shared__ int n_hot_s;
  const int t = static_cast<int>(threadIdx.x);
  int n_hot = a.k;
  if constexpr (!kSlotMap) {
    if (t < a.k) {
      base[t] = a.stack + static_cast<size_t>(__ldcg(a.ids + tok * a.k + t)) * a.stride;
      scale[t] = __ldcg(a.weights + tok * a.k + t);
    } else if (t == a.k && a.shared) {
      base[t] = a.shared;
      scale[t] = a.shared_gate ? sigmoid_dev(__ldcg(a.shared_gate + tok)) : 1.0f;
    }
  } else {
    // Only the resident picks take part (a cold one's rows are added later from the CPU's result), in
    // pick order, so with every pick resident the sum is the one without a slot map.
    if (t < 32) {
      int nh = 0;
      for (int p0 = 0; p0 < a.k; p0 += 32) {
        const int p = p0 + t;
        const int slot = p < a.k ? __ldcg(a.slot_of + __ldcg(a.ids + tok * a.k + p)) : -1;
        const unsigned hot = __ballot_sync(0xffffffffu, slot >= 0);
        if (slot >= 0) {
          const int j = nh + __popc(hot & ((1u << t) - 1u));
          base[j] = a.stack + static_cast<size_t>(slot) * a.stride;
          scale[j] = __ldcg(a.weights + tok * a.k + p);
          src[j] = p;
        }
        nh += __popc(hot);
      }
      if (t == 0) {
        n_hot_s = nh;
        if (a.shared) {
          base[nh] = a.shared;
          scale[nh] = a.shared_gate ? sigmoid_dev(__ldcg(a.shared_gate + tok)) : 1.0f;
        }
      }
    }
    __syncthreads();
    n_hot = n_hot_s;
  }
  const int n_r = n_hot * a.ff;
  const int n = n_r + (a.shared ? a.shared_ff : 0);
  const StageLayout L = stage_layout(n);
  const bool i8r = a.i8 && rows::int8_path_type(a.type);
  const bool i8s = a.shared && a.i8 && rows::int8_path_type(a.shared_type);
  // The float path's 16-sums are read by K-quant rows only.
  const bool sums = (!i8r && rows::int8_path_type(a.type)) || (a.shared && !i8s && rows::int8_path_type(a.shared_type));
  const Group g = whole_block();
  if constexpr (!kSlotMap) {
    stage_x<2>(a.g + tok * a.g_ts, n_r, smem, smem + L.s16, nullptr, 0.0f, sums, g);
  } else {
    for (int j = 0; j < n_hot; ++j)  // each input at column j * ff (ff % 64 == 0: the layouts line up)
      stage_x<2>(a.g + tok * a.g_ts + static_cast<size_t>(src[j]) * a.ff, a.ff, smem + rows::xpad(j * a.ff),
                 smem + L.s16 + j * a.ff / 16, nullptr, 0.0f, sums, g);
  }
  if (a.shared) stage_x<2>(a.gs + tok * a.gs_ts, a.shared_ff, smem + rows::xpad(n_r), smem + L.s16 + n_r / 16, nullptr, 0.0f, sums, g);
  if (i8r || i8s) {
    __syncthreads();
    stage_int8(smem, L, n, g);
  }
  __syncthreads();
  const rows::XStage X = stage_view(smem, L);
  const int warp = t >> 5, lane = t & 31;
  for (int row = blockIdx.x * kRowsPerBlock + warp; row < a.d; row += gridDim.x * kRowsPerBlock) {
    // The residual's old value is read before the row's weights, so its L2 round trip overlaps theirs.
    const float x_old = lane == 0 ? __ldcg(a.x + tok * a.x_ts + row) : 0.0f;
    float acc = slots_dot(a.type, i8r, base, scale, n_hot, static_cast<size_t>(row) * a.row_bytes, a.ff, X, lane);
    if (a.shared)
      acc += slots_dot(a.shared_type, i8s, base + n_hot, scale + n_hot, 1, static_cast<size_t>(row) * a.shared_row_bytes,
                       a.shared_ff, shifted(X, n_r), lane);
    acc = warp_sum(acc);
    if (lane == 0) a.x[tok * a.x_ts + row] = x_old + acc;
  }
}

// The kernel's shared-memory opt-in for the widest staged input (once).
void allow_down_sum_smem() {
  static const bool done = [] {
    const size_t smem = stage_layout(kMaxCols).total * sizeof(float);
    allow_dynamic_smem(down_sum_kernel<false, false>, smem, "cudaFuncSetAttribute(down_sum)");
    allow_dynamic_smem(down_sum_kernel<true, false>, smem, "cudaFuncSetAttribute(down_sum)");
    allow_dynamic_smem(down_sum_kernel<false, true>, smem, "cudaFuncSetAttribute(down_sum)");
    allow_dynamic_smem(down_sum_kernel<true, true>, smem, "cudaFuncSetAttribute(down_sum)");
    return true;
  }();
  (void)done;
}

}  // namespace
}  // namespace mv

bool gemv_down_sum_fits(const GemvDownSum& a) {
  if (!a.down || !a.ids || !a.weights || !a.g || !a.x || a.k < 1) return false;
  const DevMatrix& w = *a.down;
  if (!supported_type(w.type) || w.expert_stride == 0 || w.n_cols % 64 != 0) return false;
  if (w.n_cols % type_traits(w.type).block_elems != 0) return false;
  int64_t n = static_cast<int64_t>(a.k) * w.n_cols;
  if (a.shared) {
    const DevMatrix& s = *a.shared;
    if (!a.gs || !supported_type(s.type) || s.n_rows != w.n_rows || s.expert_stride != 0) return false;
    if (s.n_cols % type_traits(s.type).block_elems != 0) return false;
    n += s.n_cols;
  }
  const bool k_quant = rows::int8_path_type(w.type) || (a.shared && rows::int8_path_type(a.shared->type));
  // With a slot map the staged width is n_hot * ff + shared_ff for the step's resident count n_hot: the
  // int8 staging's last pass takes whole warps (128 values) only if every such width is a multiple of 128.
  if (k_quant && a.slot_of_expert && (w.n_cols % 128 != 0 || (a.shared && a.shared->n_cols % 128 != 0))) return false;
  return a.k + (a.shared ? 1 : 0) <= mv::kMaxDownSlots && n <= mv::kMaxCols && (!k_quant || n % 256 == 0);
}

// Resident token-grid down-sum blocks per SM for this shared-memory size (with a slot map or without).
static int down_sum_tokens_resident(size_t smem, bool slot_map) {
  const void* kernel = slot_map ? reinterpret_cast<const void*>(mv::down_sum_kernel<true, true>)
                                : reinterpret_cast<const void*>(mv::down_sum_kernel<false, true>);
  return std::max(1, resident_blocks(kernel, mv::kThreads, smem));
}

void gemv_down_sum(const GemvDownSum& a, cudaStream_t s) {
  using namespace mv;
  check_arg(gemv_down_sum_fits(a), "gemv_down_sum: unsupported shape (see gemv_down_sum_fits)");
  check_arg(a.n_tokens >= 1 && a.n_tokens <= kMaxGemvTokens, "gemv_down_sum: 1..kMaxGemvTokens tokens");
  const DevMatrix& w = *a.down;
  DownSumArgs d{};
  d.stack = w.data, d.row_bytes = w.row_bytes, d.stride = w.expert_stride, d.type = w.type;
  d.ff = static_cast<int>(w.n_cols);
  d.ids = a.ids, d.slot_of = a.slot_of_expert, d.weights = a.weights, d.k = a.k, d.g = a.g;
  if (a.shared) {
    d.shared = a.shared->data, d.shared_row_bytes = a.shared->row_bytes, d.shared_type = a.shared->type;
    d.shared_ff = static_cast<int>(a.shared->n_cols);
    d.gs = a.gs, d.shared_gate = a.shared_gate;
  }
  d.x = a.x;
  d.g_ts = a.g_token_stride, d.gs_ts = a.gs_token_stride, d.x_ts = a.x_token_stride;
  d.d = static_cast<int>(w.n_rows);
  d.i8 = gemv_math() == GemvMath::Int8;
  allow_down_sum_smem();
  const int n = d.k * d.ff + (a.shared ? d.shared_ff : 0);
  const size_t smem = static_cast<size_t>(stage_layout(n).total) * sizeof(float);
  const int grid = (d.d + kRowsPerBlock - 1) / kRowsPerBlock;
  if (a.n_tokens > 1) {
    const dim3 g(token_grid_blocks(grid, sm_count() * down_sum_tokens_resident(smem, d.slot_of), a.n_tokens),
                 a.n_tokens);
    if (d.slot_of)
      launch_pdl("gemv_down_sum", down_sum_kernel<true, true>, g, dim3(kThreads), smem, s, d);
    else
      launch_pdl("gemv_down_sum", down_sum_kernel<false, true>, g, dim3(kThreads), smem, s, d);
  } else if (d.slot_of) {
    launch_pdl("gemv_down_sum", down_sum_kernel<true, false>, dim3(grid), dim3(kThreads), smem, s, d);
  } else {
    launch_pdl("gemv_down_sum", down_sum_kernel<false, false>, dim3(grid), dim3(kThreads), smem, s, d);
  }
}

}  // namespace strata::cuda
