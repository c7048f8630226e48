#include "strata/moe/gpu_expert_plan.h"

#include <algorithm>
#include <cstdio>

#include "strata/base/error.h"
#include "strata/model/config.h"
#include "strata/moe/expert_cache.h"

namespace strata {

GpuExpertPlan plan_gpu_experts(const ModelFootprint& footprint, int n_expert_used, const GpuPlanRequest& request) {
  VramInputs in;
  in.gpu_total = request.gpu_total;
  in.gpu_free = request.gpu_free;
  in.gpu_mem = request.gpu_mem;
  in.expert_budget = request.expert_budget;
  in.workspace_bytes = request.workspace_bytes;
  in.model = footprint;
  GpuExpertPlan out;
  if (request.expert_cache_slots < 0) fail("--expert-cache must be >= 0, got ", request.expert_cache_slots);
  bool fits = false;
  // The receipt, placement and cache for `in` as it stands (run again when the stream buffers change).
  auto place_experts = [&] {
    out = GpuExpertPlan{};
    in.cache_slot_bytes = 0;
    in.cache_note.clear();
    out.receipt = compute_vram_receipt(in);
    fits = out.receipt.core_fits && out.receipt.budget_fits && out.receipt.limit_available;
    if (fits) {
      // Bytes of `slots` cache slots per layer: a slot holds the layer's largest expert.
      auto slot_bytes = [&footprint](const std::vector<int>& slots) {
        uint64_t b = 0;
        for (size_t l = 0; l < slots.size(); ++l)
          if (!footprint.expert_bytes[l].empty())
            b += static_cast<uint64_t>(slots[l]) *
                 *std::max_element(footprint.expert_bytes[l].begin(), footprint.expert_bytes[l].end());
        return b;
      };
      // The cache's slots come out of the budget first; a budget that holds every expert needs no cache.
      uint64_t cache_bytes = 0;
      const bool cache = request.expert_cache_slots > 0 && out.receipt.expert_budget < out.receipt.all_expert_bytes;
      if (cache) {
        cache_bytes = slot_bytes(std::vector<int>(footprint.expert_bytes.size(), request.expert_cache_slots));
        if (cache_bytes > out.receipt.expert_budget)
          fail("--expert-cache ", request.expert_cache_slots, " needs ", format_binary_size(cache_bytes),
               " of the expert budget, which has ", format_binary_size(out.receipt.expert_budget),
               "\nhint: lower --expert-cache or raise --expert-budget / --gpu-mem");
      }
      // A layer gets no more slots than it has cold experts (a placement may keep whole layers hot): the
      // bytes such layers leave unused go back to the pinned experts, pass by pass, keeping only plans
      // whose slots fit what was set aside for them.
      auto place = [&](uint64_t reserved) {
        return plan_placement(
            placement_input(footprint, request.hotness, n_expert_used, out.receipt.expert_budget - reserved));
      };
      out.plan = place(cache_bytes);
      if (cache) {
        out.cache_slots = expert_cache_slots_per_layer(out.plan.slot_of, request.expert_cache_slots);
        for (int pass = 0; pass < 8; ++pass) {
          const uint64_t used = slot_bytes(out.cache_slots);
          if (used >= cache_bytes) break;
          cache_bytes = used;
          ExpertPlan more = place(cache_bytes);
          std::vector<int> slots = expert_cache_slots_per_layer(more.slot_of, request.expert_cache_slots);
          if (slot_bytes(slots) > cache_bytes) break;  // keep the last plan that fits
          out.plan = std::move(more);
          out.cache_slots = std::move(slots);
        }
      }
      // Hybrid only when some expert stays on the CPU: a budget that holds every expert is the all-GPU session.
      out.hybrid = out.plan.n_hot_total() < out.plan.n_expert_total();
      if (out.hybrid) out.expert_slots = out.plan.slot_of;
      if (out.hybrid && cache) {
        out.expert_cache_request = request.expert_cache_slots;
        in.cache_slot_bytes = slot_bytes(out.cache_slots);
        in.cache_note =
            cat("--expert-cache ", request.expert_cache_slots, " slots/layer, ", request.expert_cache_policy);
        out.receipt = compute_vram_receipt(in);
      } else {
        out.cache_slots.clear();
      }
    }
  };
  place_experts();
  if (fits && out.hybrid) {
    if (!request.prefill_stream) {
      in.prefill_stream_note = "off: prompts compute cold experts on the CPU";
      out.receipt = compute_vram_receipt(in);
    } else if (!request.expert_budget) {
      // The budget is what is left: set the buffers aside first (at most every expert of the largest
      // layer), then once more at what the placement needs, keeping that plan if its buffers still fit.
      const uint64_t most = stream_buffer_bytes(footprint.expert_bytes, {});
      const GpuExpertPlan without = out;
      const VramInputs without_in = in;
      // The placement with the buffers set aside; false when it fails (an --expert-cache that no longer
      // fits the smaller budget) or no longer leaves the session hybrid.
      auto place_with = [&](uint64_t bytes) {
        in.prefill_stream_bytes = bytes;
        in.prefill_stream_note = cat(kStreamBuffers, " buffers of the largest layer's cold experts");
        try {
          place_experts();
        } catch (const Error&) {
          return false;
        }
        return fits && out.hybrid;
      };
      if (out.receipt.available_for_experts >= static_cast<int64_t>(most) && place_with(most)) {
        const uint64_t need = stream_buffer_bytes(footprint.expert_bytes, out.expert_slots);
        if (need < most) {
          GpuExpertPlan first = out;
          const VramInputs first_in = in;
          if (!(place_with(need) && stream_buffer_bytes(footprint.expert_bytes, out.expert_slots) <= need)) {
            out = std::move(first);
            in = first_in;
            fits = true;
          }
        }
      } else {
        out = without;
        in = without_in;
        fits = true;
        in.prefill_stream_note = "dropped: no room (prompts compute cold experts on the CPU)";
        out.receipt = compute_vram_receipt(in);
      }
    } else {
      const uint64_t need = stream_buffer_bytes(footprint.expert_bytes, out.expert_slots);
      const int64_t left = out.receipt.available_for_experts - static_cast<int64_t>(out.receipt.expert_budget);
      if (left >= static_cast<int64_t>(need)) {
        in.prefill_stream_bytes = need;
        in.prefill_stream_note = cat(kStreamBuffers, " buffers of the largest layer's cold experts");
      } else {
        in.prefill_stream_note = "dropped: no room after the expert budget (prompts compute cold experts on the CPU)";
      }
      out.receipt = compute_vram_receipt(in);
    }
    out.prefill_stream_bytes = in.prefill_stream_bytes;
  }
  if (!request.prefill_unsupported.empty()) {
    in.prefill_cache_note = cat("none: prompts run token by token (not in the batched prefill: ",
                                request.prefill_unsupported, ")");
    out.receipt = compute_vram_receipt(in);
  } else if (request.prefill_f16_cache && fits) {
    // Experts before the cache: a GB of resident experts saves reads on every token, the cache only
    // the weight decode of each prompt chunk.
    const uint64_t need = footprint.prefill_f16_cache_bytes;
    const int64_t after_experts =
        out.receipt.available_for_experts - static_cast<int64_t>(out.receipt.all_expert_bytes);
    if (out.hybrid) {
      in.prefill_cache_note = "dropped: experts need the room (prompts decode weights per chunk)";
    } else if (after_experts >= static_cast<int64_t>(need)) {
      out.prefill_f16_cache = true;
      in.prefill_cache_bytes = need;
      in.prefill_cache_note = "fp16 dense weights for prompts";
    } else {
      in.prefill_cache_note = "dropped: no room after every expert (prompts decode weights per chunk)";
    }
    out.receipt = compute_vram_receipt(in);  // the same budget and placement, with the cache's line
  }
  out.text = format_receipt(out.receipt, fits ? &out.plan : nullptr);
  require_core_fits(out.receipt);  // throws with the receipt and a hint
  out.hotness_source = request.hotness_source.empty() ? "uniform (no profile)" : request.hotness_source;
  const std::string& source = out.hotness_source;
  if (out.hybrid) {
    int slots = 0;
    for (int n : out.cache_slots) slots += n;
    out.text += cat("mode: hybrid, ", out.plan.n_hot_total(), " of ", out.plan.n_expert_total(),
                    " experts on the GPU, the rest on the CPU; placement from ", source, "\n");
    if (slots > 0)
      out.text += cat("expert cache: ", slots, " slots over the layers (", request.expert_cache_policy,
                      "), filled while serving from the experts the CPU computed\n");
  } else {
    if (request.expert_cache_slots > 0) out.text += "expert cache: none (every expert fits the expert budget)\n";
    out.text += "mode: all-GPU (every routed expert fits the expert budget)\n";
  }
  return out;
}

uint64_t stream_buffer_bytes(const std::vector<std::vector<uint64_t>>& expert_bytes,
                             const std::vector<std::vector<int>>& slot_of) {
  uint64_t largest = 0;
  for (size_t l = 0; l < expert_bytes.size() && (slot_of.empty() || l < slot_of.size()); ++l) {
    uint64_t b = 0;
    for (size_t e = 0; e < expert_bytes[l].size(); ++e)
      if (slot_of.empty() || (e < slot_of[l].size() && slot_of[l][e] < 0)) b += expert_bytes[l][e];
    largest = std::max(largest, b);
  }
  return largest * kStreamBuffers;
}

uint64_t estimate_gpu_workspace_bytes(const ModelConfig& c, int ctx, int prefill_chunk, int slots) {
  const uint64_t f = sizeof(float);
  const uint64_t q_width = static_cast<uint64_t>(c.n_head) * c.head_dim * (c.attn_output_gate ? 2 : 1);
  const uint64_t kv_width = static_cast<uint64_t>(c.n_head_kv) * std::max(c.head_dim, c.head_dim_v);
  const uint64_t ssm = c.n_deltanet_layers() > 0
                           ? static_cast<uint64_t>(c.ssm_conv_channels()) * 2 +
                                 static_cast<uint64_t>(c.ssm_v_heads) * c.ssm_head_v * 2
                           : 0;
  const uint64_t per_token = 8ull * c.n_embd + 2 * q_width + 2 * kv_width + ssm + static_cast<uint64_t>(c.n_expert) +
                             3ull * c.n_expert_used * c.n_ff_exp + 2ull * c.n_ff_shexp +
                             static_cast<uint64_t>(c.n_vocab);
  // The decode step's vectors, and the multi-token decode step's (pending tokens) for up to kStepTokens
  // tokens (cuda/matvec_kernels.h kMaxGemvTokens).
  constexpr uint64_t kStepTokens = 32;
  const uint64_t decode = (1 + kStepTokens) * per_token * f + 2ull * c.n_head * static_cast<uint64_t>(std::max(ctx, 1)) * f;
  const uint64_t chunk = static_cast<uint64_t>(std::max(prefill_chunk, 1));
  const uint64_t prefill = (chunk * (per_token - c.n_vocab) +
                            std::min<uint64_t>(chunk, kPrefillLogitRows) * static_cast<uint64_t>(c.n_vocab)) *
                           f;
  const uint64_t fixed = 64ull << 20;
  // The decode lookahead (cuda/decode_lookahead.h) holds every DeltaNet layer's conv window and recurrent
  // state a second time (only all-GPU sessions use it; counted for every plan, a hybrid one keeps the
  // slack), and pending tokens (Sequence::forward_pending) a third.
  const uint64_t state_copies = 2 * static_cast<uint64_t>(c.n_deltanet_layers()) *
                                (static_cast<uint64_t>(std::max(c.ssm_conv_kernel - 1, 0)) * c.ssm_conv_channels() +
                                 static_cast<uint64_t>(c.ssm_v_heads) * c.ssm_head_k * c.ssm_head_v) *
                                f;
  return static_cast<uint64_t>(std::max(slots, 1)) * (decode + state_copies) + prefill + fixed;
}

}  // namespace strata
