// A GpuSession runs one sequence with the whole model in GPU memory: the same contract as
// strata::Session (engine/session.h), computed by the CUDA kernels of kernels.h.
//
// Decode (one token) is one CUDA graph, captured on the first step and replayed for every later token:
// the token id and position are copied into device memory before each replay (or, for a greedy step
// fed its own pick, advanced on the device: the lookahead of decode_lookahead.h), and every buffer
// (activations, KV cache, DeltaNet state, scratch) is allocated once at construction, so a decode step
// allocates nothing. A prompt (forward with n > 1) runs through the batched prefill (prefill.h) unless
// GpuSessionOptions::batched_prefill is false, then token by token through the decode graph.
// Plain C++ header: include it only where STRATA_HAVE_CUDA is defined (the library exists then).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/engine/model.h"
#include "strata/engine/mtp.h"
#include "strata/engine/sequence.h"
#include "strata/model/kv_type.h"
#include "strata/moe/expert_cache.h"
#include "strata/cuda/hybrid_types.h"
#include "strata/cuda/prefill_math.h"

namespace strata::cuda {

// Whether the CUDA runtime sees at least one GPU (false, without throwing, when there is none).
bool device_available();
// "NVIDIA H100 80GB HBM3 (cc 9.0, 79.1 GiB)" for device 0, or why there is none.
std::string device_description();

struct GpuSessionOptions {
  bool use_graph = true;  // capture the decode step once and replay it (false: launch kernels each step)
  // Greedy decode steps launch the next step from their pick before the pick is read back, so the GPU
  // does not wait for the host between tokens; the step is dropped exactly when the caller feeds another
  // token (decode_lookahead.h; the DeltaNet state is held twice). Needs use_graph; not in hybrid mode.
  bool lookahead = true;
  // Hybrid mode (issue 8). Empty: every expert is resident on the GPU. Otherwise [layer][expert] -> slot
  // in that layer's GPU expert stack (slots 0..n_hot-1 in ascending expert id), or -1: a cold expert,
  // computed on the CPU from the mapped GGUF and never uploaded.
  std::vector<std::vector<int>> expert_slots;
  int cpu_threads = 0;  // CPU workers for cold experts (0: a default from the core count)
  // VRAM expert cache (hybrid mode, moe/expert_cache.h): cache slots per MoE layer beyond the pinned
  // experts of expert_slots (capped at the layer's cold experts; 0: none). A cold pick is computed on the
  // CPU as without a cache while the policy may copy the expert into a slot on a copy stream; the slot
  // map changes only between steps. expert_cache_copy_bytes bounds the bytes of the copies started per
  // step (0: n_expert_used experts of the largest layer).
  int expert_cache_slots = 0;
  ExpertCachePolicy expert_cache_policy = ExpertCachePolicy::Lfu;
  double expert_cache_admit_margin = ExpertCacheConfig{}.admit_margin;  // ExpertCacheConfig::admit_margin
  uint64_t expert_cache_copy_bytes = 0;
  // Hybrid mode: prompt chunks with enough tokens per expert copy their cold experts to the GPU and
  // compute them there (hybrid_stream.h), in ExpertStreamer::buffer_bytes of extra device memory.
  bool prefill_stream = false;
  // Prompts (forward with n > 1) run through the batched prefill (prefill.h: chunks of prefill_chunk
  // tokens, matrix-matrix products) in the arithmetic prefill_math names (prefill_math.h); false: token
  // by token through the decode step.
  bool batched_prefill = true;
  PrefillMath prefill_math = PrefillMath::Fast;
  int prefill_chunk = 512;
  // Fast prefill: keep fp16 copies of the dense matrices (PrefillOptions::cache_dense_f16). The backend
  // plan decides it within --gpu-mem (moe/gpu_expert_plan.h); nothing here looks at free memory.
  bool prefill_f16_cache = true;
  // How the sequence's KV cache stores keys and values: f32 or f16 (q8_0 is CPU-only and refused). f32 by
  // default here, as strata::Session; the command line defaults to f16.
  KvCacheTypes kv_types;
};

class GpuModel;

class GpuSession : public Sequence {
 public:
  // Uploads the model's weights into a GpuModel of its own (fails on an unsupported weight type, naming
  // the tensor) and allocates the KV cache / DeltaNet state for max_ctx tokens and every workspace.
  GpuSession(const Model& model, int max_ctx, GpuSessionOptions options = {});
  // A sequence over a shared GpuModel (gpu_model.h): its own state, workspaces, stream and graphs. The
  // model's options decide placement, hybrid MoE and prefill; options here decide graphs and lookahead.
  GpuSession(std::shared_ptr<GpuModel> model, int max_ctx, GpuSessionOptions options = {});
  ~GpuSession() override;
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;

