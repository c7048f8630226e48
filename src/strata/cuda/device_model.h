// The model's weights copied into GPU memory: every matrix and expert stack as a DevMatrix (raw blocks,
// same layout as the GGUF file, rows packed), every small float vector as a device array. Built from the
// backend-neutral ModelWeights; owns its allocations.
#pragma once

#include <cstddef>
#include <vector>

#include "strata/cuda/kernels.h"
#include "strata/engine/model.h"

namespace strata::cuda {

struct DevAttention {
  DevMatrix q, k, v, o;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
};

struct DevDeltaNet {
  DevMatrix qkv, gate, beta, alpha, out;
  const float *conv = nullptr, *a = nullptr, *dt_bias = nullptr, *norm = nullptr;
};

struct DevMoe {
  DevMatrix router, gate, up, down;
  bool has_shared = false;
  DevMatrix shared_gate_inp, shared_gate, shared_up, shared_down;
};

struct DevLayer {
  LayerKind kind = LayerKind::FullAttention;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  DevAttention attn;
  DevDeltaNet deltanet;
  DevMoe moe;
};

class DeviceModel {
 public:
  // Uploads every weight; fails (strata::Error) on a weight type the CUDA kernels do not support,
  // naming the tensor, or when the GPU runs out of memory.
  explicit DeviceModel(const Model& model);
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  const ModelConfig& config() const { return config_; }
  DevMatrix token_embd, output;
  const float* output_norm = nullptr;
  std::vector<DevLayer> layers;
  size_t bytes() const { return bytes_; }

 private:
  void* alloc(size_t n);
  DevMatrix upload(const WeightMatrix& w, const char* what, int layer);
  DevMatrix upload(const ExpertStack& s, const char* what, int layer);
  const float* upload(const std::vector<float>& v);

  ModelConfig config_;
  std::vector<void*> allocations_;
  size_t bytes_ = 0;
};

}  // namespace strata::cuda
