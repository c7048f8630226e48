#include "strata/engine/routing_counts.h"

#include <algorithm>

#include "strata/base/error.h"

namespace strata {

void RoutingCounts::reset(int layers, int experts) {
  if (layers < 0 || experts < 0) fail("routing counts: invalid shape ", layers, " layers x ", experts, " experts");
  n_layer = layers;
  n_expert = experts;
  n_tokens = 0;
  counts.assign(static_cast<size_t>(layers) * static_cast<size_t>(experts), 0);
}

void RoutingCounts::add(int layer, int expert, uint64_t n) {
  if (layer < 0 || layer >= n_layer || expert < 0 || expert >= n_expert)
    fail("routing counts: (layer ", layer, ", expert ", expert, ") outside the table of ", n_layer, " x ", n_expert);
  counts[static_cast<size_t>(layer) * n_expert + expert] += n;
}

uint64_t RoutingCounts::at(int layer, int expert) const {
  if (layer < 0 || layer >= n_layer || expert < 0 || expert >= n_expert)
    fail("routing counts: (layer ", layer, ", expert ", expert, ") outside the table of ", n_layer, " x ", n_expert);
  return counts[static_cast<size_t>(layer) * n_expert + expert];
}

uint64_t RoutingCounts::layer_total(int layer) const {
  uint64_t s = 0;
  for (int e = 0; e < n_expert; ++e) s += at(layer, e);
  return s;
}

void RoutingCounts::merge(const RoutingCounts& other) {
  if (counts.empty() && n_layer == 0 && n_expert == 0) {
    *this = other;
    return;
  }
  if (other.n_layer != n_layer || other.n_expert != n_expert)
    fail("routing counts: cannot merge a ", other.n_layer, " x ", other.n_expert, " table into a ", n_layer, " x ",
         n_expert, " one");
  n_tokens += other.n_tokens;
  std::transform(counts.begin(), counts.end(), other.counts.begin(), counts.begin(),
                 [](uint64_t a, uint64_t b) { return a + b; });
}

}  // namespace strata
