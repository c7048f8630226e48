// One plan for every front end (run, chat, serve, logits, bench, calibrate): the backend options as
// given (BackendOptions, the flags cli/backend_cli.h adds), checked in one place, and what they decide
// for a model, a context and a number of sequence slots (BackendPlan): CPU or GPU, the VRAM receipt,
// the expert placement (all-GPU or hybrid), the prefill's fp16 weight cache (kept only when it fits
// under --gpu-mem / the free memory after everything else) and the GPU tuning choices. The plan is
// pure over plain numbers (the GPU's memory is an input), so it is tested without a GPU; the CLI's
// SequenceFactory turns it into sequences.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "strata/model/kv_type.h"
#include "strata/moe/expert_cache.h"
#include "strata/moe/gpu_expert_plan.h"

namespace strata {

class Model;
class ProfileStore;

struct BackendOptions {
  bool gpu = false;
  // -ngl/--n-gpu-layers N, llama.cpp's spelling: any N > 0 means --gpu (strata places experts, not
  // layers), 0 means the CPU; -1: not given.
  int n_gpu_layers = -1;
  std::string gpu_mem;        // --gpu-mem SIZE: the most strata may use on the GPU ("": what is free)
  std::string expert_budget;  // --expert-budget SIZE|PCT ("": what is left after the core)
  std::string profile;        // --profile FILE
  bool telemetry = false;     // --telemetry
  int cpu_threads = 0;        // --cpu-threads N for cold experts (0: a default from the core count)
  // --numerics fast|exact ("": fast). fast: K-quant decode matvecs dot int8-quantised activations (as the
  // CPU engine's SIMD kernels do) and the prefill multiplies fp16 copies on tensor cores; exact: float32
  // matvecs and fp32 prefill GEMMs. Router, norms, attention and DeltaNet are fp32 in both.
  std::string numerics;
  bool no_lookahead = false;  // --no-lookahead: greedy GPU decode waits for each pick before the next step
  // --no-op-offload (llama.cpp's name for the same choice): a hybrid prefill computes every cold expert on
  // the CPU instead of streaming them to the GPU (GpuPlanRequest::prefill_stream).
  bool no_op_offload = false;
  // --no-warmup (llama.cpp's name): skip the GPU warm-up at load (SequenceFactory: one prompt pass of the
  // plan's ubatch and two decode steps on a scratch sequence, so that the first request does not pay for
  // loading kernels and choosing GEMM algorithms).
  bool no_warmup = false;
  // -ub/--ubatch-size N (llama.cpp's name): tokens per batched GPU prefill pass (0: kDefaultUbatch, or
  // kStreamUbatch for a hybrid plan that streams and has room; never more than the context). Larger
  // passes take more workspace and, in a hybrid session, copy the streamed cold experts once per pass.
  int ubatch = 0;
  // -ctk/--cache-type-k, -ctv/--cache-type-v: how the KV cache stores keys and values on either backend:
  // f16 (default), f32 (exact; what the reference-parity tests use) or q8_0 (CPU only).
  std::string cache_type_k = "f16";
  std::string cache_type_v = "f16";
  // --collect-routing FILE (run, serve, calibrate): every kept token's picks per layer, written as a
  // routing trace (engine/routing_trace.h), on every backend.
  std::string collect_routing;
  // --routing FILE|generate:NAME[:SEED] (bench): the expert picks replayed from a trace or the generator
  // (moe/routing_generator.h) instead of the router's, on the CPU engine and with --gpu.
  std::string routing;
  // --expert-cache N (with --gpu): VRAM cache slots per MoE layer beyond the pinned hot experts, carved
  // out of the expert budget and filled while serving (moe/expert_cache.h); 0: none.
  // --expert-cache-policy lru|lfu ("": lfu). --expert-cache-admit M: the LFU admission margin
  // (ExpertCacheConfig::admit_margin; empty: not given).
  int expert_cache = 0;
  std::string expert_cache_policy;
  std::optional<double> expert_cache_admit;
};

// The parsed cache types (fails like check_backend_options on a bad name).
KvCacheTypes kv_cache_types(const BackendOptions& o);

// Refuses GPU-only options without --gpu ("--expert-budget needs --gpu") and malformed values
// (sizes, percentages, the numerics mode, a negative thread count, KV cache types, q8_0 with --gpu,
// a --routing spec, a negative --expert-cache, an unknown cache policy or one without --expert-cache), and the routing-trace options the GPU backends do not implement yet, before any
// model is loaded.
void check_backend_options(const BackendOptions& o);

// What the options decided for `slots` sequences of max_ctx tokens each.
constexpr int kDefaultUbatch = 512;
constexpr int kStreamUbatch = 2048;  // the default of a hybrid plan that streams cold experts to prompts
constexpr int kMaxUbatch = 4096;

struct BackendPlan {
  bool gpu = false;
  int max_ctx = 0, slots = 1;
  // With --gpu: the VRAM receipt, the expert placement and whether the prefill keeps its fp16 weight
  // cache (gpu_plan.prefill_f16_cache); gpu_plan.text is the receipt as printed on stderr.
  GpuExpertPlan gpu_plan;
  bool exact_numerics = false;  // --numerics exact
  bool lookahead = true;        // not --no-lookahead
  int cpu_threads = 0;          // cold-expert workers (0: a default from the core count)
  int prefill_chunk = kDefaultUbatch;  // tokens per batched-prefill pass (-ub; sizes its workspaces)
  KvCacheTypes kv_types;        // --cache-type-k / --cache-type-v
  ExpertCachePolicy expert_cache_policy = ExpertCachePolicy::Lfu;  // gpu_plan.cache_slots says whether a cache is used
  double expert_cache_admit_margin = ExpertCacheConfig{}.admit_margin;
};

// The GPU's memory as the plan sees it (device 0, read once the CUDA context exists).
struct GpuMemory {
  uint64_t total = 0, free = 0;
};

// The plan for checked options; `gpu` is read only with --gpu, `profile` (may be null) gives the
// placement's hotness. Fails (strata::Error) with the receipt when the core does not fit.
BackendPlan plan_backend(const Model& model, int max_ctx, int slots, const BackendOptions& o,
                         const ProfileStore* profile, const GpuMemory& gpu);

}  // namespace strata
