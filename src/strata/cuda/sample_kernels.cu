// The GPU sampler's draw (sample_kernels.h): after the top-k / top-p cut (sample_select.cu) one kernel
// sums the kept probability mass of fixed chunks of ids, a second (one block) finds the chunk where the
// running mass passes u * total and the id inside it.
#include "strata/cuda/sample_kernels.h"

#include <cuda_runtime.h>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/sample_common.cuh"
#include "strata/cuda/sample_select.h"

namespace strata::cuda {
namespace samp {
namespace {

// The probability the draw gives a token: 0 outside the kept set or below min-p.
__device__ __forceinline__ double draw_prob(const Keep& keep, float l, int64_t id, float mx, double inv_t, double min_p) {
  if (!kept(keep, l, id)) return 0.0;
  const double p = token_prob(l, mx, inv_t);
  return p >= min_p ? p : 0.0;
}

// Mass of thread t's kPerThread ids of chunk c, summed in id order.
__device__ __forceinline__ double thread_mass(const float* logits, int64_t n, int64_t c, const Keep& keep, float mx,
                                              double inv_t, double min_p) {
  const int64_t i0 = c * kChunk + static_cast<int64_t>(threadIdx.x) * kPerThread;
  double acc = 0.0;
  for (int j = 0; j < kPerThread; ++j)
    if (i0 + j < n) acc += draw_prob(keep, logits[i0 + j], i0 + j, mx, inv_t, min_p);
  return acc;
}

__device__ __forceinline__ Keep read_keep(const SelectState* st) { return Keep{__ldcg(&st->keep.key), __ldcg(&st->keep.id)}; }

__global__ void __launch_bounds__(kThreads) chunk_mass_kernel(const float* logits, int64_t n, const int* argmax,
                                                              const SelectState* st, double inv_t, double min_p,
                                                              double* partial) {
  pdl_enter();
  const float mx = max_logit(logits, argmax);
  double total;
  exclusive_prefix(thread_mass(logits, n, blockIdx.x, read_keep(st), mx, inv_t, min_p), total);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads) draw_kernel(const float* logits, int64_t n, const int* argmax,
                                                        const SelectState* st, double inv_t, double min_p,
                                                        const double* partial, int n_chunks, double u, int* out) {
  pdl_enter();
  __shared__ int chunk;
  __shared__ double before_chunk, target;
  const float mx = max_logit(logits, argmax);
  const Keep keep = read_keep(st);
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int c = 0; c < n_chunks; ++c) total += __ldcg(partial + c);
    target = u * total;
    chunk = -1;
    double acc = 0.0;
    int last = -1;
    for (int c = 0; c < n_chunks; ++c) {
      const double pc = __ldcg(partial + c);
      if (pc > 0.0) last = c;
      if (chunk < 0 && pc > 0.0 && target < acc + pc) {
        chunk = c;
        before_chunk = acc;
      }
      if (chunk < 0) acc += pc;
    }
    if (chunk < 0 && last >= 0) {  // u * total landed on the rounding slack at the end: the last chunk
      chunk = last;
      before_chunk = acc - __ldcg(partial + last);
    }
    if (last < 0 || !isfinite(mx)) *out = -1;  // nothing to draw
  }
  __syncthreads();
  if (chunk < 0 || !isfinite(mx)) return;
  const double mine = thread_mass(logits, n, chunk, keep, mx, inv_t, min_p);
  double chunk_total;
  const double start = before_chunk + exclusive_prefix(mine, chunk_total);
  __shared__ int pick;
  if (threadIdx.x == 0) pick = 0x7fffffff;
  __syncthreads();
  // The thread whose ids hold the crossing walks them (ids in ascending order, like the host's draw).
  const int64_t i0 = static_cast<int64_t>(chunk) * kChunk + static_cast<int64_t>(threadIdx.x) * kPerThread;
  if (mine > 0.0 && target < start + mine) {
    double acc = start;
    int found = -1, last_id = -1;
    for (int j = 0; j < kPerThread && i0 + j < n; ++j) {
      const double p = draw_prob(keep, logits[i0 + j], i0 + j, mx, inv_t, min_p);
      if (p == 0.0) continue;
      acc += p;
      last_id = static_cast<int>(i0 + j);
      if (target < acc) {
        found = last_id;
        break;
      }
    }
    // Walked one by one the sum can round below start + mine: then the crossing is this thread's last id.
    atomicMin(&pick, found >= 0 ? found : last_id);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (pick == 0x7fffffff) {  // rounding slack inside the chunk: its last token with mass
      for (int64_t i = min(n, static_cast<int64_t>(chunk + 1) * kChunk) - 1; i >= static_cast<int64_t>(chunk) * kChunk; --i)
        if (draw_prob(keep, logits[i], i, mx, inv_t, min_p) > 0.0) {
          pick = static_cast<int>(i);
          break;
        }
    }
    *out = pick;
  }
}

int chunks_of(int64_t n) { return static_cast<int>((n + kChunk - 1) / kChunk); }

}  // namespace
}  // namespace samp

int64_t sample_max_ids() { return int64_t{samp::kChunk} * samp::kMaxChunks; }

size_t sample_scratch_bytes(int64_t n) {
  const int chunks = samp::chunks_of(n);
  const samp::ScratchLayout l = samp::scratch_layout(nullptr, chunks);
  return reinterpret_cast<size_t>(l.ties) + sizeof(int) * static_cast<size_t>(chunks);
}

void sample_token(const float* logits, int64_t n, const int* argmax, const GpuSampling& p, double u, void* scratch,
                  int* out, cudaStream_t s) {
  using namespace samp;
  check_arg(n >= 1 && n <= sample_max_ids(), "sample_token: 1 <= n <= 2^19 ids");
  check_arg(p.inv_temperature > 0 && u >= 0 && u < 1, "sample_token: 1/T > 0 and u in [0, 1)");
  check_arg(p.top_k >= 0 && p.top_p > 0 && p.top_p <= 1 && p.min_p >= 0 && p.min_p <= 1,
            "sample_token: top_k >= 0, top_p in (0, 1], min_p in [0, 1]");
  const int chunks = chunks_of(n);
  const ScratchLayout l = scratch_layout(scratch, chunks);
  // Fixed-point masses: n probabilities of at most 1, each x 2^shift, sum below 2^62.
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  const int shift = 62 - bits;
  const bool top_k = p.top_k > 0, top_p = p.top_p < 1.0;
  if (top_k) select_cut(logits, n, argmax, p.inv_temperature, shift, l.st, l.ties, true, false, p.top_k, 1.0, s);
  if (top_p) select_cut(logits, n, argmax, p.inv_temperature, shift, l.st, l.ties, !top_k, true, 0, p.top_p, s);
  if (!top_k && !top_p) keep_all(l.st, s);
  launch_pdl("sample chunk mass", chunk_mass_kernel, dim3(chunks), dim3(kThreads), 0, s, logits, n, argmax,
             static_cast<const SelectState*>(l.st), p.inv_temperature, p.min_p, l.partial);
  launch_pdl("sample draw", draw_kernel, dim3(1), dim3(kThreads), 0, s, logits, n, argmax,
             static_cast<const SelectState*>(l.st), p.inv_temperature, p.min_p, static_cast<const double*>(l.partial),
             chunks, u, out);
}

}  // namespace strata::cuda
