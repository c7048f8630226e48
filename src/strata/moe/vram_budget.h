// The VRAM budget: how many bytes of GPU memory are left for routed experts once the core (everything
// that must live on the GPU) is placed, printed as a receipt at start-up. Pure functions over plain
// numbers (tests/test_vram_budget.cpp); model_footprint() derives the model-side numbers from a Model.
//
//   limit     = --gpu-mem, else the GPU's free memory
//   available = limit - safety reserve - core weights - KV cache - recurrent state - workspaces
//               - prefill fp16 cache (when the plan keeps it: moe/gpu_expert_plan.h)
//   budget    = --expert-budget (bytes, or percent of all expert bytes), else min(available, all experts);
//               the expert cache's slots (--expert-cache) are carved out of it, the pinned experts get the rest
//
// Typical use (a backend's start-up):
//   ModelFootprint fp = model_footprint(model, ctx, slots);
//   VramInputs in{.gpu_total = total, .gpu_free = free, .gpu_mem = ..., .expert_budget = ...,
//                 .workspace_bytes = ws, .model = fp};
//   VramReceipt r = compute_vram_receipt(in);
//   require_core_fits(r);                                // throws with the receipt and a hint
//   ExpertPlan plan = plan_placement(placement_input(fp, profile_counts_or_null, n_expert_used, r.expert_budget));
//   std::fputs(format_receipt(r, &plan).c_str(), stderr);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/model/kv_type.h"