  // As Session::forward: runs n tokens after the ones already seen; logits_out receives [n x n_vocab]
  // floats when all_positions, else [n_vocab] for the last token. Fails (strata::Error) when the tokens
  // would exceed the context or an id is out of range; the state is unchanged then.
  void forward(const int32_t* tokens, int n, float* logits_out, bool all_positions) override;

  // Sequence::forward_pending / keep: a chain runs as one forward that records the DeltaNet state after
  // each token, so keep() of any prefix copies one recorded state back (no second forward); a tree runs
  // each root-to-leaf path from a snapshot of the state (its tokens' logits from the first path that holds
  // them), and keep() runs the kept path again unless it is a prefix of the last path run. Each such run
  // of up to kMaxGemvTokens tokens is one multi-token decode step (the decode step's kernels over a token
  // grid, a graph per token count; a hybrid session's cold picks go to the CPU in one job per layer): token
  // t's logits are bitwise those of t + 1 decode steps. Longer runs go through the batched prefill (or
  // token by token) as before.
  void forward_pending(const int32_t* tokens, int n, const int* parents, float* logits_out) override;
  // Sequence::forward_pending_picks: the multi-token step's rows (a chain or a tree) or a chain's batched
  // prefill rows picked on the device (only the picks are copied back); runs token by token or path by
  // path pick on the host.
  void forward_pending_picks(const int32_t* tokens, int n, const int* parents, int32_t n_allowed,
                             int32_t* picks) override;
  void keep(const int* path, int m) override;
  bool has_pending() const override;
  // Sequence::set_hidden_record: every kept token's rmsnorm(x) * output_norm row (the MTP drafter's
  // record, which its GPU head copies back), or with layers its layer taps (copied inside the steps), is
  // copied to the host. Decode steps then go through forward(), which copies the logits too, rather than
  // the on-device pick. Fails, changing nothing, on a layer the model lacks or one listed twice.
  void set_hidden_record(std::shared_ptr<HiddenRecord> record) override;
  // Sequence::set_routing_trace: every kept token's picks are copied back and appended (decode steps
  // then go through forward(), as with a hidden record).
  void set_routing_trace(RoutingTraceWriter* trace, uint32_t stream) override;
  // Sequence::make_mtp_head: a GpuMtpHead when every expert is on the GPU, else null and why.
  std::unique_ptr<MtpHead> make_mtp_head(int max_ctx, std::string& why_cpu) override;
  // Sequence::make_dflash_head: the drafter's forward on this GPU (cuda/gpu_dflash.h), next to the
  // session's weights (all-GPU or hybrid), owned by the session (the drafter gets a GpuDFlashHeadRef);
  // null and why when it does not fit.
  std::unique_ptr<DFlashHead> make_dflash_head(const DFlashModel& drafter, int max_ctx, std::string& why_cpu) override;
  // Every DeltaNet layer's conv window, then its recurrent state, in layer order, copied to the host
  // (tests compare the state keep() leaves with a plain run's).
  std::vector<float> deltanet_state() const;

  // Runs one token and returns the arg-max of its logits, computed on the GPU (no logits copy).
  int32_t decode_argmax(int32_t token);

  // Sequence::decode_and_pick: with no penalties or logit bias, greedy picks take the arg-max on the
  // GPU over ids < n_allowed (lowest id among equals, as argmax_logit), and sampling (temperature,
  // top-k, top-p, min-p) draws on the GPU (cuda/sample_kernels.h) with the Sampler's uniform draw;
  // penalties and logit bias copy the logits and sample on the host (the default).
  int32_t decode_and_pick(int32_t token, Sampler& sampler, const std::vector<int32_t>& history, int32_t n_allowed,
                          std::vector<float>& scratch) override;

  void reset() override;
  int n_past() const override;
  int max_ctx() const override;
  const Model& model() const override;
  const std::shared_ptr<GpuModel>& gpu_model() const;
  size_t weight_bytes() const;    // bytes of weights in GPU memory (the shared model's)
  size_t state_bytes() const;     // KV cache, DeltaNet state and workspaces

