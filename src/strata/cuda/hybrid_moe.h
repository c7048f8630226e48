// The seam between the GPU forward passes and the hybrid hot/cold expert execution (issue 8).
// When GpuSessionOptions::expert_slots is not empty, the decode step runs each MoE layer through the
// all-GPU launches over the layer's hot experts and asks a HybridMoe to route, post the cold picks to
// the CPU and add their rows back; the batched prefill hands it the cold pairs of each chunk. The
// implementation lives in hybrid_*.cpp/.cu.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "strata/cuda/device_model.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/hybrid_stream.h"
#include "strata/cuda/hybrid_types.h"
#include "strata/cuda/kernels.h"

namespace strata::cuda {

// The tokens of one hybrid step: n (1..kHybridMaxTokens) and the strides from token t to t + 1 of the
// router logits and the residual rows (ids and weights: k; replayed picks: RouteRule::replay_stride).
struct HybridTokens {
  int n = 1;
  int64_t logits = 0, x = 0;
};

class HybridMoe {
 public:
  virtual ~HybridMoe() = default;
  // Decode (GpuSession's step): the session runs the router launch and the hot and shared experts
  // through the all-GPU launches, their routed jobs reading device_slot_map(il) (a cold pick gives zeros
  // there), and calls, all graph-capturable:
  //   route_decode after the router launch: the top-k of logits under rule (the layer's routing, the
  //     session's for every GPU path, replayed picks included; the session's own launches route the same
  //     way and store the sequence's ids / weights), the model's counters, and the cold picks posted to
  //     the CPU with rmsnorm(x) * norm_w as their input. It runs on a side stream forked from s, beside
  //     the hot experts' launch, which does not wait for it (one block: the session leaves it a slot);
  //   join_post before anything writes x again (the down projection): s waits for the posting, which
  //     reads x;
  //   cold_add once the hot experts are in x: waits for the CPU's cold rows and adds them into x.
  // The multi-token step (verification) passes its tokens (HybridTokens): one job for all of them, the
  // CPU computing each cold expert once for the tokens that picked it, and each token's results what its
  // own decode step gives.
  virtual void route_decode(int il, const float* logits, const float* x, const float* norm_w, cudaStream_t s,
                            const RouteRule& rule, const HybridTokens& tokens) = 0;
  virtual void join_post(cudaStream_t s) = 0;
  virtual void cold_add(int il, float* x, const int* ids, const float* weights, cudaStream_t s,
                        const HybridTokens& tokens) = 0;
  // A dropped decode lookahead step: its picks (ids: [n_layer x k]) leave the model's counters.
  virtual void uncount_decode(const int* ids, cudaStream_t s) = 0;
  // Sequences share the mailbox and the CPU pool, and a lookahead step may still run after its sequence
  // let go of the model: every hybrid step or prefill is ordered on the device after the last one any
  // sequence enqueued (an event; no host wait). Call both with the model's exclusive() held.
  virtual void order_after_last(cudaStream_t s) = 0;
  virtual void record_last(cudaStream_t s) = 0;

  // Grouped batched prefill (GpuPrefill, prefill.cpp): the prefill routes a chunk of n tokens on the GPU,
  // groups the (token, slot) pairs by expert with this layer's slot map and runs the hot experts with
  // its grouped GEMMs; the HybridMoe computes the cold pairs on the CPU, grouped by expert, meanwhile:
  //   device_slot_map(il): [n_expert] device ints, the slot of each expert in the layer's hot stack or -1;
  //   hot_experts(il): how many experts of layer il are resident (0: skip the GPU expert GEMMs);
  //   cold_batch_begin: after routing (ids [n x k], counts [n_expert] picks per expert, xn [n x n_embd],
  //     all device, ready in stream order on s): counts the picks into the telemetry and, when the layer
  //     has cold experts, enqueues the copies of ids and xn to host memory on s;
  //   cold_batch_finish: waits for those copies only (the hot GEMMs enqueued since keep the GPU busy),
  //     computes every cold pair on the CPU pool, and enqueues on s the upload of the results into the
  //     sorted expert-output rows ye[pair_row[t * k + j]] (n_embd floats each) of the cold pairs.
  // Between the two the caller enqueues the hot experts; after finish, its combine reads every row.
  virtual const int* device_slot_map(int il) const = 0;
  virtual int hot_experts(int il) const = 0;
  virtual void cold_batch_begin(int il, const int* ids, const int* counts, const float* xn, int n, cudaStream_t s) = 0;
  virtual void cold_batch_finish(int il, const int* pair_row, float* ye, int n, cudaStream_t s) = 0;
  // Streaming prefill (hybrid_stream.h; nothing streams when the session was built without it):
  //   stream_chunk: a prefill chunk of n tokens starts (the cost model decides whether its layers stream
  //     and their first copies start);
  //   stream_acquire(il): after the hot experts are enqueued: s waits for layer il's copies; n == 0 when
  //     its cold experts run on the CPU this chunk (cold_batch_* then computes them, else it skips them);
  //   stream_release(il): every read of the layer's buffer is enqueued on s.
  virtual void stream_chunk(int n) = 0;
  virtual StreamedLayer stream_acquire(int il, cudaStream_t s) = 0;
  virtual void stream_release(int il, cudaStream_t s) = 0;
  // Counters since construction or the last reset (reads device counters: call between steps).
  virtual HybridTelemetry telemetry() const = 0;
  virtual void reset_telemetry() = 0;
};

// Builds the hybrid MoE for a model whose DeviceModel holds only the hot experts (expert_slots).
std::unique_ptr<HybridMoe> make_hybrid_moe(const Model& model, const DeviceModel& dm, const GpuSessionOptions& opt);

}  // namespace strata::cuda
