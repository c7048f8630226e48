// A DFlash drafter's context and block (engine/dflash.h) on the GPU of a GPU target: the drafter's
// weights in device memory, every layer's context keys and values in a device cache (a row per
// position), and the block's forward as the decode step's kernels run it (gemv_batch token grids with the
// norms fused, attn_prep, attention_decode_split), sharing the target's token embedding and output
// matrix. The block's top-k per position is taken on the device, so a draft copies back a few ids and
// probabilities, not the logits. Same arithmetic as the CPU drafter up to float rounding (the tests
// compare the two).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
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
  // (GpuSession::make_dflash_head). Fails naming what does not fit (gpu_dflash_unsupported). With
  // use_graph a draft (the context rows added since the last one, the block, the top-k and the copy back)
  // is one graph replay per (pending rows, k, allowed ids).
  GpuDFlashHead(const DFlashModel& m, const DeviceModel& target, cudaStream_t stream, int max_ctx, bool use_graph);
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
  // The staged inputs' ints (in_host_ / in_dev_): the anchor, each block row's attention position, the
  // block rows' positions, the first position the block attends, the pending context rows' positions.
  int at_anchor() const { return 0; }
  int at_attend() const { return 1; }
  int at_rows() const { return 1 + c_.block; }
  int at_first() const { return 1 + 2 * c_.block; }
  int at_context() const { return 2 + 2 * c_.block; }
  // Stages the block's ints for the anchor (the context complete: end() is the block's first position).
  void stage_block(int32_t anchor);
  // Enqueues the copy of the staged ints and the first n pending taps rows, then those rows' context.
  void enqueue_context(int n);
  // Enqueues the block's forward after the context; its logits land in logits_dev_.
  void enqueue_block();
  // The pending context rows' forward, now (their staging area is full).
  void flush_context();
  // work(); when it throws, waits for the stream and drops the context (pending rows included) first.
  template <class F>
  void guarded(F work);
  // enqueue() as a graph kept under key (captured on first use), or launched directly without graphs.
  template <class F>
  void run(const std::array<int, 3>& key, F enqueue);
  void destroy_graphs();
  // The candidates' arrays in an out_bytes_ buffer (device or pinned host).
  struct Candidates {
    int* ids;
    float* probs;
    int* count;
  };
  Candidates candidates_at(unsigned char* base) const;

  const DFlashConfig c_;
  const DeviceModel& target_;
  cudaStream_t stream_;
  bool use_graph_;
  int cap_ = 0;  // cache rows: positions 0 .. cap_ - 1
  int pos0_ = 0, n_ctx_ = 0;
  int pending_ = 0;  // context rows staged, not yet run (the last ones before end())
  std::vector<void*> allocs_;
  DevMatrix fc_;
  const float *hidden_norm_ = nullptr, *output_norm_ = nullptr;
  std::vector<Layer> layers_;
  size_t ints_bytes_ = 0;             // the staged ints, padded; the taps rows follow them
  unsigned char* in_host_ = nullptr;  // pinned
  unsigned char* in_dev_ = nullptr;   // the staged inputs on the device
  float* feat_ = nullptr;             // the context chunk's fc rows (normed as the k/v jobs stage them)
  const float* mask_rows_ = nullptr;  // block rows 1.. before the first layer
  float *x_ = nullptr, *q_ = nullptr, *kb_ = nullptr, *vb_ = nullptr, *o_ = nullptr, *g_ = nullptr;
  float* logits_dev_ = nullptr;
  float* attn_scratch_ = nullptr;
  size_t attn_scratch_per_ = 0;
  unsigned int* attn_counters_ = nullptr;
  // The candidates: ids [(block - 1) x kRowTopkMax], probabilities alike, counts [block - 1], read back
  // in one copy.
  size_t out_bytes_ = 0;
  unsigned char* out_dev_ = nullptr;
  unsigned char* out_host_ = nullptr;                     // pinned
  std::map<std::array<int, 3>, cudaGraphExec_t> graphs_;  // by (pending rows, k, n_allowed)
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
