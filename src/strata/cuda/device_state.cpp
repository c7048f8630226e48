#include "strata/cuda/device_state.h"

#include <utility>
#include <vector>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/kernels.h"
#include "strata/engine/sequence_state.h"

namespace strata::cuda {
namespace {

size_t conv_floats(const ModelConfig& c) {
  return static_cast<size_t>(c.ssm_conv_kernel - 1) * static_cast<size_t>(c.ssm_conv_channels());
}
size_t ssm_floats(const ModelConfig& c) {
  return static_cast<size_t>(c.ssm_v_heads) * c.ssm_head_k * c.ssm_head_v;
}
size_t kv_bytes(const ModelConfig& c, int64_t rows, KvType t) {
  return static_cast<size_t>(rows) * kv_row_bytes(t, static_cast<int64_t>(c.n_head_kv) * c.head_dim);
}

}  // namespace

void* alloc_state_bytes(size_t bytes, int max_ctx) {
  if (bytes == 0) bytes = 1;
  void* p = device_alloc(bytes, cat("the sequence state (context ", max_ctx, ")"));
  const cudaError_t z = cudaMemset(p, 0, bytes);
  if (z != cudaSuccess) {
    device_free(p);
    check_cuda(z, "cudaMemset");
  }
  return p;
}

void* DeviceSequenceState::alloc_bytes(size_t bytes) {
  if (bytes == 0) bytes = 1;
  void* p = alloc_state_bytes(bytes, max_ctx_);
  allocs_.push_back(p);
  bytes_ += bytes;
  return p;
}

float* DeviceSequenceState::alloc(size_t floats) { return static_cast<float*>(alloc_bytes(floats * sizeof(float))); }

DeviceSequenceState::DeviceSequenceState(const ModelConfig& c, int max_ctx, KvCacheTypes kv) : c_(c), max_ctx_(max_ctx) {
  if (max_ctx <= 0) fail("context size must be positive, got ", max_ctx);
  check_kv_types(c, kv);
  check_gpu_kv_types(kv);
  try {
    layers.resize(static_cast<size_t>(c.n_layer));
    for (int il = 0; il < c.n_layer; ++il) {
      DeviceLayerState& L = layers[il];
      if (is_attention(c.mixer(il))) {
        L.kv = kv;
        L.rows = static_cast<int>(attention_cache_rows(c, il, max_ctx));
        L.k = alloc_bytes(kv_bytes(c, L.rows, kv.k));
        L.v = alloc_bytes(kv_bytes(c, L.rows, kv.v));
      } else {
        L.conv = alloc(conv_floats(c));
        L.ssm = alloc(ssm_floats(c));
      }
    }
  } catch (...) {
    for (void* p : allocs_) device_free(p);
    throw;
  }
}

void DeviceSequenceState::add_alternates() {
  for (DeviceLayerState& L : layers) {
    if (L.conv && !L.conv_alt) L.conv_alt = alloc(conv_floats(c_));
    if (L.ssm && !L.ssm_alt) L.ssm_alt = alloc(ssm_floats(c_));
  }
}

void DeviceSequenceState::swap_alternates() {
  for (DeviceLayerState& L : layers) {
    if (L.conv_alt) std::swap(L.conv, L.conv_alt);
    if (L.ssm_alt) std::swap(L.ssm, L.ssm_alt);
  }
  parity_ ^= 1;
}

void DeviceSequenceState::add_snapshot() {
  for (DeviceLayerState& L : layers) {
    if (L.conv && !L.conv_snap) L.conv_snap = alloc(conv_floats(c_));
    if (L.ssm && !L.ssm_snap) L.ssm_snap = alloc(ssm_floats(c_));
  }
  has_snapshot_ = true;
}

void DeviceSequenceState::save_snapshot(cudaStream_t s) {
  if (!has_snapshot_) fail("sequence state: save_snapshot before add_snapshot");
  copy_snapshot(true, s);
}

void DeviceSequenceState::restore_snapshot(cudaStream_t s) {
  copy_snapshot(false, s);
}

namespace {
// A layer state's copy between its live buffer and another one (a snapshot, a step record): from the
// live buffer into the other, or back.
void push_copy(std::vector<DeviceCopy>& copies, bool from_live, float* live, float* other, size_t floats) {
  DeviceCopy c;
  c.dst = from_live ? other : live;
  c.src = from_live ? live : other;
  c.row_bytes = sizeof(float) * floats;
  copies.push_back(c);
}
}  // namespace

void DeviceSequenceState::copy_snapshot(bool save, cudaStream_t s) {
  std::vector<DeviceCopy> copies;
  snapshot_copies(save, copies);
  copy_batch(copies, s);
}

void DeviceSequenceState::snapshot_copies(bool save, std::vector<DeviceCopy>& copies) const {
  for (const DeviceLayerState& L : layers) {
    if (L.conv) push_copy(copies, save, L.conv, L.conv_snap, conv_floats(c_));
    if (L.ssm) push_copy(copies, save, L.ssm, L.ssm_snap, ssm_floats(c_));
  }
}

void DeviceSequenceState::release_steps() {
  for (void* p : step_allocs_) device_free(p);
  step_allocs_.clear();
  bytes_ -= step_bytes_;
  step_bytes_ = 0;
  step_cap_ = 0;
  route_steps = nullptr;
  for (DeviceLayerState& L : layers) L.conv_steps = L.ssm_steps = nullptr;
}

void DeviceSequenceState::reserve_steps(int n) {
  if (n <= step_cap_) return;
  // Nothing on any stream may still use the old records, and the memsets below (on the legacy stream)
  // must precede the sequence's non-blocking stream: both sides synchronised.
  check_cuda(cudaDeviceSynchronize(), "grow step records");
  release_steps();
  auto take = [this](size_t bytes) {
    void* p = alloc_state_bytes(bytes, max_ctx_);
    step_allocs_.push_back(p);
    step_bytes_ += bytes;
    bytes_ += bytes;
    return p;
  };
  try {
    const size_t steps = static_cast<size_t>(n);
    for (DeviceLayerState& L : layers) {
      if (!L.ssm) continue;
      L.conv_steps = static_cast<float*>(take(steps * conv_floats(c_) * sizeof(float)));
      L.ssm_steps = static_cast<float*>(take(steps * ssm_floats(c_) * sizeof(float)));
    }
    const size_t route_bytes = steps * static_cast<size_t>(c_.n_layer) * c_.n_expert_used * sizeof(int);
    route_steps = static_cast<int*>(take(route_bytes));
    check_cuda(cudaMemset(route_steps, 0xff, route_bytes), "cudaMemset(route steps)");  // -1: routes nothing
    check_cuda(cudaDeviceSynchronize(), "grow step records");
  } catch (...) {
    release_steps();
    throw;
  }
  step_cap_ = n;
}

void DeviceSequenceState::copy_step(int t, bool record, cudaStream_t s) {
  if (t < 0 || t >= step_cap_) fail("sequence state: step ", t, " outside the ", step_cap_, " recorded");
  std::vector<DeviceCopy> copies;
  for (const DeviceLayerState& L : layers) {
    if (!L.ssm) continue;
    push_copy(copies, record, L.conv, conv_step(L, t), conv_floats(c_));
    push_copy(copies, record, L.ssm, ssm_step(L, t), ssm_floats(c_));
  }
  copy_batch(copies, s);
}

void DeviceSequenceState::record_step(int t, cudaStream_t s) { copy_step(t, true, s); }

size_t DeviceSequenceState::conv_window_floats() const { return conv_floats(c_); }
size_t DeviceSequenceState::ssm_state_floats() const { return ssm_floats(c_); }

float* DeviceSequenceState::conv_step(const DeviceLayerState& L, int t) const {
  if (t < 0 || t >= step_cap_) fail("sequence state: step ", t, " outside the ", step_cap_, " recorded");
  return L.conv_steps + static_cast<size_t>(t) * conv_floats(c_);
}

float* DeviceSequenceState::ssm_step(const DeviceLayerState& L, int t) const {
  if (t < 0 || t >= step_cap_) fail("sequence state: step ", t, " outside the ", step_cap_, " recorded");
  return L.ssm_steps + static_cast<size_t>(t) * ssm_floats(c_);
}
void DeviceSequenceState::select_step(int t, cudaStream_t s) { copy_step(t, false, s); }

DeviceSequenceState::~DeviceSequenceState() {
  for (void* p : step_allocs_) device_free(p);
  for (void* p : allocs_) device_free(p);
}

void DeviceSequenceState::reset(cudaStream_t s) {
  n_past = 0;
  for (const DeviceLayerState& L : layers) {
    if (L.conv) check_cuda(cudaMemsetAsync(L.conv, 0, sizeof(float) * conv_floats(c_), s), "reset conv state");
    if (L.ssm) check_cuda(cudaMemsetAsync(L.ssm, 0, sizeof(float) * ssm_floats(c_), s), "reset DeltaNet state");
  }
}

}  // namespace strata::cuda
