// Sampling the next token on the GPU (issue 7: "argmax/sampling on the GPU"), so a sampled decode step
// copies one token id instead of the logits. Covers temperature with min-p (no top-k / top-p, no
// penalties or logit bias: those stay on the host Sampler).
//
// The distribution is the host Sampler's (strata/sample/sampler.h): over ids < n with a finite logit,
// p_i = exp((l_i - l_max) / T) in double, min-p dropping p_i < min_p (the best token has p = 1), drawn
// with a uniform u in [0, 1) that the host Sampler supplies from its seeded stream, walking ids in
// ascending order until the running mass passes u * total. Sums are in double in a fixed order, so a
// seed reproduces a GPU run; their order is not the host's, so a draw that lands within rounding of a
// boundary between two tokens may pick the other one (a difference near 1e-16 of the mass).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

// Scratch for sample_temperature: sample_partials(n) doubles in partial.
int sample_partials(int64_t n);

// *out = the drawn id, or -1 when no id < n has a finite logit. argmax: a device int holding the index
// of the largest logit among ids < n (argmax_wide's output). Launches two kernels on s.
void sample_temperature(const float* logits, int64_t n, const int* argmax, double inv_temperature, double min_p,
                        double u, double* partial, int* out, cudaStream_t s);

}  // namespace strata::cuda
