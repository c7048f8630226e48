#include "strata/moe/backend_plan.h"

#include <algorithm>
#include <cmath>

#include "strata/base/error.h"
#include "strata/engine/model.h"
#include "strata/moe/gpu_support.h"
#include "strata/moe/profile_store.h"
#include "strata/moe/routing_generator.h"
#include "strata/moe/vram_budget.h"

namespace strata {

KvCacheTypes kv_cache_types(const BackendOptions& o) {
  return {parse_kv_type(o.cache_type_k, "--cache-type-k"), parse_kv_type(o.cache_type_v, "--cache-type-v")};
}

void check_backend_options(const BackendOptions& o) {
  if (o.n_gpu_layers < -1) fail("-ngl/--n-gpu-layers must be >= 0, got ", o.n_gpu_layers);
  if (o.n_gpu_layers == 0 && o.gpu) fail("-ngl 0 asks for the CPU but --gpu was given; drop one");
  if (o.n_gpu_layers > 0 && !o.gpu) fail("-ngl ", o.n_gpu_layers, " means --gpu, but --gpu is off");
  const KvCacheTypes kv = kv_cache_types(o);
  if (!o.routing.empty()) parse_routing_replay(o.routing);
  if (!o.collect_routing.empty() && !o.routing.empty())
    fail("--collect-routing records the router's own picks; it cannot be combined with --routing");
  if (!o.gpu) {
    if (!o.gpu_mem.empty()) fail("--gpu-mem needs --gpu");
    if (!o.expert_budget.empty()) fail("--expert-budget needs --gpu");
    if (o.telemetry) fail("--telemetry needs --gpu");
    if (o.cpu_threads != 0) fail("--cpu-threads needs --gpu (the CPU engine uses --threads)");
    if (!o.numerics.empty()) fail("--numerics needs --gpu");
    if (o.no_lookahead) fail("--no-lookahead needs --gpu");
    if (o.no_op_offload) fail("--no-op-offload needs --gpu");
    if (o.no_warmup) fail("--no-warmup needs --gpu (the CPU engine has no warm-up)");
    if (o.ubatch != 0) fail("--ubatch-size needs --gpu (the CPU engine runs prompts in its own pieces)");
    if (o.expert_cache != 0) fail("--expert-cache needs --gpu");
    if (!o.expert_cache_policy.empty()) fail("--expert-cache-policy needs --gpu");
    if (o.expert_cache_admit) fail("--expert-cache-admit needs --gpu");
    return;
  }
  if (o.expert_cache < 0) fail("--expert-cache must be >= 0, got ", o.expert_cache);
  if (o.ubatch < 0 || o.ubatch > kMaxUbatch) fail("--ubatch-size must be within 1..", kMaxUbatch, ", got ", o.ubatch);
  if (!o.expert_cache_policy.empty()) {
    parse_expert_cache_policy(o.expert_cache_policy);
    if (o.expert_cache == 0) fail("--expert-cache-policy needs --expert-cache N (cache slots per layer)");
  }
  if (o.expert_cache_admit) {
    if (!(*o.expert_cache_admit >= 0.0) || !std::isfinite(*o.expert_cache_admit))
      fail("--expert-cache-admit must be a finite number >= 0, got ", *o.expert_cache_admit);
    if (o.expert_cache == 0) fail("--expert-cache-admit needs --expert-cache N (cache slots per layer)");
    if (!o.expert_cache_policy.empty() && parse_expert_cache_policy(o.expert_cache_policy) != ExpertCachePolicy::Lfu)
      fail("--expert-cache-admit is the lfu policy's margin; --expert-cache-policy ", o.expert_cache_policy,
           " has none");
  }
  if (!o.gpu_mem.empty()) parse_size(o.gpu_mem, "--gpu-mem");
  if (!o.expert_budget.empty()) parse_expert_budget(o.expert_budget);
  if (!o.numerics.empty() && o.numerics != "fast" && o.numerics != "exact")
    fail("--numerics '", o.numerics, "': expected fast or exact");
  if (o.cpu_threads < 0) fail("--cpu-threads must be >= 0, got ", o.cpu_threads);
  try {
    check_gpu_kv_types(kv);
  } catch (const Error& e) {
    fail("--gpu: ", e.what());
  }
}

BackendPlan plan_backend(const Model& model, int max_ctx, int slots, const BackendOptions& o,
                         const ProfileStore* profile, const GpuMemory& gpu) {
  BackendPlan p;
  p.gpu = o.gpu;
  p.max_ctx = max_ctx;
  p.slots = slots;
  p.exact_numerics = o.numerics == "exact";
  p.lookahead = !o.no_lookahead;
  p.cpu_threads = o.cpu_threads;
  if (o.ubatch > 0) p.prefill_chunk = std::min(o.ubatch, std::max(max_ctx, 1));
  p.kv_types = kv_cache_types(o);
  check_kv_types(model.config(), p.kv_types);
  if (!o.gpu) return p;
  if (!o.expert_cache_policy.empty()) p.expert_cache_policy = parse_expert_cache_policy(o.expert_cache_policy);
  if (o.expert_cache_admit) p.expert_cache_admit_margin = *o.expert_cache_admit;
  require_gpu_support(model.config());
  GpuPlanRequest req;
  req.gpu_total = gpu.total;
  req.gpu_free = gpu.free;
  if (!o.gpu_mem.empty()) req.gpu_mem = parse_size(o.gpu_mem, "--gpu-mem");
  if (!o.expert_budget.empty()) req.expert_budget = parse_expert_budget(o.expert_budget);
  req.workspace_bytes = estimate_gpu_workspace_bytes(model.config(), max_ctx, p.prefill_chunk, slots);
  req.prefill_f16_cache = !p.exact_numerics;  // the exact prefill multiplies fp32 weights decoded per chunk
  req.prefill_unsupported = gpu_prefill_unsupported_feature(model.config());
  req.prefill_stream = !o.no_op_offload && req.prefill_unsupported.empty();
  req.expert_cache_slots = o.expert_cache;
  req.expert_cache_policy = expert_cache_policy_name(p.expert_cache_policy);
  RoutingCounts counts;
  if (profile) {
    counts = profile->snapshot();
    req.hotness = &counts;
    req.hotness_source = counts.n_tokens > 0 ? cat("profile ", profile->path(), " (", counts.n_tokens, " tokens)")
                                             : cat("uniform (profile ", profile->path(), " has no tokens yet)");
  }
  const ModelFootprint footprint = model_footprint(model, max_ctx, slots, p.kv_types);
  p.gpu_plan = plan_gpu_experts(footprint, model.config().n_expert_used, req);
  // A hybrid plan that streams cold experts to prompts copies them once per pass: without -ub it takes
  // kStreamUbatch-token passes when their workspace still leaves a streaming hybrid plan.
  const int longer = std::min(kStreamUbatch, std::max(max_ctx, 1));
  if (o.ubatch == 0 && p.gpu_plan.hybrid && p.gpu_plan.prefill_stream_bytes > 0 && longer > p.prefill_chunk) {
    GpuPlanRequest wide = req;
    wide.workspace_bytes = estimate_gpu_workspace_bytes(model.config(), max_ctx, longer, slots);
    try {
      GpuExpertPlan plan = plan_gpu_experts(footprint, model.config().n_expert_used, wide);
      if (plan.hybrid && plan.prefill_stream_bytes > 0) {
        p.gpu_plan = std::move(plan);
        p.prefill_chunk = longer;
      }
    } catch (const Error&) {  // the core no longer fits with the larger workspace: keep the first plan
    }
  }
  return p;
}

}  // namespace strata
