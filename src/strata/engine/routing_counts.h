// Routing statistics: how often each (layer, expert) was chosen, and over how many tokens.
// hotness(l, e) = counts[l][e] / n_tokens is the expected number of picks of expert e in layer l per
// token (the sum over a layer is top_k). Filled by the CPU engine (Session::set_routing_counts) and by
// the GPU backends from device counters; read by placement (moe/placement.h) and profiles
// (moe/routing_profile.h).
//
// Not thread-safe: a session counts into its own instance; merge() combines instances afterwards.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

struct RoutingCounts {
  int n_layer = 0, n_expert = 0;
  uint64_t n_tokens = 0;          // tokens forwarded while counting
  std::vector<uint64_t> counts;   // [layer * n_expert + expert]: times chosen

  // Zeroes everything and sizes the table (fails on negative sizes).
  void reset(int n_layer, int n_expert);
  // Counts n picks of `expert` in `layer` (fails on an index out of range).
  void add(int layer, int expert, uint64_t n = 1);
  uint64_t at(int layer, int expert) const;
  // Sum of the layer's counts (picks in that layer).
  uint64_t layer_total(int layer) const;
  // Adds another table's counts and tokens; fails when the shapes differ. An empty (never reset)
  // table takes the other's shape.
  void merge(const RoutingCounts& other);
  bool empty() const { return counts.empty(); }
};

}  // namespace strata
