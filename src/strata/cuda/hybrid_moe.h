// The seam between the GPU forward passes and the hybrid hot/cold expert execution (issue 8).
// When GpuSessionOptions::expert_slots is not empty, the decode step and the batched prefill hand each
// layer's whole MoE FFN (router, hot experts on the GPU, cold experts on the CPU, shared expert, combine)
// to a HybridMoe instead of running the all-GPU MoE kernels. The implementation lives in hybrid_*.cpp/.cu.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "strata/cuda/device_model.h"
#include "strata/cuda/gpu_session.h"

namespace strata::cuda {

class HybridMoe {
 public:
  virtual ~HybridMoe() = default;
  // Decode: enqueues layer il's MoE FFN for one token: xn (device, n_embd floats, the FFN-normed
  // hidden state) in, x (device, the residual stream) += the FFN output. Must be graph-capturable
  // (the decode step is one CUDA graph per token).
  virtual void enqueue_decode(int il, const float* xn, float* x, cudaStream_t s) = 0;
  // Prefill: the same for n tokens (xn and x are [n x n_embd], row-major). May synchronise.
  virtual void run_batch(int il, const float* xn, float* x, int n, cudaStream_t s) = 0;
};

// Builds the hybrid MoE for a model whose DeviceModel holds only the hot experts (expert_slots).
std::unique_ptr<HybridMoe> make_hybrid_moe(const Model& model, const DeviceModel& dm, const GpuSessionOptions& opt);

}  // namespace strata::cuda
