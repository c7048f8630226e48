// A DFlash drafter's context and block (engine/dflash.h) on the GPU of a GPU target: the drafter's
// weights in device memory, every layer's context keys and values in a device cache (a row per
// position), and the block's forward as the decode step's kernels run it (gemv_batch token grids with the
// norms fused, attn_prep, attention_decode_split), sharing the target's token embedding and output
// matrix. The block's top-k per position is taken on the device, so a draft copies back a few ids and
// probabilities, not the logits. Same arithmetic as the CPU drafter up to float rounding (the tests
// compare the two).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/cuda/device_model.h"
#include "strata/engine/dflash.h"

namespace strata::cuda {

// Why this GPU cannot run the drafter's forward (empty: it can): shapes beyond the kernels' limits.
std::string gpu_dflash_unsupported(const DFlashModel& m);

class GpuDFlashHead final : public DFlashHead {
 public:
  // Uploads the drafter (m need not outlive the head); its cache holds positions below max_ctx (and the
  // block after them). The target's device model and stream must outlive the head: a GpuSession owns it
  // (GpuSession::make_dflash_head). Fails naming what does not fit (gpu_dflash_unsupported).
  GpuDFlashHead(const DFlashModel& m, const DeviceModel& target, cudaStream_t stream, int max_ctx);
  ~GpuDFlashHead() override;
  GpuDFlashHead(const GpuDFlashHead&) = delete;
  GpuDFlashHead& operator=(const GpuDFlashHead&) = delete;

  int max_ctx() const { return cap_ - c_.block; }
  int begin() const override { return pos0_; }
  int end() const override { return pos0_ + n_ctx_; }
  void restart(int pos) override;
  void add_context(const float* taps, int n) override;
  void logits(int32_t anchor, float* out) override;
  void candidates(int32_t anchor, int depth, int k, int32_t n_allowed, std::vector<PositionCandidates>& out) override;

 private:
  struct Layer {
    DevMatrix wq, wk, wv, wo, gate, up, down;
    const float *attn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr, *ffn_norm = nullptr;
    float *k_cache = nullptr, *v_cache = nullptr;
    float *kk = nullptr, *vv = nullptr;  // a context chunk's keys and values before attn_prep
  };
  template <class T>
  T* alloc(size_t n, const char* what);
  void release();
  const float* upload(const std::vector<float>& v);
  // Enqueues the block's forward (anchor at end()); its logits land in logits_dev_.
  void enqueue_block(int32_t anchor);

  const DFlashConfig c_;
  const DeviceModel& target_;
  cudaStream_t stream_;
  int cap_ = 0;  // cache rows: positions 0 .. cap_ - 1
  int pos0_ = 0, n_ctx_ = 0;
  std::vector<void*> allocs_;
  DevMatrix fc_;
  const float *hidden_norm_ = nullptr, *output_norm_ = nullptr;
  std::vector<Layer> layers_;
  int* iota_ = nullptr;               // iota_[p] = p: the positions attn_prep reads
  float* taps_ = nullptr;             // a context chunk's taps
  float* feat_ = nullptr;             // its fc rows (normed as the k/v jobs stage them)
  const float* mask_rows_ = nullptr;  // block rows 1.. before the first layer
  float *x_ = nullptr, *q_ = nullptr, *kb_ = nullptr, *vb_ = nullptr, *o_ = nullptr, *g_ = nullptr;
  float* logits_dev_ = nullptr;
  float* attn_scratch_ = nullptr;
  size_t attn_scratch_per_ = 0;
  unsigned int* attn_counters_ = nullptr;
  int* blk_dev_ = nullptr;   // [anchor, the block's attention position x block]
  int* blk_host_ = nullptr;  // pinned
  int *ids_dev_ = nullptr, *count_dev_ = nullptr;
  float* probs_dev_ = nullptr;
  int *ids_host_ = nullptr, *count_host_ = nullptr;  // pinned
  float* probs_host_ = nullptr;                      // pinned
  std::vector<float> logits_host_;
};

// What a drafter holds of its session's GpuDFlashHead: the session owns the head, so the head never
// outlives the session's stream and a drafter attached to the session again finds its context; the
// handle fails (strata::Error) once the session is gone.
class GpuDFlashHeadRef final : public DFlashHead {
 public:
  explicit GpuDFlashHeadRef(std::weak_ptr<GpuDFlashHead> head) : head_(std::move(head)) {}
  int begin() const override { return get()->begin(); }
  int end() const override { return get()->end(); }
  void restart(int pos) override { get()->restart(pos); }
  void add_context(const float* taps, int n) override { get()->add_context(taps, n); }
  void logits(int32_t anchor, float* out) override { get()->logits(anchor, out); }
  void candidates(int32_t anchor, int depth, int k, int32_t n_allowed, std::vector<PositionCandidates>& out) override {
    get()->candidates(anchor, depth, k, n_allowed, out);
  }

 private:
  std::shared_ptr<GpuDFlashHead> get() const;
  std::weak_ptr<GpuDFlashHead> head_;
};

}  // namespace strata::cuda
