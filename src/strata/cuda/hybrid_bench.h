// `strata bench --gpu` in a hybrid plan (issue 8): the placement the factory's plan made (the same
// plan run and serve make: cli/backend_cli.h), and the numbers printed beside its decode speed --
// cold-hit rate, CPU and wait time per token, and the floor max(GPU bytes / HBM bandwidth, cold bytes /
// host DRAM bandwidth).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/cuda/gpu_session.h"
#include "strata/cuda/hybrid_types.h"
#include "strata/engine/bench_floor.h"
#include "strata/moe/gpu_expert_plan.h"

namespace strata::cuda {

struct HybridBenchPlan {
  std::string budget_text;       // the receipt's budget source ("--expert-budget 50%", "what is left")
  std::string hotness_source;    // "profile FILE (N tokens)" or "uniform (no profile)"
  uint64_t budget_bytes = 0, hot_bytes = 0, all_expert_bytes = 0;
  int hot_experts = 0, all_experts = 0;
  double expected_cold_hit = 0.0;  // from the hotness the plan was made with
  double bytes_per_expert = 0.0;   // mean gate+up+down bytes of one routed expert
};

// The summary of a GPU plan's placement (plan.hybrid or not).
HybridBenchPlan hybrid_bench_plan(const GpuExpertPlan& plan, int n_expert_used);

struct HybridBenchNumbers {
  HybridTelemetry telemetry;
  double tokens = 0;                 // telemetry.tokens (every token through the MoE: prefill + decode)
  double cold_picks_per_token = 0, hot_picks_per_token = 0;
  double cpu_ms_per_token = 0, wait_ms_per_token = 0;
  double gpu_bytes_per_token = 0;    // dense + embedding row + lm_head + hot expert reads
  double cold_bytes_per_token = 0;   // cold expert reads (host DRAM)
  double gpu_gbs = 0, cpu_gbs = 0;   // measured bandwidths
  double floor_tps = 0;              // 1 / max(gpu_bytes / gpu_gbs, cold_bytes / cpu_gbs)
};

HybridBenchNumbers hybrid_bench_numbers(const HybridTelemetry& t, const HybridBenchPlan& plan, const ActiveBytes& active,
                                        double gpu_gbs, double cpu_gbs);

// Lines for the table output (each ends in '\n').
std::string format_hybrid_bench(const HybridBenchPlan& plan, const HybridBenchNumbers& n);

// Per-token breakdown of plain decode steps (no prompt tokens mixed in): the wall time of n_tokens
// single-token forwards after a short prompt, and the hybrid counters over just those steps.
struct HybridDecodeBreakdown {
  int tokens = 0;
  double wall_ms_per_token = 0;
  double gpu_ms_per_token = 0;   // wall - GPU wait for the CPU (the GPU's own work plus launch gaps)
  double wait_ms_per_token = 0;  // combine kernels waiting for cold rows
  double cpu_ms_per_token = 0;   // CPU workers computing cold rows (overlaps the GPU's hot work)
  double answer_ms_per_token = 0;  // from each doorbell to the GPU seeing the answer (cold work + hand-off)
  double cold_picks_per_token = 0;
  double cold_hit_rate = 0;
  std::vector<double> cold_picks_per_layer;  // per token
};
HybridDecodeBreakdown measure_hybrid_decode(GpuSession& session, int n_prompt, int n_tokens, uint64_t seed);
std::string format_hybrid_decode(const HybridDecodeBreakdown& b);

}  // namespace strata::cuda