namespace strata {

class Model;
struct ExpertPlan;

// "24G", "24GiB", "24GB", "512M", "1.5G", "4096", "4096B": an optional K/M/G/T suffix in binary units
// (1024^n) with or without "B"/"iB", case-insensitive, no sign. Fails naming `what` and the text.
uint64_t parse_size(const std::string& text, const char* what = "size");

// --expert-budget: "60%" (percent of all routed-expert bytes, 0..100) or a size as parse_size reads it.
struct ExpertBudgetSpec {
  bool is_percent = false;
  double percent = 0.0;  // when is_percent
  uint64_t bytes = 0;    // otherwise
  std::string text;      // as given (for the receipt)
};
ExpertBudgetSpec parse_expert_budget(const std::string& text);

// What a model needs on the GPU, from its tensors and hyper-parameters.
struct ModelFootprint {
  uint64_t core_weight_bytes = 0;   // every tensor that is not a routed expert (embeddings, attention,
                                    // DeltaNet, norms, routers, shared experts, output head)
  uint64_t all_expert_bytes = 0;    // every routed expert
  std::vector<std::vector<uint64_t>> expert_bytes;  // [layer][expert]: gate + up + down bytes; empty row: none
  // K and V x slots: ctx positions per full-attention layer, its ring (at most ctx) per sliding one.
  uint64_t kv_cache_bytes = 0;
  uint64_t kv_bytes_per_token = 0;     // K + V of one token over every full-attention layer
  KvCacheTypes kv_types;               // how the cache stores them
  uint64_t recurrent_state_bytes = 0;  // DeltaNet conv window + recurrent state x slots
  // The GPU prefill's half copies of the dense projections (attention, DeltaNet and shared-expert
  // matrices: 2 bytes per weight), kept only when the plan can afford them (cuda/prefill.h).
  uint64_t prefill_f16_cache_bytes = 0;
  int ctx = 0, slots = 0;
};

// kv_types: the cache's storage types (kv_type.h), which set its bytes per token.
ModelFootprint model_footprint(const Model& model, int ctx, int slots, KvCacheTypes kv_types = {});

// The placement problem for a model: its per-expert sizes, hotness from `counts` (nullptr or no
// tokens counted: uniform, the "no profile" case) and the budget. Feed it to plan_placement().
struct PlacementInput;
struct RoutingCounts;
PlacementInput placement_input(const ModelFootprint& footprint, const RoutingCounts* counts, int n_expert_used,
                               uint64_t budget_bytes);

struct VramInputs {
  uint64_t gpu_total = 0;                         // cudaMemGetInfo total
  uint64_t gpu_free = 0;                          // cudaMemGetInfo free, after the CUDA context exists
  std::optional<uint64_t> gpu_mem;                // --gpu-mem: all strata may use
  std::optional<ExpertBudgetSpec> expert_budget;  // --expert-budget
  std::optional<uint64_t> reserve;                // default: default_safety_reserve(limit)
  uint64_t workspace_bytes = 0;                   // the backend's activations and scratch buffers
  uint64_t cache_slot_bytes = 0;                  // the expert cache's slots, part of the expert budget (0: none)
  std::string cache_note;                         // the receipt's note on that line (slots, policy)
  uint64_t prefill_cache_bytes = 0;               // the prefill's fp16 weight cache, when kept (0: not kept)
  std::string prefill_cache_note;                 // the receipt's note on that line (why kept or dropped)
  uint64_t prefill_stream_bytes = 0;              // the streaming prefill's buffers (0: none)
  std::string prefill_stream_note;
  ModelFootprint model;
};

// max(512 MiB, 2% of the limit), at most the limit. Why: cudaMemGetInfo is read before cuBLAS handles,
// graph instantiation and the allocator's rounding (2 MiB granules per allocation) take their share,
// and the driver may need headroom; 512 MiB covers these on one GPU, 2% keeps a proportional margin on
// large cards without wasting whole expert stacks (all the workspaces we know of are counted apart).
uint64_t default_safety_reserve(uint64_t limit);

struct VramReceipt {
  uint64_t gpu_total = 0, gpu_free = 0;
  uint64_t limit = 0;
  std::string limit_source;  // "GPU free memory" or "--gpu-mem 24G"
  bool limit_available = true;  // false: --gpu-mem asks for more than is free
  uint64_t reserve = 0;
  std::string reserve_source;
  uint64_t core_weights = 0, kv_cache = 0, recurrent_state = 0, workspaces = 0;
  uint64_t cache_slots = 0;             // of the expert budget: the expert cache (--expert-cache)
  std::string cache_note;
  uint64_t prefill_cache = 0;           // the prefill's fp16 weight cache (0: dropped or not used)
  std::string prefill_cache_note;
  uint64_t prefill_stream = 0;          // the streaming prefill's buffers (0: dropped or not used)
  std::string prefill_stream_note;
  uint64_t kv_bytes_per_token = 0;
  KvCacheTypes kv_types;
  int ctx = 0, slots = 0;
  uint64_t core_total = 0;              // reserve + core weights + KV + state + workspaces + prefill cache
                                        // + prefill stream buffers
  int64_t available_for_experts = 0;    // limit - core_total (negative: the core does not fit)
  uint64_t all_expert_bytes = 0;
  std::vector<std::vector<uint64_t>> expert_bytes;  // [layer][expert], copied from the footprint
  uint64_t expert_budget = 0;           // what placement may use (0 when the core does not fit)
  std::string budget_source;            // "--expert-budget 60%" or "what is left"
  bool core_fits = false;
  bool budget_fits = true;              // false: an explicit --expert-budget exceeds what is available
};

// Fails (strata::Error) only on nonsense input: --gpu-mem above the GPU's total, a percentage outside
// 0..100, a free value above the total.
VramReceipt compute_vram_receipt(const VramInputs& in);

// The receipt as a table; with a plan, also hot/cold counts and bytes per layer (runs of identical
// layers summarised as "0-39").
std::string format_receipt(const VramReceipt& r, const ExpertPlan* plan);

// Throws strata::Error with the receipt and a hint when --gpu-mem is more than is free, when the core
// does not fit ("lower --ctx / use a smaller quant / raise --gpu-mem"), or when an explicit
// --expert-budget exceeds what is available.
void require_core_fits(const VramReceipt& r);

// "1.50 GiB", "512.0 MiB", "12.0 KiB", "100 B".
std::string format_binary_size(uint64_t bytes);

}  // namespace strata
