// Sampling the next token on the GPU (issue 7: "argmax/sampling on the GPU"), so a sampled decode step
// copies one token id instead of the logits. Covers temperature, top-k, top-p and min-p (penalties and
// logit bias stay on the host Sampler).
//
// The distribution is the host Sampler's (strata/sample/sampler.h): over ids < n with a finite logit,
// candidates ordered by larger logit then lower id; top-k keeps the k best; top-p the smallest best-first
// prefix whose mass p_i = exp((l_i - l_max) / T) reaches top_p of the (top-k) candidates' mass; min-p
// drops p_i < min_p (the best token has p = 1); the draw takes a uniform u in [0, 1) that the host Sampler
// supplies from its seeded stream and walks the kept ids in ascending order until the running mass
// passes u * total. The top-k / top-p cut is found without sorting (sample_select.cu): a radix select
// over the logits' order keys, with masses summed in 2^-shift fixed point (exact and order-free), then
// the ties at the cut taken by ascending id. The draw's sums are in double in a fixed order, so a seed
// reproduces a GPU run; their order is not the host's, so a draw or a cut that lands within rounding of
// a boundary between two tokens may fall on the other one (a difference near 1e-12 of the mass).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

struct GpuSampling {
  double inv_temperature = 1.0;  // 1 / T, > 0
  int top_k = 0;                 // 0: off
  double top_p = 1.0;            // in (0, 1]; 1: off
  double min_p = 0.0;            // in [0, 1]; 0: off
};

// Device scratch of sample_token for n ids: sample_scratch_bytes(n) bytes, zeroed once when allocated
// (every call leaves it ready for the next); one per stream.
size_t sample_scratch_bytes(int64_t n);
int64_t sample_max_ids();  // 2^19

// *out = the drawn id, or -1 when no id < n has a finite logit. argmax: a device int holding the index
// of the largest finite logit among ids < n (argmax_wide's output with finite_only; -1 when none).
// n <= sample_max_ids(). Launches 3, 9 or 15 small kernels (no cut, one of top-k / top-p, both).
void sample_token(const float* logits, int64_t n, const int* argmax, const GpuSampling& p, double u, void* scratch,
                  int* out, cudaStream_t s);

}  // namespace strata::cuda
