// Expert placement: which routed experts live in VRAM ("hot") and which are computed on the CPU from
// the mapped GGUF ("cold"), given a byte budget for experts. Pure functions over plain data, so they
// are tested without a GPU (tests/test_placement.cpp).
//
// The plan feeds the GPU backend directly: ExpertPlan::slot_of is the [layer][expert] -> slot map of
// GpuSessionOptions::expert_slots (slots 0..n_hot-1 in ascending expert id, -1 = cold).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/engine/routing_counts.h"

namespace strata {

struct PlacementInput {
  // [layer][expert]: bytes the expert occupies on the GPU (its gate + up + down slices). A layer
  // without routed experts has an empty row. Every expert of a layer with experts must be > 0 bytes.
  std::vector<std::vector<uint64_t>> expert_bytes;
  // [layer][expert]: expected picks per token (counts / n_tokens), >= 0; one row per layer, the same
  // length as the expert_bytes row (a layer without experts may have any row: it is ignored).
  // Use hotness_from_counts() or uniform_hotness() to build it.
  std::vector<std::vector<double>> hotness;
  uint64_t budget_bytes = 0;  // VRAM for expert stacks
};

struct ExpertPlan {
  int n_layer = 0;
  int n_expert = 0;                      // the largest expert count of any layer
  std::vector<std::vector<int>> slot_of; // [layer][expert] -> slot in the layer's GPU stack, -1 = cold
  std::vector<int> n_hot;                // [layer]: hot experts
  uint64_t bytes_used = 0;               // sum of the hot experts' bytes (<= budget)
  // With the input's hotness: expected cold picks per token, and bytes of cold experts read per token
  // (sum over cold (l, e) of hotness * bytes) -- the quantity plan_placement minimises.
  double expected_cold_picks_per_token = 0.0;
  double expected_cold_bytes_per_token = 0.0;

  bool is_hot(int layer, int expert) const { return slot_of[layer][expert] >= 0; }
  int n_hot_total() const;
  int n_expert_total() const;  // experts over all layers
};

// Hotness from counts: counts / n_tokens per (layer, expert), [n_layer][n_expert]. With no tokens
// counted, uniform (n_expert_used / n_expert each) -- the "no profile" case. (A hotness row for a layer
// whose expert_bytes row is empty is ignored by the placement functions.)
std::vector<std::vector<double>> hotness_from_counts(const RoutingCounts& counts, int n_expert_used);
// Every expert of every layer equally hot (n_expert_used / n_expert picks per token).
std::vector<std::vector<double>> uniform_hotness(const std::vector<std::vector<uint64_t>>& expert_bytes,
                                                 int n_expert_used);

// The optimal plan: minimises expected cold bytes per token (equivalently maximises sum of
// hotness * bytes over hot experts) under the budget. Deterministic: ties prefer the lower layer, then
// the lower expert id. Exact for any number of distinct expert sizes up to a work limit (see the .cpp);
// beyond it, greedy by hotness with a documented bound. Fails on an inconsistent input.
// With uniform hotness (no profile) every plan that fills the budget is equally good in expectation;
// the tie rule then fills whole layers from layer 0 up, which lets those layers skip the CPU entirely.
ExpertPlan plan_placement(const PlacementInput& in);

// Baseline without statistics: the same number c of experts (ids 0..c-1) in every layer that has
// experts, c as large as the budget allows; leftover budget then gives one more expert to layers in
// ascending order while it fits (so the baseline uses as much VRAM as the others). Ignores hotness
// except to report expected cold picks/bytes.
ExpertPlan uniform_placement(const PlacementInput& in);

// Baseline of llama.cpp's --n-cpu-moe N ("keep the MoE weights of the first N layers in the CPU"):
// whole layers' experts on the GPU, the rest entirely on the CPU. LastLayersOnGpu (the llama.cpp
// behaviour) fills from the last layer downwards; FirstLayersOnGpu from layer 0 upwards. Stops at the
// first layer that does not fit (layers stay contiguous, as with --n-cpu-moe).
enum class LayerFillOrder { LastLayersOnGpu, FirstLayersOnGpu };
ExpertPlan by_layer_placement(const PlacementInput& in, LayerFillOrder order = LayerFillOrder::LastLayersOnGpu);

// Fraction of the expert picks in `counts` that the plan would serve from the CPU (cold picks / all
// picks), over all layers; 0 when counts has no picks. Fails when the shapes differ.
double cold_hit_rate(const ExpertPlan& plan, const RoutingCounts& counts);
// The same per layer ([layer]); a layer with no picks (or no experts) reports 0.
std::vector<double> cold_hit_rate_per_layer(const ExpertPlan& plan, const RoutingCounts& counts);

// The hot experts of one layer's slot-map row: fails (naming `layer`, the expert and the slot) unless the
// hot ones take slots 0, 1, ... in ascending expert id and every other entry is -1.
int hot_slot_count(const std::vector<int>& row, size_t layer);

// Sum of every expert's bytes in the input (the 100% budget).
uint64_t total_expert_bytes(const std::vector<std::vector<uint64_t>>& expert_bytes);

}  // namespace strata
