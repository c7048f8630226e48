// The per-sequence state of a GPU session in device memory: the KV cache of every full-attention layer
// and the conv window + recurrent state of every DeltaNet layer, sized for max_ctx tokens. Shared by
// the decode step (gpu_session.cpp) and the batched prefill, which both read and extend it.
#pragma once

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

#include "strata/model/config.h"

namespace strata::cuda {

struct DeviceLayerState {
  float* k = nullptr;     // full attention: [max_ctx x kv_width], key rows after norm + rotary
  float* v = nullptr;     // [max_ctx x kv_width]
  float* conv = nullptr;  // DeltaNet: [(conv_kernel - 1) x conv_channels], oldest row first
  float* ssm = nullptr;   // [v_heads x dk x dv]
};

class DeviceSequenceState {
 public:
  // Allocates (and zeroes) every layer's buffers; fails (strata::Error) when the GPU runs out of memory.
  DeviceSequenceState(const ModelConfig& c, int max_ctx);
  ~DeviceSequenceState();
  DeviceSequenceState(const DeviceSequenceState&) = delete;
  DeviceSequenceState& operator=(const DeviceSequenceState&) = delete;

  // Clears the recurrent state (the KV cache needs no clearing: rows >= n_past are written before read).
  void reset(cudaStream_t s);

  const ModelConfig& config() const { return c_; }
  int max_ctx() const { return max_ctx_; }
  int kv_width() const { return c_.n_head_kv * c_.head_dim; }
  size_t bytes() const { return bytes_; }
  // Bytes this state needs for a model and context, without allocating (for the VRAM budget receipt).
  static size_t bytes_needed(const ModelConfig& c, int max_ctx);

  std::vector<DeviceLayerState> layers;
  int n_past = 0;  // tokens already in the state

 private:
  ModelConfig c_;
  int max_ctx_;
  size_t bytes_ = 0;
  std::vector<void*> allocs_;
};

}  // namespace strata::cuda
