// Where a front end (run, chat, logits, serve, bench, calibrate) runs the model: the CPU engine by
// default, the GPU with --gpu (CUDA builds), and the issue-8 options around it: a VRAM budget
// (--gpu-mem, --expert-budget) that decides which routed experts live on the GPU and which are computed
// on the CPU (hybrid), a routing profile (--profile) that both guides that placement and records what
// the model routes, --telemetry for the hybrid per-token breakdown, and the GPU's tuning choices
// (--numerics, --no-lookahead; every other tuning value is a fixed constant), and the KV cache types
// (-ctk/-ctv, both backends). One flag set, one plan
// (moe/backend_plan.h) and one factory, so every command offers the same choice and gets the same
// placement, and a build or machine without a GPU refuses --gpu with one clear line instead of
// silently using the CPU.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "strata/engine/model.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/routing_trace.h"
#include "strata/engine/sequence.h"
#include "strata/moe/backend_plan.h"
#include "strata/moe/profile_store.h"
#include "strata/spec/spec_options.h"

namespace strata::cli {

using strata::BackendOptions;
using strata::BackendPlan;
using strata::check_backend_options;

using strata::kv_cache_types;

// llama.cpp's short spellings -ctk / -ctv / -ngl / -np / -ngld / -md / -no-cnv, which CLI11 cannot
// declare (one-character short names only; "-ngl 99" would read as "-n gl"): main() rewrites them to
// --cache-type-k / --cache-type-v / --n-gpu-layers / --parallel / --n-gpu-layers-draft / --model-draft /
// --no-conversation (also "-ctk=f16") before parsing.
std::string expand_short_alias(const std::string& arg);

// A number as option help shows a default: shortest form, "2", "0.5", "16".
std::string short_number(double v);

// --gpu, --gpu-mem, --expert-budget, --expert-cache, --expert-cache-policy, --expert-cache-admit, --profile,
// --telemetry, --cpu-threads, --numerics, --no-lookahead, --cache-type-k, --cache-type-v.
void add_backend_options(CLI::App& sub, BackendOptions& o);

// --collect-routing FILE (run, serve, calibrate) and --routing FILE|generate:NAME[:SEED] (bench);
// both are BackendOptions, checked by check_backend_options.
void add_collect_routing_option(CLI::App& sub, BackendOptions& o);
void add_routing_replay_option(CLI::App& sub, BackendOptions& o);

// --collect-routing: a new trace file for this model (its shape, fingerprint and name in the header);
// nullptr without the flag.
std::unique_ptr<RoutingTraceWriter> open_routing_trace(const Model& model, const BackendOptions& o);

// --routing: the trace (its shape checked against the model; a trace recorded on another model of
// the same shape is accepted and says so in its label) or the generator at the model's shape;
// nullptr without the flag.
std::unique_ptr<RoutingSource> open_routing_replay(const Model& model, const BackendOptions& o);

// --gpu in a build without CUDA or on a machine without a GPU: fails with one line. Nothing without --gpu.
void require_gpu_if_asked(const BackendOptions& o);

// --profile FILE: the store (loads the file when it exists, refusing another model's profile);
// nullptr without --profile.
std::unique_ptr<ProfileStore> open_profile(const Model& model, const BackendOptions& o);

// The backend for `slots` sequences of max_ctx tokens each, planned once (plan_backend, which it prints
// on stderr with --gpu): the CPU engine (every sequence a Session over the Model) or, with --gpu, one
// GpuModel -- one VRAM receipt and expert placement counting every slot's KV cache, state and
// workspaces -- that every sequence made shares. Throws like make_sequence.
class SequenceFactory {
 public:
  SequenceFactory(const Model& model, int max_ctx, int slots, const BackendOptions& o, const ProfileStore* profile);
  ~SequenceFactory();
  SequenceFactory(const SequenceFactory&) = delete;
  SequenceFactory& operator=(const SequenceFactory&) = delete;
  // A new sequence (thread-safe); with --gpu at most `slots` of them live at once fit the plan.
  std::unique_ptr<Sequence> make();
  const BackendPlan& plan() const { return plan_; }
  const char* backend_name() const { return plan_.gpu ? "cuda" : "cpu"; }

 private:
  struct Gpu;
  void warm_up();
  const Model& model_;
  BackendPlan plan_;
  std::unique_ptr<Gpu> gpu_;
};

// A sequence of max_ctx tokens on the chosen backend (a SequenceFactory for one slot). With --gpu: prints the VRAM receipt and the
// expert placement on stderr (placement from the profile's hotness when `profile` has counts,
// uniform otherwise) and makes an all-GPU or a hybrid session; fails with the receipt when the core
// does not fit. Throws strata::Error for --gpu in a build without CUDA or on a machine without a GPU.
std::unique_ptr<Sequence> make_sequence(const Model& model, int max_ctx, const BackendOptions& o,
                                        const ProfileStore* profile = nullptr);

// A draft model's sequences on the GPU for a target run with target_backend: every routed expert on the
// GPU if it fits what is left (the plan and its receipt as for --gpu, the target's cache types,
// numerics and lookahead), one GpuModel made on the first call and shared by up to `slots` sequences.
DraftSequenceMaker draft_sequence_maker(const BackendOptions& target_backend, int slots);

// Counts a sequence's routes for a profile while it lives: attaches a RoutingCounts to the sequence
// (Sequence::set_routing_counts); save() adds what was counted since the last save to the store and
// rewrites the file atomically. With a null store it does nothing (no --profile). Detaches on
// destruction, so it must not outlive the sequence.
class ProfileRecorder {
 public:
  ProfileRecorder(ProfileStore* store, Sequence& sequence);
  ~ProfileRecorder();
  ProfileRecorder(const ProfileRecorder&) = delete;
  ProfileRecorder& operator=(const ProfileRecorder&) = delete;
  void save();
  const RoutingCounts& pending() const { return counts_; }

 private:
  ProfileStore* store_;
  Sequence& sequence_;
  RoutingCounts counts_;
};

// --telemetry: the hybrid session's per-token breakdown (tokens through the MoE, cold picks per
// token and per layer, cold-hit rate, CPU time, GPU wait) as lines on `out`; for an all-GPU session
// a line saying there is no cold path. Nothing without --telemetry.
void print_telemetry(const Sequence& sequence, const BackendOptions& o, std::FILE* out);
// The same breakdown as text ("" when the sequence is not a hybrid GPU session).
std::string telemetry_text(const Sequence& sequence);
// The same counters as Prometheus lines (strata_hybrid_*_total, totals since the session started) for
// serve's /metrics; "" when the sequence is not a hybrid GPU session.
std::string telemetry_metrics(const Sequence& sequence);

}  // namespace strata::cli
