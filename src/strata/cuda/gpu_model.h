// The GPU side of a model, made once and shared by any number of GPU sequences (GpuSession: KV cache,
// DeltaNet state, decode graphs, each on its own stream): the weights in device memory (with an expert
// plan only the hot experts), the hybrid hot/cold MoE with its CPU pool for the cold experts, and the
// batched prefill's workspaces and half-precision weight cache (made on first use). The prefill and the
// hybrid MoE have one set of buffers each, so a sequence holds exclusive() while it runs either; the
// all-GPU decode step uses only its sequence's buffers and runs concurrently with other sequences.
// Plain C++ header: include it only where STRATA_HAVE_CUDA is defined.
#pragma once

#include <memory>
#include <mutex>

#include "strata/cuda/gpu_session.h"

namespace strata::cuda {

class DeviceModel;
class GpuPrefill;
class HybridMoe;

class GpuModel {
 public:
  // Uploads the weights (fails on an unsupported weight type, naming the tensor, or when the GPU runs out
  // of memory) and, with opt.expert_slots, starts the hybrid MoE. The model must outlive this object.
  GpuModel(const Model& model, const GpuSessionOptions& opt);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  const Model& model() const { return model_; }
  const DeviceModel& device() const { return *dm_; }
  HybridMoe* hybrid() const { return hybrid_.get(); }
  // The batched prefill, made on first use; call with exclusive() held.
  GpuPrefill& prefill();
  std::mutex& exclusive() { return exclusive_; }
  // The MTP blocks on the device (DeviceModel::upload_mtp), uploaded on first use: only a GPU MTP head
  // pays their memory. Takes exclusive().
  const DeviceModel& device_with_mtp();

 private:
  const Model& model_;
  GpuSessionOptions opt_;
  std::unique_ptr<DeviceModel> dm_;
  std::unique_ptr<HybridMoe> hybrid_;
  std::unique_ptr<GpuPrefill> prefill_;
  std::mutex exclusive_;
};

std::shared_ptr<GpuModel> make_gpu_model(const Model& model, const GpuSessionOptions& opt = {});

}  // namespace strata::cuda
