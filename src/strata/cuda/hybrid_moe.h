// The seam between the GPU forward passes and the hybrid hot/cold expert execution (issue 8).
// When GpuSessionOptions::expert_slots is not empty, the decode step and the batched prefill hand each
// layer's whole MoE FFN (router, hot experts on the GPU, cold experts on the CPU, shared expert, combine)
// to a HybridMoe instead of running the all-GPU MoE kernels. The implementation lives in hybrid_*.cpp/.cu.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "strata/cuda/device_model.h"
#include "strata/cuda/gpu_session.h"
#include "strata/cuda/hybrid_types.h"

namespace strata::cuda {

class HybridMoe {
 public:
  virtual ~HybridMoe() = default;
  // Decode: enqueues layer il's MoE FFN for one token: xn (device, n_embd floats, the FFN-normed
  // hidden state) in, x (device, the residual stream) += the FFN output; seq_picks (device, the
  // sequence's [n_expert] counts of layer il, optional) += the token's picks. Must be graph-capturable
  // (the decode step is one CUDA graph per token).
  virtual void enqueue_decode(int il, const float* xn, float* x, unsigned long long* seq_picks, cudaStream_t s) = 0;

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
  // Counters since construction or the last reset (reads device counters: call between steps).
  virtual HybridTelemetry telemetry() const = 0;
  virtual void reset_telemetry() = 0;
};

// Builds the hybrid MoE for a model whose DeviceModel holds only the hot experts (expert_slots).
std::unique_ptr<HybridMoe> make_hybrid_moe(const Model& model, const DeviceModel& dm, const GpuSessionOptions& opt);

}  // namespace strata::cuda
