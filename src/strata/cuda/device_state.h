// The per-sequence state of a GPU session in device memory: the KV cache of every full-attention layer
// and the conv window + recurrent state of every DeltaNet layer, sized for max_ctx tokens. Shared by
// the decode step (gpu_session.cpp) and the batched prefill, which both read and extend it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "strata/cuda/kernels.h"
#include "strata/model/config.h"
#include "strata/model/kv_type.h"

namespace strata::cuda {

// cudaMalloc of `bytes` (1 when 0), zeroed; fails (strata::Error) naming the context when the GPU is out
// of memory. The caller frees it.
void* alloc_state_bytes(size_t bytes, int max_ctx);

struct DeviceLayerState {
  // Attention: [rows x kv_width] key rows after norm + rotary, and value rows, as kv's types (float or
  // __half elements); rows = max_ctx, or a sliding layer's ring (attention_cache_rows, as the CPU's):
  // position p in row p % rows.
  void* k = nullptr;
  void* v = nullptr;
  int rows = 0;
  KvCacheTypes kv;
  float* conv = nullptr;  // DeltaNet: [(conv_kernel - 1) x conv_channels], oldest row first
  float* ssm = nullptr;   // [v_heads x dk x dv]
  // The other buffers of ping-pong pairs (add_alternates): a decode step reads conv/ssm and writes
  // these, and the session swaps the two when it keeps the step (a step it drops leaves conv/ssm as
  // they were: the decode lookahead's rollback). Null: steps update conv/ssm in place.
  float* conv_alt = nullptr;
  float* ssm_alt = nullptr;
  // save_snapshot's copies of conv/ssm (add_snapshot).
  float* conv_snap = nullptr;
  float* ssm_snap = nullptr;
  // The conv/ssm state after each token of a pending run (reserve_steps: step_cap() of each), so that
  // keeping a prefix of the run copies one of them back instead of running the prefix again.
  float* conv_steps = nullptr;
  float* ssm_steps = nullptr;
};

class DeviceSequenceState {
 public:
  // Allocates (and zeroes) every layer's buffers; fails (strata::Error) when the GPU runs out of memory
  // or for a cache type the GPU does not store (check_gpu_kv_types, model/kv_type.h).
  DeviceSequenceState(const ModelConfig& c, int max_ctx, KvCacheTypes kv = {});
  ~DeviceSequenceState();
  DeviceSequenceState(const DeviceSequenceState&) = delete;
  DeviceSequenceState& operator=(const DeviceSequenceState&) = delete;

  // Clears the recurrent state (the KV cache needs no clearing: rows >= n_past are written before read).
  void reset(cudaStream_t s);
  // Allocates conv_alt / ssm_alt for every DeltaNet layer (once; counted in bytes()).
  void add_alternates();
  // Swaps conv <-> conv_alt and ssm <-> ssm_alt in every layer; parity() flips.
  void swap_alternates();
  int parity() const { return parity_; }
  // Allocates the snapshot buffers (once; counted in bytes()). save_snapshot copies the DeltaNet
  // conv/ssm state aside, restore_snapshot puts it back; the KV cache needs neither (rows >= n_past are
  // written before read), and the caller keeps the position it returns to.
  void add_snapshot();
  void save_snapshot(cudaStream_t s);
  void restore_snapshot(cudaStream_t s);
  // Their copies appended to `copies`, for a caller that adds its own to the same launch (copy_batch).
  void snapshot_copies(bool save, std::vector<DeviceCopy>& copies) const;

  // Step records of pending runs (speculative verification): room for the state after each of n tokens
  // (grown when n exceeds what is there; contents are not kept then), plus each token's expert ids,
  // route_steps: [step_cap x n_layer x n_expert_used] (-1 where a layer routes nothing). Whoever runs
  // the tokens writes step t: the batched prefill from its kernels, the decode step by record_step.
  void reserve_steps(int n);
  int step_cap() const { return step_cap_; }
  int* route_steps = nullptr;
  // Copies the live conv/ssm state into step t.
  void record_step(int t, cudaStream_t s);
  // Makes step t's record the live conv/ssm state (the caller sets n_past).
  void select_step(int t, cudaStream_t s);
  // One layer's parts of step t's record, for runs whose kernels write the records (the multi-token
  // decode step): the conv window and the ssm state.
  float* conv_step(const DeviceLayerState& L, int t) const;
  float* ssm_step(const DeviceLayerState& L, int t) const;

  const ModelConfig& config() const { return c_; }
  // Floats of one DeltaNet layer's conv window and recurrent state (a step record holds one of each).
  size_t conv_window_floats() const;
  size_t ssm_state_floats() const;
  int max_ctx() const { return max_ctx_; }
  int kv_width() const { return c_.n_head_kv * c_.head_dim; }
  size_t bytes() const { return bytes_; }

  std::vector<DeviceLayerState> layers;
  int n_past = 0;  // tokens already in the state

 private:
  ModelConfig c_;
  int max_ctx_;
  size_t bytes_ = 0;
  int parity_ = 0;
  bool has_snapshot_ = false;
  int step_cap_ = 0;
  std::vector<void*> allocs_;
  std::vector<void*> step_allocs_;  // the step records (replaced when they grow)
  size_t step_bytes_ = 0;
  void release_steps();
  void copy_step(int t, bool record, cudaStream_t s);
  float* alloc(size_t floats);
  void* alloc_bytes(size_t bytes);
  void copy_snapshot(bool save, cudaStream_t s);
};

}  // namespace strata::cuda
