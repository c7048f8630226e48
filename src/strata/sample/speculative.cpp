#include "strata/sample/speculative.h"

#include "strata/base/error.h"

namespace strata {

void residual_distribution(const TokenDistribution& p, int32_t x, const TokenDistribution* q, TokenDistribution& out) {
  out.ids.clear();
  out.weights.clear();
  out.total = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const int32_t id = p.ids[i];
    const double qi = q ? q->prob(id) : (id == x ? 1.0 : 0.0);
    const double w = p.weights[i] / p.total - qi;
    if (w <= 0) continue;
    out.ids.push_back(id);
    out.weights.push_back(w);
    out.total += w;
  }
  if (out.ids.empty()) out = p;
}

bool draft_kept(Sampler& sampler, const TokenDistribution& p, int32_t x, const TokenDistribution* q) {
  const double qx = q ? q->prob(x) : 1.0;
  if (!(qx > 0)) fail("speculative decoding: the drafter proposed token ", x, " which its own distribution gives no probability");
  const double ratio = p.prob(x) / qx;
  return ratio >= 1 || (ratio > 0 && sampler.draw_uniform() < ratio);
}

DraftVerdict verify_draft(Sampler& sampler, const TokenDistribution& p, int32_t x, const TokenDistribution* q,
                          TokenDistribution& residual) {
  if (draft_kept(sampler, p, x, q)) return {true, x};
  residual_distribution(p, x, q, residual);
  return {false, sampler.draw(residual)};
}

}  // namespace strata
