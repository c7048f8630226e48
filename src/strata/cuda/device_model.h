// The model's weights copied into GPU memory: every matrix and expert stack as a DevMatrix (raw blocks,
// same layout as the GGUF file, rows packed), every small float vector as a device array. Built from the
// backend-neutral ModelWeights; owns its allocations.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "strata/cuda/kernels.h"
#include "strata/engine/model.h"

namespace strata::cuda {

struct DevAttention {  // full and sliding-window attention
  DevMatrix q, k, v, o;
  DevMatrix gate;  // attn_gate (ModelConfig::attn_gate != None): softplus output gate rows
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
};

struct DevDeltaNet {
  DevMatrix qkv, gate, beta, alpha, out;
  const float *conv = nullptr, *a = nullptr, *dt_bias = nullptr, *norm = nullptr;
};

struct DevMoe {
  DevMatrix router, gate, up, down;
  const float* selection_bias = nullptr;  // exp_probs_b (sigmoid routers), or null
  bool has_shared = false;
  bool shared_gated = false;  // shared_gate_inp is uploaded only then
  DevMatrix shared_gate_inp, shared_gate, shared_up, shared_down;
};

struct DevDenseFfn {  // FfnKind::Dense: a SwiGLU of n_ff
  DevMatrix gate, up, down;
};

struct DevLayer {
  LayerKind kind = LayerKind::FullAttention;
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  FfnKind ffn = FfnKind::Moe;
  DevAttention attn;
  DevDeltaNet deltanet;
  DevMoe moe;
  DevDenseFfn dense;
};

// An MTP block (ModelWeights::mtp): its layer, eh_proj and norms; the token embedding and lm_head are
// the trunk's.
struct DevMtp {
  DevLayer layer;
  DevMatrix eh_proj;
  const float* enorm = nullptr;
  const float* hnorm = nullptr;
  const float* shared_head_norm = nullptr;
};

// The router rule of a model's MoE layers (kernels.h RouteRule) with a layer's selection bias.
inline RouteRule route_rule(const ModelConfig& c, const float* selection_bias) {
  RouteRule r;
  r.sigmoid = c.router == RouterKind::Sigmoid;
  r.softcap = c.router_softcap;
  r.bias = selection_bias;
  r.scale = c.expert_weights_scale;
  return r;
}

class DeviceModel {
 public:
  // Uploads every weight; fails (strata::Error) on a weight type the CUDA kernels do not support,
  // naming the tensor, or when the GPU runs out of memory.
  // expert_slots (issue 8): empty = every routed expert resident. Otherwise [layer][expert] -> slot in
  // that layer's GPU expert stacks, slots 0..n_hot-1 given in ascending expert id, or -1 = cold: the
  // layer's gate/up/down stacks then hold only the hot experts in slot order (n_expert = n_hot) and
  // cold experts are never uploaded (the CPU reads them from the mapped GGUF). A malformed map fails
  // with a message naming the layer and expert.
  // cache_slots ([layer], with expert_slots only): that many more slots after the hot ones in each
  // layer's stacks, allocated and left unfilled (the hybrid MoE's expert cache fills them).
  explicit DeviceModel(const Model& model, const std::vector<std::vector<int>>& expert_slots = {},
                       const std::vector<int>& cache_slots = {});
  ~DeviceModel();
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;

  const ModelConfig& config() const { return config_; }
  DevMatrix token_embd, output;
  const float* output_norm = nullptr;
  std::vector<DevLayer> layers;
  std::vector<DevMtp> mtp;  // the model's MTP blocks once upload_mtp has run, else none
  // Uploads the model's MTP blocks (ModelWeights::mtp) unless they are; fails on a hybrid model (its
  // VRAM is planned for experts) or as the constructor does. Not thread-safe (GpuModel locks).
  void upload_mtp(const Model& model);
  size_t bytes() const { return bytes_; }
  // The slot map the model was built with (empty: all experts resident).
  const std::vector<std::vector<int>>& expert_slots() const { return expert_slots_; }
  bool hybrid() const { return !expert_slots_.empty(); }
  size_t expert_bytes() const { return expert_bytes_; }  // bytes of routed-expert stacks uploaded

 private:
  void* alloc(size_t n);
  DevMatrix upload(const WeightMatrix& w, const char* what, int layer);
  DevMatrix upload(const ExpertStack& s, const char* what, int layer, const std::vector<int>* slots, int extra_slots);
  const float* upload(const std::vector<float>& v);
  // A layer's weights; l names its tensors in errors, slots / extra as expert_slots / cache_slots.
  DevLayer upload_layer(const LayerWeights& L, const LayerSpec& spec, int l, const std::vector<int>* slots, int extra);

  ModelConfig config_;
  std::vector<void*> allocations_;
  size_t bytes_ = 0;
  size_t expert_bytes_ = 0;
  std::vector<std::vector<int>> expert_slots_;
};

// w's rows packed into device memory that alloc(bytes) returns; fails (strata::Error) on a type the CUDA
// kernels do not support, naming the tensor.
DevMatrix upload_matrix(const WeightMatrix& w, const std::string& name, const std::function<void*(size_t)>& alloc);
// v copied into device memory that alloc(bytes) returns.
const float* upload_floats(const std::vector<float>& v, const std::function<void*(size_t)>& alloc);

// Checks a slot map against the model (one row per layer, one entry per expert, hot slots numbered
// 0..n_hot-1 in ascending expert id, everything else -1); fails naming the layer and expert.
// Returns the hot count per layer.
std::vector<int> validate_expert_slots(const Model& model, const std::vector<std::vector<int>>& expert_slots);

}  // namespace strata::cuda
