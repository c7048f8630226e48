// What a routing trace says about caching experts (strata routing-stats): static coverage (how much a
// fixed hot set catches), reuse distance, LRU hit rates per cache size and distinct experts per window,
// each averaged over layers: the figures published measurements of real models report, so a generated
// or replayed routing can be compared with them.
#pragma once

#include <string>
#include <vector>

#include "strata/engine/routing_trace.h"

namespace strata {

struct RoutingStats {
  int n_layer = 0, n_expert = 0, k = 0;
  uint64_t tokens = 0;
  size_t streams = 0;
  std::string source, fingerprint;
  // Static coverage: per layer, the share of picks on the most-picked pct% of its experts (ranked by
  // the trace's own counts), averaged over layers. {percent, share}.
  std::vector<std::pair<double, double>> coverage;
  // Reuse distance (within a stream): the share of picks whose expert this layer last picked d or
  // fewer tokens before; first picks in a stream never count as reused. {d, share}.
  std::vector<std::pair<int, double>> reuse_within;
  double reuse_median = 0;  // median distance over all picks, first picks counted as infinite (-1: > half first)
  // LRU: per layer a cache of `slots` experts (the trace's streams one after another, the cache kept
  // across them as a server's would be); a pick hits when its expert is among the `slots` distinct
  // experts picked most recently before this token. {slots, hit rate}, also by percent of experts.
  std::vector<std::pair<int, double>> lru_slots;
  std::vector<std::pair<double, double>> lru_percent;  // {percent of n_expert, hit rate}
  // Distinct experts per layer in whole windows of w tokens (within a stream). {w, mean distinct}.
  std::vector<std::pair<int, double>> distinct;
};

// Computes everything above for the trace (fails on a trace without tokens).
RoutingStats routing_stats(const RoutingTrace& trace);

std::string format_routing_stats(const RoutingStats& s);
std::string routing_stats_json(const RoutingStats& s);

// Looks a statistic up by its key (e.g. coverage 40 -> share); fails when it is not in the report.
double stat_coverage(const RoutingStats& s, double percent);
double stat_reuse_within(const RoutingStats& s, int d);
double stat_lru_percent(const RoutingStats& s, double percent);

}  // namespace strata
