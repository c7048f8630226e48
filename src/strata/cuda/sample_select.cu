// The top-k / top-p cut of the GPU sampler (sample_kernels.h): the best-first prefix of the candidates
// (larger logit, then lower id) that top-k (a count) or top-p (a share of the mass) keeps, found without
// sorting. Four radix passes over the 32-bit order keys, 8 bits each from the top, narrow the cut to one
// key: every block histograms its ids' digits (count and fixed-point mass) among the keys that match
// the bits found so far, and the last block to finish walks the 256 digits best-first to the one where
// the running count or mass reaches what is still needed. The tokens with exactly that key (equal
// logits) are then taken by ascending id, as the host's sort does. Masses are integers (probability x
// 2^shift), so the histograms are exact whatever order the atomics land in.
#include <cuda_runtime.h>

#include <climits>

#include "strata/cuda/decode_pdl.cuh"
#include "strata/cuda/sample_common.cuh"
#include "strata/cuda/sample_select.h"

namespace strata::cuda::samp {
namespace {

__device__ __forceinline__ unsigned long long fixed_mass(double p, int shift) {
  return static_cast<unsigned long long>(llrint(ldexp(p, shift)));
}

// Starts a stage: no key bits found yet; reset_keep (the first stage of a draw) also keeps every token.
__global__ void stage_begin_kernel(SelectState* st, int reset_keep) {
  pdl_enter();
  st->prefix = 0;
  st->mask = 0;
  st->cut = 1;
  if (reset_keep) st->keep = Keep{0u, INT_MAX};
}

// Radix pass `pass` (0..3) of a stage: by_mass picks the cut by top_p of the mass, else by the count
// top_k.
__global__ void __launch_bounds__(kThreads) radix_pass_kernel(const float* logits, int64_t n, const int* argmax,
                                                              double inv_t, int shift, SelectState* st, int pass,
                                                              int by_mass, int top_k, double top_p) {
  pdl_enter();
  if (__ldcg(&st->cut) == 0) return;  // uniform: an earlier pass found nothing to cut
  __shared__ unsigned int cnt[256];
  __shared__ unsigned long long mass[256];
  cnt[threadIdx.x] = 0;
  mass[threadIdx.x] = 0;
  __syncthreads();
  const Keep keep{__ldcg(&st->keep.key), __ldcg(&st->keep.id)};
  const unsigned int prefix = __ldcg(&st->prefix), mask = __ldcg(&st->mask);
  const float mx = max_logit(logits, argmax);
  const int sh = 24 - 8 * pass;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kChunk + static_cast<int64_t>(threadIdx.x) * kPerThread;
  for (int j = 0; j < kPerThread && i0 + j < n; ++j) {
    const float l = logits[i0 + j];
    if (!kept(keep, l, i0 + j)) continue;
    const unsigned int key = logit_key(l);
    if ((key & mask) != prefix) continue;
    const unsigned int d = (key >> sh) & 0xffu;
    atomicAdd(&cnt[d], 1u);
    if (by_mass) atomicAdd(&mass[d], fixed_mass(token_prob(l, mx, inv_t), shift));
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (cnt[t]) {
    atomicAdd(&st->hist_count[t], cnt[t]);
    if (by_mass) atomicAdd(&st->hist_mass[t], mass[t]);
  }
  if (!last_block_of(&st->counter)) return;
  cnt[t] = __ldcg(&st->hist_count[t]);
  mass[t] = __ldcg(&st->hist_mass[t]);
  st->hist_count[t] = 0;
  st->hist_mass[t] = 0;
  __syncthreads();
  if (t != 0) return;
  if (pass == 0) {  // what the stage must take, from the whole set's totals
    unsigned long long all_count = 0, all_mass = 0;
    for (int d = 0; d < 256; ++d) {
      all_count += cnt[d];
      all_mass += mass[d];
    }
    if (by_mass) {
      st->need_mass = top_p * static_cast<double>(all_mass);
    } else if (static_cast<unsigned long long>(top_k) >= all_count) {
      st->cut = 0;  // top-k keeps every candidate
      return;
    } else {
      st->need_count = static_cast<unsigned int>(top_k);
    }
  }
  // Digits best first (255 down): the first whose running total reaches what is needed holds the cut
  // (the lowest digit with tokens when rounding leaves the mass just short of it).
  int lowest = 0;
  while (lowest < 255 && cnt[lowest] == 0) ++lowest;
  unsigned long long above_count = 0, above_mass = 0;
  int d = lowest;
  for (int e = 255; e > lowest; --e) {
    if (cnt[e] == 0) continue;
    const bool reached = by_mass ? static_cast<double>(above_mass + mass[e]) >= st->need_mass
                                 : above_count + cnt[e] >= st->need_count;
    if (reached) {
      d = e;
      break;
    }
    above_count += cnt[e];
    above_mass += mass[e];
  }
  if (by_mass) {
    st->need_mass -= static_cast<double>(above_mass);
  } else {
    st->need_count -= static_cast<unsigned int>(above_count);
  }
  st->prefix = prefix | (static_cast<unsigned int>(d) << sh);
  st->mask = mask | (0xffu << sh);
}

// After the four passes the cut's key is st->prefix: the stage takes the tokens above it and, of those
// with exactly that key, the first r by id (r from the count or the mass still needed). Every block counts
// its chunk's ties; the last finds the chunk and the id of the r-th.
__global__ void __launch_bounds__(kThreads) tie_kernel(const float* logits, int64_t n, const int* argmax, double inv_t,
                                                       int shift, SelectState* st, int by_mass, int* ties) {
  pdl_enter();
  if (__ldcg(&st->cut) == 0) return;
  const Keep keep{__ldcg(&st->keep.key), __ldcg(&st->keep.id)};
  const unsigned int K = __ldcg(&st->prefix);
  auto my_ties = [&](int64_t chunk) {
    const int64_t i0 = chunk * kChunk + static_cast<int64_t>(threadIdx.x) * kPerThread;
    int c = 0;
    for (int j = 0; j < kPerThread && i0 + j < n; ++j) {
      const float l = logits[i0 + j];
      c += kept(keep, l, i0 + j) && logit_key(l) == K;
    }
    return c;
  };
  int total;
  exclusive_prefix(my_ties(blockIdx.x), total);
  if (threadIdx.x == 0) ties[blockIdx.x] = total;
  if (!last_block_of(&st->counter)) return;
  __shared__ int r_need, chunk, r_in;
  if (threadIdx.x == 0) {
    long long r;
    if (by_mass) {
      const float mx = max_logit(logits, argmax);
      const double pk = static_cast<double>(fixed_mass(token_prob(order_key_float(K), mx, inv_t), shift));
      r = pk > 0 ? static_cast<long long>(ceil(st->need_mass / pk)) : 1;
    } else {
      r = st->need_count;
    }
    r_need = static_cast<int>(r < 1 ? 1 : r);
    chunk = -1;
  }
  __syncthreads();
  // The chunk holding the r-th tie (chunks <= kThreads: one per thread).
  const int v = threadIdx.x < gridDim.x ? __ldcg(ties + threadIdx.x) : 0;
  int all;
  const int before = exclusive_prefix(v, all);
  if (v > 0 && before < r_need && r_need <= before + v) {
    chunk = threadIdx.x;
    r_in = r_need - before;
  }
  __syncthreads();
  if (chunk < 0) {  // fewer ties than needed (rounding of the mass): keep all of them the set still holds
    if (threadIdx.x == 0) st->keep = Keep{K, keep.key == K ? keep.id : INT_MAX};
    return;
  }
  const int mine = my_ties(chunk);
  const int b2 = exclusive_prefix(mine, all);
  if (mine > 0 && b2 < r_in && r_in <= b2 + mine) {
    const int64_t i0 = static_cast<int64_t>(chunk) * kChunk + static_cast<int64_t>(threadIdx.x) * kPerThread;
    int seen = b2;
    for (int j = 0; j < kPerThread && i0 + j < n; ++j) {
      const float l = logits[i0 + j];
      if (kept(keep, l, i0 + j) && logit_key(l) == K && ++seen == r_in) {
        st->keep = Keep{K, static_cast<int>(i0 + j)};
        break;
      }
    }
  }
}

}  // namespace

void select_cut(const float* logits, int64_t n, const int* argmax, double inv_t, int shift, SelectState* st, int* ties,
                bool first_stage, bool by_mass, int top_k, double top_p, cudaStream_t s) {
  const int chunks = static_cast<int>((n + kChunk - 1) / kChunk);
  launch_pdl("sample stage", stage_begin_kernel, dim3(1), dim3(1), 0, s, st, first_stage ? 1 : 0);
  for (int pass = 0; pass < 4; ++pass)
    launch_pdl("sample radix pass", radix_pass_kernel, dim3(chunks), dim3(kThreads), 0, s, logits, n, argmax, inv_t,
               shift, st, pass, by_mass ? 1 : 0, top_k, top_p);
  launch_pdl("sample ties", tie_kernel, dim3(chunks), dim3(kThreads), 0, s, logits, n, argmax, inv_t, shift, st,
             by_mass ? 1 : 0, ties);
}

void keep_all(SelectState* st, cudaStream_t s) {
  launch_pdl("sample stage", stage_begin_kernel, dim3(1), dim3(1), 0, s, st, 1);
}

}  // namespace strata::cuda::samp
