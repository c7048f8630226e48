// The start-up decision of a GPU backend (run/chat/serve --gpu): from the GPU's memory, the model's
// footprint, --gpu-mem / --expert-budget and the routing profile's hotness, the VRAM receipt and
// where every routed expert lives. When every expert fits the expert budget the session is all-GPU;
// otherwise it is hybrid, with the optimal placement (plan_placement) as its expert slot map. The
// prefill's fp16 weight cache comes last: kept only by an all-GPU plan with room for it under the limit
// after every expert, and listed on the receipt either way.
// Pure over plain numbers (the GPU's total/free are inputs), so it is tested without a GPU
// (tests/test_backend_cli.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/engine/routing_counts.h"
#include "strata/moe/placement.h"
#include "strata/moe/vram_budget.h"

namespace strata {

struct ModelConfig;

struct GpuPlanRequest {
  uint64_t gpu_total = 0, gpu_free = 0;            // device 0, read after the CUDA context exists
  std::optional<uint64_t> gpu_mem;                 // --gpu-mem
  std::optional<ExpertBudgetSpec> expert_budget;   // --expert-budget (default: what is left)
  uint64_t workspace_bytes = 0;                    // estimate_gpu_workspace_bytes()
  const RoutingCounts* hotness = nullptr;          // profile counts; nullptr or no tokens: uniform
  std::string hotness_source;                      // for the summary line, e.g. "profile p.json (1200 tokens)"
  // The prefill would use fp16 copies of the dense matrices (fast numerics): keep them if they fit
  // (footprint.prefill_f16_cache_bytes). false: no such cache, no receipt line.
  bool prefill_f16_cache = false;
  // What the batched GPU prefill lacks for this model (gpu_prefill_unsupported_feature), or "": prompts
  // then run token by token through the decode step, with no cache, and the receipt says so.
  std::string prefill_unsupported;
  // --expert-cache N: cache slots per MoE layer (moe/expert_cache.h), carved out of the expert budget
  // of a hybrid plan (an all-GPU plan has nothing to cache); expert_cache_policy names the policy on
  // the receipt.
  int expert_cache_slots = 0;
  std::string expert_cache_policy = "lfu";
  // Streaming prefill (cuda/hybrid_stream.h; false: --no-op-offload, or no batched prefill): a hybrid
  // plan keeps kStreamBuffers buffers of its largest layer's cold experts for prompt chunks. They are
  // set aside before placement when the expert budget is "what is left", and fit after the budget or
  // are dropped (receipt note) when --expert-budget is given.
  bool prefill_stream = false;
};

constexpr int kStreamBuffers = 2;
// Rows of logits the GPU prefill computes at a time (all-position logits and per-token picks of a pass).
constexpr int kPrefillLogitRows = 512;

// kStreamBuffers x the largest layer's cold expert bytes (expert_bytes [layer][expert], slot_of -1 = cold;
// slot_of empty: every expert cold).
uint64_t stream_buffer_bytes(const std::vector<std::vector<uint64_t>>& expert_bytes,
                             const std::vector<std::vector<int>>& slot_of);

struct GpuExpertPlan {
  VramReceipt receipt;
  bool hybrid = false;  // false: every routed expert is resident on the GPU
  ExpertPlan plan;      // the placement (every expert hot when !hybrid)
  // GpuSessionOptions::expert_slots: [layer][expert] -> slot, -1 = cold; empty when !hybrid.
  std::vector<std::vector<int>> expert_slots;
  bool prefill_f16_cache = false;  // keep the prefill's fp16 weight cache (receipt.prefill_cache bytes)
  uint64_t prefill_stream_bytes = 0;  // the streaming prefill's buffers (receipt.prefill_stream; 0: off)
  // The expert cache: slots per layer beyond the pinned experts (expert_cache_slots_per_layer of the
  // request's count and this placement; empty without a cache) and their bytes (receipt.cache_slots).
  std::vector<int> cache_slots;
  int expert_cache_request = 0;  // what the request asked for, per layer (GpuSessionOptions::expert_cache_slots)
  std::string hotness_source;      // where the placement's hotness came from ("uniform (no profile)", ...)
  std::string text;     // the receipt with the plan, and one line naming the mode (for stderr)
};

// Fails (strata::Error, from require_core_fits) with the receipt and a hint when the core does not fit
// the limit or an explicit expert budget exceeds what is available.
GpuExpertPlan plan_gpu_experts(const ModelFootprint& footprint, int n_expert_used, const GpuPlanRequest& request);

// GPU activations and scratch a session needs beyond weights, KV cache and recurrent state: the
// decode step's vectors (and the multi-token decode step's, up to kMaxGemvTokens of them) and attention scores for
// ctx positions, the batched prefill's buffers for
// prefill_chunk tokens (hidden states, attention and DeltaNet projections, router scores, the chosen
// experts' intermediates, one row of logits per token), the decode lookahead's second copy of the
// DeltaNet state and the pending-token snapshot (a third), plus a fixed 64 MiB for cuBLAS workspaces, CUDA graphs and small counters. An estimate from the shapes, not a measurement: the safety reserve
// (default_safety_reserve) absorbs the difference.
// With slots sequences sharing one model, each has its own decode workspaces and state copies; the
// prefill's are shared.
uint64_t estimate_gpu_workspace_bytes(const ModelConfig& c, int ctx, int prefill_chunk, int slots = 1);

}  // namespace strata
