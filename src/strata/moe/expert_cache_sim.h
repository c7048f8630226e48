// An offline model of hybrid mode's VRAM expert cache (expert_cache.h) on a routing trace: what a policy,
// a cache size and a copy budget would catch, with the delays the GPU side has. A step's picks reach the
// policy observe_delay boundaries after the step (the session learns from a counter snapshot of a
// finished step, and the decode lookahead has launched the next step by then), and a copy started at a
// boundary is mapped copy_delay boundaries later (it runs beside the next step, then waits for a
// boundary). The pinned experts come from the first part of the trace (each layer's most-picked, as a
// routing profile would choose them) and the cache is measured on the rest, so neither the static set
// nor the cache is judged on the tokens it was made from. strata routing-stats --cache-sim prints a grid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/engine/routing_trace.h"
#include "strata/moe/expert_cache.h"

namespace strata {

struct CacheSimConfig {
  double residency = 0.5;  // share of each layer's experts pinned (0..1)
  double calibrate = 0.5;  // share of the trace's tokens that choose the pinned experts (0..1, exclusive)
  int slots_per_layer = 0;  // cache slots per layer beyond the pinned ones (0: no cache)
  ExpertCachePolicy policy = ExpertCachePolicy::Lfu;
  int copy_experts = 8;    // experts whose copies may start at one boundary
  int observe_delay = 2;   // boundaries between a step and the policy seeing its picks (>= 1: the next)
  int copy_delay = 1;      // boundaries between a copy's start and its mapping (>= 1)
  double lfu_half_life = ExpertCacheConfig{}.lfu_half_life;  // the policy's knobs (expert_cache.h)
  double admit_margin = ExpertCacheConfig{}.admit_margin;
};

struct CacheSimResult {
  uint64_t tokens = 0;       // measured tokens (after the calibration part)
  uint64_t picks = 0;        // their picks over every layer
  uint64_t pinned_hits = 0;  // picks of a pinned expert
  uint64_t cache_hits = 0;   // picks of an expert mapped in a cache slot
  uint64_t misses = 0;       // picks computed on the CPU
  uint64_t copies = 0, evictions = 0;
  double miss_rate() const { return picks ? static_cast<double>(misses) / static_cast<double>(picks) : 0.0; }
  double cache_hit_rate() const {  // of the picks the pinned experts miss
    const uint64_t n = cache_hits + misses;
    return n ? static_cast<double>(cache_hits) / static_cast<double>(n) : 0.0;
  }
};

// Runs the trace's streams one after another (the cache kept across them, as a server's would be).
// Fails on a trace too short to leave tokens on both sides of the calibration split, or a config out of
// range.
CacheSimResult simulate_expert_cache(const RoutingTrace& trace, const CacheSimConfig& config);

// The grid routing-stats --cache-sim prints: residency 25/50/75% x cache slots 0/8/16/32 per layer x
// LRU / LFU, at base's copy budget and delays.
std::string format_cache_sim_grid(const RoutingTrace& trace, const CacheSimConfig& base);

}  // namespace strata
