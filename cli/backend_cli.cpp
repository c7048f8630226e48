#include "cli/backend_cli.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <utility>
#include <vector>

#include "strata/base/error.h"
#include "strata/engine/session.h"
#include "strata/moe/gpu_expert_plan.h"
#include "strata/moe/model_fingerprint.h"
#include "strata/moe/routing_generator.h"
#include "strata/moe/vram_budget.h"
#include "strata/sample/sampler.h"

#ifdef STRATA_HAVE_CUDA
#include "strata/cuda/device_state.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/gpu_memory.h"
#include "strata/cuda/gpu_model.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/hybrid_types.h"
#include "strata/cuda/matvec_kernels.h"
#endif

namespace strata::cli {

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void add_backend_options(CLI::App& sub, BackendOptions& o) {
  sub.add_flag("--gpu", o.gpu, "run the model on the GPU (CUDA build); experts that do not fit run on the CPU");
  sub.add_option_function<int>(
      "--n-gpu-layers",
      [&o](int n) {
        o.n_gpu_layers = n < 0 ? -2 : n;  // a negative value is refused by check_backend_options
        if (n > 0) o.gpu = true;
      },
      "-ngl: llama.cpp's spelling; any value > 0 means --gpu (experts are placed by memory, not layers), 0 the CPU");
  sub.add_option("--gpu-mem", o.gpu_mem, "with --gpu: the most GPU memory strata may use, e.g. 20G (default: what is free)");
  sub.add_option("--expert-budget", o.expert_budget,
                 "with --gpu: GPU memory for routed experts, a size (12G) or a percent of all expert bytes (50%) "
                 "(default: what is left after the core); the others run on the CPU");
  sub.add_option("--profile", o.profile,
                 "routing profile FILE: guides which experts stay on the GPU, and is updated with what this run routes "
                 "(created when missing; refused when it belongs to another model)");
  sub.add_flag("--telemetry", o.telemetry, "with --gpu: the hybrid per-token breakdown (run, chat: on stderr at the end; serve: on /metrics)");
  sub.add_option("--cpu-threads", o.cpu_threads, "with --gpu: CPU threads for cold experts (default: from the core count)");
  sub.add_option("--numerics", o.numerics,
                 "with --gpu: fast (default: int8 activations for k-quant decode matvecs, fp16 tensor-core prefill) "
                 "or exact (float32 matvecs and prefill)");
  sub.add_flag("--no-lookahead", o.no_lookahead,
               "with --gpu: greedy decode waits for each token before launching the next step (same output, slower)");
  sub.add_option("--expert-cache", o.expert_cache,
                 "with --gpu, hybrid: N VRAM cache slots per MoE layer beyond the pinned experts, carved out of "
                 "the expert budget and filled while serving with the experts the CPU computed (default 0: none)");
  sub.add_option("--expert-cache-policy", o.expert_cache_policy,
                 "with --expert-cache: lfu (default: pick counts halving every 16 steps; it catches more than lru "
                 "at every residency and size routing-stats --cache-sim tries) or lru");
  sub.add_option_function<double>(
      "--expert-cache-admit", [&o](double v) { o.expert_cache_admit = v; },
      "with --expert-cache, lfu: a cold expert displaces a cached one only when its aged pick count beats the "
      "victim's by this margin (default " +
          short_number(ExpertCacheConfig{}.admit_margin) +
          "); larger copies less where hits are rare (try values with routing-stats --cache-sim "
          "--cache-admit-margin)");
  sub.add_flag("--no-op-offload", o.no_op_offload,
               "-nopo: with --gpu, hybrid: prompt chunks compute their cold experts on the CPU instead of copying them to the "
               "GPU (streaming prefill, on by default; it takes two buffers of the largest layer's cold experts)");
  sub.add_flag("--no-warmup", o.no_warmup,
               "with --gpu: skip the warm-up at load (one prompt pass of the ubatch size and two decode steps on a "
               "scratch sequence, so that the first request does not pay for loading kernels)");
  sub.add_option("--ubatch-size", o.ubatch,
                 "-ub: with --gpu: tokens per batched prefill pass (0 or not given: 512, 2048 in a hybrid session that streams "
                 "cold experts to prompts; at most 4096); larger passes take more GPU memory and copy the streamed "
                 "cold experts once per pass");
  sub.add_option("--cache-type-k", o.cache_type_k,
                 "-ctk: KV cache type for keys: f16 (default), f32 or q8_0 (CPU only)");
  sub.add_option("--cache-type-v", o.cache_type_v,
                 "-ctv: KV cache type for values: f16 (default), f32 or q8_0 (CPU only)");
}

void add_collect_routing_option(CLI::App& sub, BackendOptions& o) {
  sub.add_option("--collect-routing", o.collect_routing,
                 "write every kept token's expert picks per layer to FILE, a routing trace for strata routing-stats "
                 "and bench --routing (CPU engine, --gpu and hybrid; on the GPU, decode steps then run without the lookahead)");
}

void add_routing_replay_option(CLI::App& sub, BackendOptions& o) {
  sub.add_option("--routing", o.routing,
                 "drive the expert picks from a routing trace FILE or generate:NAME[:SEED] (" + routing_setting_names() +
                     ") instead of the router (CPU engine, --gpu and hybrid); every speed is labelled as replayed");
}

std::unique_ptr<RoutingTraceWriter> open_routing_trace(const Model& model, const BackendOptions& o) {
  if (o.collect_routing.empty()) return nullptr;
  const ModelIdentity id = model_identity(model);
  RoutingTraceHeader h;
  h.n_layer = static_cast<int>(model.config().routed_layers().size());  // dense layers are not recorded
  h.n_expert = id.n_expert, h.k = id.n_expert_used;
  h.fingerprint = id.fingerprint;
  h.source = id.name;
  return std::make_unique<RoutingTraceWriter>(o.collect_routing, h);
}

std::unique_ptr<RoutingSource> open_routing_replay(const Model& model, const BackendOptions& o) {
  if (o.routing.empty()) return nullptr;
  const RoutingReplaySpec spec = parse_routing_replay(o.routing);
  const ModelConfig& c = model.config();
  const int n_routed = static_cast<int>(c.routed_layers().size());  // what traces hold
  if (spec.generated)
    return std::make_unique<RoutingGenerator>(routing_setting(spec.name), n_routed, c.n_expert, c.n_expert_used,
                                              spec.seed);
  RoutingTrace trace = read_routing_trace(spec.path);
  check_trace_shape(trace.header, n_routed, c.n_expert, c.n_expert_used, "--routing " + spec.path);
  const std::string fp = model_identity(model).fingerprint;
  std::string label = cat("replayed ", spec.path);
  if (!trace.header.fingerprint.empty() && trace.header.fingerprint != fp)
    label += cat(" (recorded on ", trace.header.source.empty() ? "another model" : trace.header.source, ")");
  return std::make_unique<TraceReplay>(std::move(trace), label);
}

std::string expand_short_alias(const std::string& arg) {
  // -no-cnv has no value: only the exact word is rewritten.
  if (arg == "-no-cnv") return "--no-conversation";
  for (const auto& [alias, name] : {std::pair<std::string, std::string>{"-ctk", "--cache-type-k"},
                                    std::pair<std::string, std::string>{"-ctv", "--cache-type-v"},
                                    std::pair<std::string, std::string>{"-ngl", "--n-gpu-layers"},
                                    std::pair<std::string, std::string>{"-np", "--parallel"},
                                    std::pair<std::string, std::string>{"-ngld", "--n-gpu-layers-draft"},
                                    std::pair<std::string, std::string>{"-nopo", "--no-op-offload"},
                                    std::pair<std::string, std::string>{"-ub", "--ubatch-size"},
                                    std::pair<std::string, std::string>{"-md", "--model-draft"}}) {
    if (arg == alias) return name;
    if (arg.rfind(alias + "=", 0) == 0) return name + arg.substr(alias.size());
  }
  return arg;
}

std::unique_ptr<ProfileStore> open_profile(const Model& model, const BackendOptions& o) {
  if (o.profile.empty()) return nullptr;
  return std::make_unique<ProfileStore>(o.profile, model);
}

void require_gpu_if_asked(const BackendOptions& o) {
  if (!o.gpu) return;
#ifdef STRATA_HAVE_CUDA
  if (!cuda::device_available()) fail("--gpu: ", cuda::device_description());
#else
  fail("--gpu: this strata was built without CUDA (configure with nvcc present or -DSTRATA_CUDA=ON)");
#endif
}

#ifdef STRATA_HAVE_CUDA
namespace {

cuda::GpuSessionOptions gpu_session_options(const BackendPlan& p) {
  cuda::GpuSessionOptions so;
  so.cpu_threads = p.cpu_threads;
  so.lookahead = p.lookahead;
  so.prefill_math = p.exact_numerics ? cuda::PrefillMath::Exact : cuda::PrefillMath::Fast;
  so.prefill_chunk = p.prefill_chunk;
  so.prefill_f16_cache = p.gpu_plan.prefill_f16_cache;
  so.prefill_stream = p.gpu_plan.prefill_stream_bytes > 0;
  so.expert_slots = p.gpu_plan.expert_slots;
  so.expert_cache_slots = p.gpu_plan.cache_slots.empty() ? 0 : p.gpu_plan.expert_cache_request;
  so.expert_cache_policy = p.expert_cache_policy;
  so.expert_cache_admit_margin = p.expert_cache_admit_margin;
  so.kv_types = p.kv_types;
  return so;
}

}  // namespace

struct SequenceFactory::Gpu {
  cuda::GpuSessionOptions options;
  std::shared_ptr<cuda::GpuModel> model;
};
#else
struct SequenceFactory::Gpu {};
#endif

SequenceFactory::SequenceFactory(const Model& model, int max_ctx, int slots, const BackendOptions& o,
                                 const ProfileStore* profile)
    : model_(model) {
  check_backend_options(o);
  // A command that offers --profile opens the store (open_profile) and passes it; one that does not
  // would otherwise ignore the flag.
  if (!o.profile.empty() && !profile) fail("--profile: this command does not record routing profiles");
  if (slots < 1) fail("a backend needs at least one slot, got ", slots);
  require_gpu_if_asked(o);
  if (!o.gpu) {
    plan_ = plan_backend(model, max_ctx, slots, o, profile, GpuMemory{});
    return;
  }
#ifdef STRATA_HAVE_CUDA
  try {
    const cuda::GpuMemoryInfo mem = cuda::gpu_memory_info();
    plan_ = plan_backend(model, max_ctx, slots, o, profile, GpuMemory{mem.total_bytes, mem.free_bytes});
    std::fputs(plan_.gpu_plan.text.c_str(), stderr);
    // The decode matvec arithmetic is process-wide (matvec_kernels.h); every sequence of a process is
    // made from the same flags.
    cuda::set_gemv_math(plan_.exact_numerics ? cuda::GemvMath::Float : cuda::GemvMath::Int8);
    gpu_ = std::make_unique<Gpu>();
    gpu_->options = gpu_session_options(plan_);
    // --gpu-mem bounds every device allocation strata makes from here on, not only the plan's estimate.
    if (!o.gpu_mem.empty()) cuda::set_device_memory_limit(parse_size(o.gpu_mem, "--gpu-mem"));
    gpu_->model = cuda::make_gpu_model(model, gpu_->options);
    if (!o.no_warmup) warm_up();
  } catch (const Error& e) {
    fail("--gpu: ", e.what());
  }
#endif
}

// The first prompt and the first decode steps of a process load their kernels and choose their GEMM
// algorithms: done here, on a scratch sequence, for a short prompt and one of the plan's pass size, so
// that the first request runs at the speed of the rest. A hybrid session's telemetry starts again
// afterwards (an expert cache keeps what the warm-up's picks taught it until live traffic moves it).
void SequenceFactory::warm_up() {
#ifdef STRATA_HAVE_CUDA
  std::unique_ptr<cuda::GpuSession> s = cuda::make_gpu_session(gpu_->model, plan_.max_ctx, gpu_->options);
  const int32_t n_vocab = static_cast<int32_t>(model_.config().n_vocab);
  const int n = std::max(1, std::min(plan_.prefill_chunk, plan_.max_ctx - 3));
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>(i % n_vocab);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  // A short prompt first (its GEMM shapes take other kernels than a full pass's), then a full pass.
  s->forward(prompt.data(), std::min(n, 16), logits.data(), false);
  s->reset();
  s->forward(prompt.data(), n, logits.data(), false);
  SamplerParams greedy;
  greedy.temperature = 0.0f;
  Sampler sampler(greedy);
  int32_t tok = 0;
  for (int i = 0; i < 2 && s->n_past() < plan_.max_ctx; ++i)
    tok = s->decode_and_pick(tok, sampler, prompt, n_vocab, logits);
  s->reset();  // drops a lookahead step still in flight, which would otherwise count after the reset below
  s->reset_hybrid_telemetry();
#endif
}

SequenceFactory::~SequenceFactory() = default;

std::unique_ptr<Sequence> SequenceFactory::make() {
  if (!gpu_) return std::make_unique<Session>(model_, plan_.max_ctx, plan_.kv_types);
#ifdef STRATA_HAVE_CUDA
  try {
    return cuda::make_gpu_session(gpu_->model, plan_.max_ctx, gpu_->options);
  } catch (const Error& e) {
    fail("--gpu: ", e.what());
  }
#else
  fail("--gpu: this strata was built without CUDA");
#endif
}

std::unique_ptr<Sequence> make_sequence(const Model& model, int max_ctx, const BackendOptions& o,
                                        const ProfileStore* profile) {
  return SequenceFactory(model, max_ctx, 1, o, profile).make();
}

DraftSequenceMaker draft_sequence_maker(const BackendOptions& target_backend, int slots) {
  BackendOptions d;
  d.gpu = true;
  d.cpu_threads = target_backend.cpu_threads;
  d.numerics = target_backend.numerics;
  d.no_lookahead = target_backend.no_lookahead;
  d.no_op_offload = target_backend.no_op_offload;
  // The draft factory is made on the first request that drafts: a warm-up then would land on that request.
  d.no_warmup = true;
  d.ubatch = target_backend.ubatch;
  d.cache_type_k = target_backend.cache_type_k;
  d.cache_type_v = target_backend.cache_type_v;
  check_backend_options(d);
  auto factory = std::make_shared<std::unique_ptr<SequenceFactory>>();
  auto mu = std::make_shared<std::mutex>();
  return [d, factory, mu, slots](const Model& draft, int max_ctx) {
    std::lock_guard<std::mutex> lock(*mu);
    if (!*factory) {
      std::fprintf(stderr, "draft model on the GPU:\n");
      *factory = std::make_unique<SequenceFactory>(draft, max_ctx, slots, d, nullptr);
    }
    return (*factory)->make();
  };
}

ProfileRecorder::ProfileRecorder(ProfileStore* store, Sequence& sequence) : store_(store), sequence_(sequence) {
  if (store_) sequence_.set_routing_counts(&counts_);
}

ProfileRecorder::~ProfileRecorder() {
  if (store_) sequence_.set_routing_counts(nullptr);
}

void ProfileRecorder::save() {
  if (!store_) return;
  sequence_.flush_routing_counts();
  store_->add_and_save(counts_);
  const ModelConfig& c = sequence_.model().config();
  counts_.reset(c.n_layer, c.n_expert);  // what was saved is not added again
}

std::string telemetry_text(const Sequence& sequence) {
#ifdef STRATA_HAVE_CUDA
  const auto* gpu = dynamic_cast<const cuda::GpuSession*>(&sequence);
  if (!gpu || !gpu->hybrid()) return "";
  const cuda::HybridTelemetry t = gpu->hybrid_telemetry();
  const double n = t.tokens > 0 ? static_cast<double>(t.tokens) : 1.0;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "telemetry: hybrid (%d CPU threads), %llu tokens through the MoE: %.2f cold picks/token of %.2f, "
                "cold-hit %.3f; CPU cold work %.3f ms/token (overlaps the GPU), GPU wait for the CPU %.3f ms/token, "
                "doorbell to answer (decode jobs) %.3f ms/token, %.2f layers/token reached the CPU\n",
                t.cpu_threads, static_cast<unsigned long long>(t.tokens),
                static_cast<double>(t.cold_picks) / n, static_cast<double>(t.picks) / n, t.cold_hit_rate(),
                t.cpu_cold_ms / n, t.gpu_wait_ms / n, t.answer_ms / n, static_cast<double>(t.cpu_jobs) / n);
  std::string s = buf;
  s += "telemetry: cold picks per layer per token:";
  for (uint64_t v : t.cold_picks_per_layer) {
    std::snprintf(buf, sizeof buf, " %.2f", static_cast<double>(v) / n);
    s += buf;
  }
  s += "\n";
  if (!t.stream_note.empty()) {
    s += cat("telemetry: prefill streaming ", t.stream_note, "; ", t.stream_chunks, " prompt chunks streamed ",
             t.stream_layers, " layer passes, ", t.stream_experts, " experts, ");
    std::snprintf(buf, sizeof buf, "%.1f MiB\n", static_cast<double>(t.stream_bytes) / 1048576.0);
    s += buf;
  }
  if (t.cache_slots > 0) {
    const std::string policy = std::string(t.cache_policy) == "lfu"
                                   ? cat("lfu, admission margin ", short_number(t.cache_admit_margin))
                                   : std::string(t.cache_policy);
    std::snprintf(buf, sizeof buf,
                  "telemetry: expert cache (%s, %d slots): %llu hits, %llu misses, hit rate %.3f of the picks the "
                  "pinned experts miss; %llu copies (%.2f MiB, %.1f KiB/token), %llu evictions\n",
                  policy.c_str(), t.cache_slots, static_cast<unsigned long long>(t.cache_hits),
                  static_cast<unsigned long long>(t.cold_picks), t.cache_hit_rate(),
                  static_cast<unsigned long long>(t.cache_copies), static_cast<double>(t.cache_copy_bytes) / 1048576.0,
                  static_cast<double>(t.cache_copy_bytes) / 1024.0 / n,
                  static_cast<unsigned long long>(t.cache_evictions));
    s += buf;
    s += "telemetry: cache hits per layer per token:";
    for (uint64_t v : t.cache_hits_per_layer) {
      std::snprintf(buf, sizeof buf, " %.2f", static_cast<double>(v) / n);
      s += buf;
    }
    s += "\n";
  }
  return s;
#else
  (void)sequence;
  return "";
#endif
}