  // Router selections of this sequence's steps and prefills: [n_layer x n_expert] (row-major), summed
  // since construction or the last reset_routing_counts(). Counting is always on (one atomic add per
  // pick), in all-GPU and hybrid sessions alike.
  std::vector<uint64_t> routing_counts() const;
  void reset_routing_counts();
  // Hybrid hot/cold experts (issue 8): whether expert_slots was given, and the counters of the cold
  // path (tokens, picks, cold picks per layer, CPU time, GPU wait). telemetry fails when not hybrid.
  bool hybrid() const;
  HybridTelemetry hybrid_telemetry() const;
  void reset_hybrid_telemetry();

  // Sequence::set_routing_counts / flush_routing_counts: the device counts this sequence's picks; a
  // flush (or detaching) moves what was counted since the last one into *counts (one small copy), so
  // the decode loop, its lookahead included, runs as without counting. n_tokens grows by the tokens
  // whose routes were counted (the busiest layer's picks / k). Implemented in gpu_session_routing.cpp.
  void set_routing_counts(RoutingCounts* counts) override;
  void flush_routing_counts() override;
  // Replayed routing (Sequence::set_routing_replay): every decode step and prefill takes its picks from
  // *source, in the order the tokens run (a dropped lookahead step has taken its token too).
  void set_routing_replay(RoutingSource* source) override;

 private:
  friend class GpuMtpHead;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  RoutingCounts* route_sink_ = nullptr;
};

// The model's MTP head (engine/mtp.h, block 0) on the GPU of an all-GPU session: the MTP layer's
// weights (DeviceModel::mtp) and a KV cache of its own, each row one CUDA graph of the decode step's
// launches (so the decode step's arithmetic: int8 activations for K-quant weights), chained rows fed
// their pick and output on the device. It runs on the session's stream, so the session must outlive
// it; the head's state (cache, n_past) belongs to the session: every head of one session shares it.
class GpuMtpHead final : public MtpHead {
 public:
  // Fails saying why when the session cannot run it (no MTP layer, hybrid experts). max_ctx is capped
  // at the session's.
  GpuMtpHead(GpuSession& session, int max_ctx);
  int n_past() const override;
  int max_ctx() const override { return max_ctx_; }
  void restart(int pos) override;
  void truncate(int pos) override;
  // One graph for the rows and chained rows, one read back of the picks (draft_staged where the rows
  // exceed one token grid).
  void draft(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
             std::vector<int32_t>& picks) override;
  // The same through rows() and chain()'s launches.
  void draft_staged(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
                    std::vector<int32_t>& picks);
  // draft's parts: n rows (returns the last row's pick); `count` chained rows.
  int32_t rows(const int32_t* tokens, const float* hidden, int n, int32_t n_allowed);
  void chain(int count, int32_t n_allowed, std::vector<int32_t>& picks);
  // The last row's logits ([n_vocab]), copied from the device.
  std::vector<float> logits() const;

 private:
  struct Staged {  // a call's inputs on the device, and where its picks land
    const int *pos = nullptr, *tokens = nullptr, *row_pos = nullptr;  // chained rows', rows', rows'
    const float* hidden = nullptr;
    int* d_picks = nullptr;
    int* h_picks = nullptr;  // pinned
  };
  void check_room(int rows) const;
  // Fails naming the first bad value: n_allowed outside 1..n_vocab, a token id outside the vocabulary.
  void check_inputs(const int32_t* tokens, int n, int32_t n_allowed) const;
  Staged stage(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed);
  void enqueue_rows(const Staged& st, int n, int32_t n_allowed);
  void enqueue_chain(const int* d_pos, int count, int32_t n_allowed, int* d_picks);
  void read_picks(const Staged& st, int count, std::vector<int32_t>& picks);

  GpuSession::Impl& m_;
  int max_ctx_ = 0;
};

std::unique_ptr<GpuSession> make_gpu_session(const Model& model, int max_ctx, GpuSessionOptions options = {});
std::unique_ptr<GpuSession> make_gpu_session(std::shared_ptr<GpuModel> model, int max_ctx,
                                             GpuSessionOptions options = {});

// Greedy continuation on the GPU (arg-max on the device, ties: lowest id): runs the prompt, then picks
// n_new tokens, feeding each back. Same result contract as strata::generate_greedy.
std::vector<int32_t> generate_greedy(GpuSession& session, const std::vector<int32_t>& prompt, int n_new);

}  // namespace strata::cuda
