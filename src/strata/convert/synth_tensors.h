// The tensors of a synthetic model: names, shapes and roles as in llama.cpp's GGUF files (the same
// contract `strata convert` follows), and how each row's random values are drawn so activations stay
// O(1): matrices uniform with standard deviation 1/sqrt(row length), norm weights near 1 (the stored,
// multiplier form for both architectures), DeltaNet decay ssm_a negative, dt bias small, router rows
// optionally scaled per expert (Zipf skew) so routing is not uniform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/convert/hf_config.h"
#include "strata/convert/tensor_plan.h"

namespace strata::convert {

enum class SynthInit {
  Matrix,    // uniform, std = scale / sqrt(ne[0])
  NormOne,   // 1 + uniform(-0.1, 0.1)
  Embedding, // uniform, std 1
  SsmA,      // -(uniform in [1, 16]), as -exp(A_log) with A_log = log(uniform(1, 16))
  SsmDtBias, // softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1]
  Router,    // Matrix, times the expert's skew scale (row = expert)
};

struct SynthTensor {
  PlannedTensor meta;  // name, ne, role, layer (row_source unused)
  SynthInit init = SynthInit::Matrix;
  std::vector<float> row_scale;  // Router: one scale per expert (row); empty = all 1
};

// Zipf skew: expert e of a layer gets scale 1 / rank_e^s, ranks a random permutation (seeded by
// (seed, layer)) of 1..n_expert. s = 0 gives all ones.
std::vector<float> zipf_expert_scales(int n_expert, double s, uint64_t seed, int layer);

// The Zipf exponent that makes random router rows route like a real model statically: on random
// hidden states, the hottest 40% of experts take about 70% of picks (Qwen3-30B-A3B's held-out figure).
// Found by bisection over a fixed-seed simulation of top-k over scaled Gaussian logits, so it depends
// only on (n_expert, k). Temporal reuse is a property of real hidden states that random weights do
// not have.
double realistic_skew_exponent(int n_expert, int k);

// Every tensor of the model in file order.
std::vector<SynthTensor> plan_synth_tensors(const HfConfig& cfg, double skew, uint64_t seed);

// Writes row `row` (ne[0] floats) of `t` into dst.
void synth_row(const SynthTensor& t, uint64_t seed, int64_t row, float* dst);

}  // namespace strata::convert
