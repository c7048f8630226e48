// Speculative sampling's acceptance rule (Leviathan et al. and Chen et al., 2023): a drafted token x,
// drawn by a drafter from q, is kept with probability min(1, p(x) / q(x)); when it is not, the token is
// drawn from norm(max(p - q, 0)). Whatever q is, the token that comes out is distributed exactly as p,
// the target's own sampling distribution, so speculation does not change what is sampled. Greedy
// decoding is the case p one-hot: the draft is kept exactly when it is the arg-max.
#pragma once

#include <cstdint>

#include "strata/sample/sampler.h"

namespace strata {

struct DraftVerdict {
  bool accepted = false;
  int32_t token = -1;  // x when accepted, else the replacement drawn from the residual
};

// One drafted position. q == nullptr: the drafter is deterministic (q one-hot at x). Draws from the
// sampler's seeded stream only when the outcome is random (0 < p(x) / q(x) < 1, or a residual with more
// than one token). `residual` is scratch. Fails when q gives x no probability (a drafter bug).
DraftVerdict verify_draft(Sampler& sampler, const TokenDistribution& p, int32_t x, const TokenDistribution* q,
                          TokenDistribution& residual);

// Whether draft x is kept: with probability min(1, p(x) / q(x)) (q == nullptr: one-hot at x), drawing
// from the sampler's stream only when that is strictly between 0 and 1. verify_draft's rule without
// the replacement draw, for a token-tree node whose next sibling is tried on the residual instead.
// Fails when q gives x no probability (a drafter bug).
bool draft_kept(Sampler& sampler, const TokenDistribution& p, int32_t x, const TokenDistribution* q);

// norm(max(p - q, 0)) over p's support into `out` (q == nullptr: one-hot at x). When p <= q everywhere
// (p == q up to rounding; a rejection then has probability zero) `out` is p itself.
void residual_distribution(const TokenDistribution& p, int32_t x, const TokenDistribution* q, TokenDistribution& out);

}  // namespace strata
