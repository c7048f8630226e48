// The GPU sampler (sample_kernels.h): one kernel sums the probability mass of fixed chunks of ids, a
// second (one block) finds the chunk where the running mass passes u * total and the id inside it.
#include "strata/cuda/sample_kernels.h"

#include <cuda_runtime.h>

#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/device_math.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;                    // consecutive ids per thread
constexpr int kChunk = kThreads * kPerThread;    // ids per chunk (one block of the mass kernel)

// The host Sampler's probability of a logit (0 for a non-finite one or below min-p).
__device__ __forceinline__ double token_prob(float l, float mx, double inv_t, double min_p) {
  if (!isfinite(l)) return 0.0;
  const double p = exp((static_cast<double>(l) - static_cast<double>(mx)) * inv_t);
  return p >= min_p ? p : 0.0;
}

// Mass of thread t's kPerThread ids of chunk c, summed in id order.
__device__ __forceinline__ double thread_mass(const float* logits, int64_t n, int64_t c, float mx, double inv_t,
                                              double min_p) {
  const int64_t i0 = c * kChunk + static_cast<int64_t>(threadIdx.x) * kPerThread;
  double acc = 0.0;
  for (int j = 0; j < kPerThread; ++j)
    if (i0 + j < n) acc += token_prob(logits[i0 + j], mx, inv_t, min_p);
  return acc;
}

// Block-wide exclusive prefix of v in thread order (double), and the block total.
__device__ double exclusive_prefix(double v, double& total) {
  __shared__ double warp_tot[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) {
    if (w < warp) before += warp_tot[w];
    all += warp_tot[w];
  }
  total = all;
  return before + incl - v;
}

__global__ void __launch_bounds__(kThreads) chunk_mass_kernel(const float* logits, int64_t n, const int* argmax,
                                                              double inv_t, double min_p, double* partial) {
  pdl_enter();
  const float mx = logits[*argmax];
  double total;
  exclusive_prefix(thread_mass(logits, n, blockIdx.x, mx, inv_t, min_p), total);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kThreads) draw_kernel(const float* logits, int64_t n, const int* argmax, double inv_t,
                                                        double min_p, const double* partial, int n_chunks, double u,
                                                        int* out) {
  pdl_enter();
  __shared__ int chunk;
  __shared__ double before_chunk, target;
  const float mx = logits[*argmax];
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int c = 0; c < n_chunks; ++c) total += partial[c];
    target = u * total;
    chunk = -1;
    double acc = 0.0;
    int last = -1;
    for (int c = 0; c < n_chunks; ++c) {
      if (partial[c] > 0.0) last = c;
      if (chunk < 0 && partial[c] > 0.0 && target < acc + partial[c]) {
        chunk = c;
        before_chunk = acc;
      }
      if (chunk < 0) acc += partial[c];
    }
    if (chunk < 0 && last >= 0) {  // u * total landed on the rounding slack at the end: the last chunk
      chunk = last;
      before_chunk = acc - partial[last];
    }
    if (last < 0 || !isfinite(mx)) *out = -1;  // nothing to draw
  }
  __syncthreads();
  if (chunk < 0 || !isfinite(mx)) return;
  const double mine = thread_mass(logits, n, chunk, mx, inv_t, min_p);
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
      const double p = token_prob(logits[i0 + j], mx, inv_t, min_p);
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
        if (token_prob(logits[i], mx, inv_t, min_p) > 0.0) {
          pick = static_cast<int>(i);
          break;
        }
    }
    *out = pick;
  }
}

}  // namespace

int sample_partials(int64_t n) { return static_cast<int>((n + kChunk - 1) / kChunk); }

void sample_temperature(const float* logits, int64_t n, const int* argmax, double inv_temperature, double min_p,
                        double u, double* partial, int* out, cudaStream_t s) {
  check_arg(n >= 1 && inv_temperature > 0 && u >= 0 && u < 1, "sample_temperature: n >= 1, 1/T > 0, u in [0, 1)");
  const int chunks = sample_partials(n);
  launch_pdl("sample chunk mass", chunk_mass_kernel, dim3(chunks), dim3(kThreads), 0, s, logits, n, argmax,
             inv_temperature, min_p, partial);
  launch_pdl("sample draw", draw_kernel, dim3(1), dim3(kThreads), 0, s, logits, n, argmax, inv_temperature, min_p,
             static_cast<const double*>(partial), chunks, u, out);
}

}  // namespace strata::cuda
