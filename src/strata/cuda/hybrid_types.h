// Plain data of the hybrid hot/cold expert execution (issue 8) that the session's public header
// exposes: the telemetry counters. No CUDA types.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cuda {

// Counters since construction (or the last reset), over every token the hybrid MoE has run.
struct HybridTelemetry {
  int cpu_threads = 0;
  uint64_t tokens = 0;                  // token passes through the first MoE layer
  uint64_t picks = 0;                   // routed picks in total (tokens x MoE layers x k)
  uint64_t cold_picks = 0;              // of those, computed on the CPU
  std::vector<uint64_t> cold_picks_per_layer;
  // [layer * n_expert + expert]: times the router picked the expert (hot or cold), for routing
  // statistics / profiles in hybrid sessions (the all-GPU step counts its own).
  std::vector<uint64_t> expert_picks;
  uint64_t cpu_jobs = 0;                // layer passes that had cold picks (the others never reach the CPU;
                                        // a multi-token step's tokens are one pass)
  double cpu_cold_ms = 0.0;             // CPU wall time computing cold experts, summed over jobs (a
                                        // dropped decode lookahead step's work included)
  double gpu_wait_ms = 0.0;             // time the GPU's combine kernels spent waiting for the CPU
  double answer_ms = 0.0;               // decode jobs: from each doorbell to the GPU seeing the CPU's answer,
                                        // summed (the cold work plus the hand-off both ways; a dropped
                                        // decode lookahead step's jobs included)
  // The VRAM expert cache (GpuSessionOptions::expert_cache_slots; all zero without one). A cold pick is a
  // cache miss then.
  int cache_slots = 0;                  // cache slots over all layers
  const char* cache_policy = "";        // "lru" / "lfu"
  double cache_admit_margin = 0.0;      // lfu: ExpertCacheConfig::admit_margin
  uint64_t cache_hits = 0;              // picks served from cache slots
  std::vector<uint64_t> cache_hits_per_layer;
  uint64_t cache_copies = 0;            // experts copied into cache slots (started)
  uint64_t cache_copy_bytes = 0;        // their bytes, host to GPU
  uint64_t cache_evictions = 0;         // cached experts displaced by a copy
  // Streaming prefill (hybrid_stream.h): prompt chunks whose cold experts were copied to the GPU, the
  // (chunk, layer) passes that did, the experts and bytes copied; stream_note: "on: ..." or "off: why"
  // ("" when not asked for).
  uint64_t stream_chunks = 0, stream_layers = 0, stream_experts = 0, stream_bytes = 0;
  std::string stream_note;
  double cold_hit_rate() const { return picks ? static_cast<double>(cold_picks) / static_cast<double>(picks) : 0.0; }
  // Cache hits among the picks the pinned experts did not serve (hits + misses).
  double cache_hit_rate() const {
    const uint64_t n = cache_hits + cold_picks;
    return n ? static_cast<double>(cache_hits) / static_cast<double>(n) : 0.0;
  }
};

}  // namespace strata::cuda