std::string telemetry_metrics(const Sequence& sequence) {
#ifdef STRATA_HAVE_CUDA
  const auto* gpu = dynamic_cast<const cuda::GpuSession*>(&sequence);
  if (!gpu || !gpu->hybrid()) return "";
  const cuda::HybridTelemetry t = gpu->hybrid_telemetry();
  std::string s;
  auto counter = [&s](const char* name, const char* help, const std::string& value) {
    s += cat("# HELP strata_hybrid_", name, " ", help, "\n# TYPE strata_hybrid_", name, " counter\nstrata_hybrid_", name,
             " ", value, "\n");
  };
  char buf[64];
  counter("tokens_total", "Tokens through the hybrid MoE (prefill and decode).", cat(t.tokens));
  counter("picks_total", "Routed expert picks.", cat(t.picks));
  counter("cold_picks_total", "Routed expert picks computed on the CPU.", cat(t.cold_picks));
  counter("cpu_jobs_total", "Layer passes that had cold picks.", cat(t.cpu_jobs));
  std::snprintf(buf, sizeof buf, "%.6f", t.cpu_cold_ms / 1e3);
  counter("cpu_cold_seconds_total", "CPU time computing cold experts.", buf);
  std::snprintf(buf, sizeof buf, "%.6f", t.gpu_wait_ms / 1e3);
  counter("gpu_wait_seconds_total", "GPU time waiting for cold experts.", buf);
  std::snprintf(buf, sizeof buf, "%.6f", t.answer_ms / 1e3);
  counter("answer_seconds_total", "Decode: time from each cold job's doorbell to the GPU seeing its answer.", buf);
  counter("stream_layers_total", "Prompt-chunk layer passes whose cold experts were copied to the GPU.",
          cat(t.stream_layers));
  counter("stream_bytes_total", "Bytes of cold experts copied to the GPU for prompts.", cat(t.stream_bytes));
  if (t.cache_slots > 0) {
    counter("cache_hits_total", "Routed expert picks served from the VRAM expert cache.", cat(t.cache_hits));
    counter("cache_copies_total", "Experts copied into the VRAM expert cache.", cat(t.cache_copies));
    counter("cache_copy_bytes_total", "Bytes copied into the VRAM expert cache.", cat(t.cache_copy_bytes));
    counter("cache_evictions_total", "Cached experts displaced by a copy.", cat(t.cache_evictions));
  }
  s += "# HELP strata_hybrid_layer_cold_picks_total Cold picks per layer.\n"
       "# TYPE strata_hybrid_layer_cold_picks_total counter\n";
  for (size_t l = 0; l < t.cold_picks_per_layer.size(); ++l)
    s += cat("strata_hybrid_layer_cold_picks_total{layer=\"", l, "\"} ", t.cold_picks_per_layer[l], "\n");
  if (t.cache_slots > 0) {
    s += "# HELP strata_hybrid_layer_cache_hits_total Routed expert picks served from the VRAM expert cache, per layer.\n"
         "# TYPE strata_hybrid_layer_cache_hits_total counter\n";
    for (size_t l = 0; l < t.cache_hits_per_layer.size(); ++l)
      s += cat("strata_hybrid_layer_cache_hits_total{layer=\"", l, "\"} ", t.cache_hits_per_layer[l], "\n");
  }
  return s;
#else
  (void)sequence;
  return "";
#endif
}

void print_telemetry(const Sequence& sequence, const BackendOptions& o, std::FILE* out) {
  if (!o.telemetry) return;
  const std::string s = telemetry_text(sequence);
  if (s.empty()) {
    std::fputs("telemetry: all-GPU session, every routed expert is on the GPU (no cold path to report)\n", out);
    return;
  }
  std::fputs(s.c_str(), out);
}

}  // namespace strata::cli
