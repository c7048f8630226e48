// Host entry of the GPU sampler's top-k / top-p cut (sample_select.cu), used by sample_token.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda::samp {

struct SelectState;

// One stage of the cut on st->keep (first_stage: starting from every finite logit): top-k (by_mass
// false) or top-p (by_mass true). Leaves the new set in st->keep. inv_t and shift as sample_token.
void select_cut(const float* logits, int64_t n, const int* argmax, double inv_t, int shift, SelectState* st, int* ties,
                bool first_stage, bool by_mass, int top_k, double top_p, cudaStream_t s);

// No cut: st->keep = every finite logit.
void keep_all(SelectState* st, cudaStream_t s);

}  // namespace strata::cuda::samp
