#include "strata/cuda/gpu_dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/matvec_kernels.h"
#include "strata/moe/gpu_support.h"

namespace strata::cuda {
namespace {

// Context rows per launch: a token grid's most.
constexpr int kChunk = kMaxGemvTokens;

GemvJob job(const DevMatrix& w, const float* x, float* y, int64_t x_stride, int64_t y_stride,
            GemvMode mode = GemvMode::Store, const float* norm_w = nullptr, float eps = 0.0f) {
  GemvJob j;
  j.w = &w;
  j.x = x;
  j.y = y;
  j.mode = mode;
  j.norm_w = norm_w;
  j.norm_eps = eps;
  j.x_token_stride = x_stride;
  j.y_token_stride = y_stride;
  return j;
}

}  // namespace

std::string gpu_dflash_unsupported(const DFlashModel& m) {
  const DFlashConfig& c = m.config();
  const int64_t widest =
      std::max<int64_t>({static_cast<int64_t>(c.n_embd) * static_cast<int64_t>(c.target_layers.size()),
                         static_cast<int64_t>(c.n_head) * c.head_dim, c.n_ff});
  if (widest > max_gemv_cols())
    return cat("the drafter's widest input (", widest, " values) exceeds the GPU matvec's ", max_gemv_cols());
  if (c.head_dim > kGpuMaxHeadDim)
    return cat("the drafter's heads of ", c.head_dim, " exceed the GPU's ", kGpuMaxHeadDim);
  if (c.block > kMaxGemvTokens) return cat("the drafter's block of ", c.block, " exceeds the GPU's ", kMaxGemvTokens);
  return "";
}

template <class T>
T* GpuDFlashHead::alloc(size_t n, const char* what) {
  void* p = device_alloc(std::max<size_t>(n, 1) * sizeof(T), cat("the DFlash drafter's ", what));
  allocs_.push_back(p);
  return static_cast<T*>(p);
}

const float* GpuDFlashHead::upload(const std::vector<float>& v) {
  float* p = alloc<float>(v.size(), "vectors");
  check_cuda(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "upload DFlash vector");
  return p;
}

GpuDFlashHead::GpuDFlashHead(const DFlashModel& m, const DeviceModel& target, cudaStream_t stream, int max_ctx)
    : c_(m.config()), target_(target), stream_(stream) {
  const std::string why = gpu_dflash_unsupported(m);
  if (!why.empty()) fail("GPU DFlash drafter: ", why);
  if (target.output.n_cols != c_.n_embd || target.output.n_rows != c_.n_vocab)
    fail("GPU DFlash drafter: the target's output matrix is not [", c_.n_embd, " x ", c_.n_vocab, "]");
  try {
    const auto up = [&](const WeightMatrix& w, const std::string& name) {
      return upload_matrix(w, name, [&](size_t n) { return static_cast<void*>(alloc<uint8_t>(n, "weights")); });
    };
    fc_ = up(m.fc, "fc.weight");
    hidden_norm_ = upload(m.hidden_norm);
    output_norm_ = upload(m.output_norm);
    const int B = c_.block, d = c_.n_embd, qw = c_.n_head * c_.head_dim, kv = c_.n_head_kv * c_.head_dim;
    cap_ = std::max(max_ctx, 1) + B;
    for (size_t l = 0; l < m.layers.size(); ++l) {
      const DFlashLayer& L = m.layers[l];
      const std::string b = cat("blk.", l, ".");
      Layer g;
      g.wq = up(L.wq, b + "attn_q.weight");
      g.wk = up(L.wk, b + "attn_k.weight");
      g.wv = up(L.wv, b + "attn_v.weight");
      g.wo = up(L.wo, b + "attn_output.weight");
      g.gate = up(L.gate, b + "ffn_gate.weight");
      g.up = up(L.up, b + "ffn_up.weight");
      g.down = up(L.down, b + "ffn_down.weight");
      g.attn_norm = upload(L.attn_norm);
      g.q_norm = upload(L.q_norm);
      g.k_norm = upload(L.k_norm);
      g.ffn_norm = upload(L.ffn_norm);
      g.k_cache = alloc<float>(static_cast<size_t>(cap_) * kv, "key cache");
      g.v_cache = alloc<float>(static_cast<size_t>(cap_) * kv, "value cache");
      g.kk = alloc<float>(static_cast<size_t>(kChunk) * kv, "context keys");
      g.vv = alloc<float>(static_cast<size_t>(kChunk) * kv, "context values");
      layers_.push_back(g);
    }
    std::vector<int> iota(static_cast<size_t>(cap_));
    for (int p = 0; p < cap_; ++p) iota[static_cast<size_t>(p)] = p;
    iota_ = alloc<int>(iota.size(), "positions");
    check_cuda(cudaMemcpy(iota_, iota.data(), iota.size() * sizeof(int), cudaMemcpyHostToDevice), "upload positions");
    taps_ = alloc<float>(static_cast<size_t>(kChunk) * d * c_.target_layers.size(), "taps");
    feat_ = alloc<float>(static_cast<size_t>(kChunk) * d, "context rows");
    x_ = alloc<float>(static_cast<size_t>(B) * d, "block rows");
    std::vector<float> masks(static_cast<size_t>(B - 1) * d);
    for (int j = 0; j + 1 < B; ++j) std::copy(m.mask.begin(), m.mask.end(), masks.begin() + static_cast<size_t>(j) * d);
    mask_rows_ = upload(masks);
    q_ = alloc<float>(static_cast<size_t>(B) * qw, "queries");
    kb_ = alloc<float>(static_cast<size_t>(B) * kv, "block keys");
    vb_ = alloc<float>(static_cast<size_t>(B) * kv, "block values");
    o_ = alloc<float>(static_cast<size_t>(B) * qw, "attention rows");
    g_ = alloc<float>(static_cast<size_t>(B) * c_.n_ff, "ffn rows");
    logits_dev_ = alloc<float>(static_cast<size_t>(B - 1) * static_cast<size_t>(c_.n_vocab), "logits");
    attn_scratch_per_ = attention_scratch_floats(c_.n_head, c_.head_dim, cap_);
    attn_scratch_ = alloc<float>(attn_scratch_per_ * B, "attention scratch");
    attn_counters_ = alloc<unsigned int>(static_cast<size_t>(B) * c_.n_head, "attention counters");
    check_cuda(cudaMemset(attn_counters_, 0, static_cast<size_t>(B) * c_.n_head * sizeof(unsigned int)),
               "clear attention counters");
    blk_dev_ = alloc<int>(static_cast<size_t>(B) + 1, "block inputs");
    ids_dev_ = alloc<int>(static_cast<size_t>(B - 1) * kRowTopkMax, "candidates");
    probs_dev_ = alloc<float>(static_cast<size_t>(B - 1) * kRowTopkMax, "candidates");
    count_dev_ = alloc<int>(static_cast<size_t>(B - 1), "candidates");
    check_cuda(cudaMallocHost(&blk_host_, (static_cast<size_t>(B) + 1) * sizeof(int)), "cudaMallocHost(DFlash)");
    check_cuda(cudaMallocHost(&ids_host_, static_cast<size_t>(B - 1) * kRowTopkMax * sizeof(int)),
               "cudaMallocHost(DFlash)");
    check_cuda(cudaMallocHost(&probs_host_, static_cast<size_t>(B - 1) * kRowTopkMax * sizeof(float)),
               "cudaMallocHost(DFlash)");
    check_cuda(cudaMallocHost(&count_host_, static_cast<size_t>(B - 1) * sizeof(int)), "cudaMallocHost(DFlash)");
    // The uploads and the memset ran on the legacy stream, which the session's non-blocking stream does
    // not wait for.
    check_cuda(cudaDeviceSynchronize(), "DFlash upload");
  } catch (...) {
    release();
    throw;
  }
}

// The session whose stream the head used may be gone by now: nothing here touches the stream (the frees
// wait for the device's work).
GpuDFlashHead::~GpuDFlashHead() { release(); }

void GpuDFlashHead::release() {
  for (void* p : allocs_) device_free(p);
  allocs_.clear();
  for (void* p : {static_cast<void*>(blk_host_), static_cast<void*>(ids_host_), static_cast<void*>(probs_host_),
                  static_cast<void*>(count_host_)})
    if (p) cudaFreeHost(p);
  blk_host_ = ids_host_ = count_host_ = nullptr;
  probs_host_ = nullptr;
}

void GpuDFlashHead::restart(int pos) {
  if (pos < 0) fail("dflash: restart at position ", pos);
  pos0_ = pos;
  n_ctx_ = 0;
}

void GpuDFlashHead::add_context(const float* taps, int n) {
  if (n <= 0) return;
  if (end() + n + c_.block > cap_)
    fail("GPU DFlash drafter: context up to position ", end() + n, " does not fit its cache of ", cap_ - c_.block);
  const int d = c_.n_embd, kv = c_.n_head_kv * c_.head_dim;
  const int64_t tap_row = static_cast<int64_t>(d) * static_cast<int64_t>(c_.target_layers.size());
  const GemvJob f = job(fc_, taps_, feat_, tap_row, d);
  // Every layer's keys and values read the normed context rows (the norm staged by each job).
  std::vector<GemvJob> kvjobs;
  for (Layer& L : layers_) {
    kvjobs.push_back(job(L.wk, feat_, L.kk, d, kv, GemvMode::Store, hidden_norm_, c_.rms_eps));
    kvjobs.push_back(job(L.wv, feat_, L.vv, d, kv, GemvMode::Store, hidden_norm_, c_.rms_eps));
  }
  for (int t0 = 0; t0 < n; t0 += kChunk) {
    const int nt = std::min(kChunk, n - t0);
    check_cuda(cudaMemcpyAsync(taps_, taps + t0 * tap_row, static_cast<size_t>(nt) * tap_row * sizeof(float),
                               cudaMemcpyHostToDevice, stream_),
               "DFlash taps");
    gemv_batch(&f, 1, stream_, nullptr, nullptr, nullptr, nullptr, nt);
    for (size_t j = 0; j < kvjobs.size(); j += kMaxGemvJobs)
      gemv_batch(kvjobs.data() + j, static_cast<int>(std::min<size_t>(kMaxGemvJobs, kvjobs.size() - j)), stream_,
                 nullptr, nullptr, nullptr, nullptr, nt);
    AttnTokens tk;
    tk.n = nt;
    tk.kv = kv;
    for (Layer& L : layers_)  // no query heads: keys normed and rotated into the cache, values copied
      attn_prep(nullptr, c_.head_dim, L.kk, L.vv, L.k_cache, L.v_cache, kv, 0, c_.n_head_kv, c_.head_dim, nullptr,
                L.k_norm, c_.rms_eps, c_.rope_dims, c_.rope_freq_base, iota_ + end() + t0, stream_, {}, 0, nullptr, tk);
  }
  n_ctx_ += n;
}

void GpuDFlashHead::enqueue_block(int32_t anchor) {
  if (anchor < 0 || anchor >= c_.n_vocab) fail("dflash: anchor token ", anchor, " is out of range");
  const int B = c_.block, d = c_.n_embd, qw = c_.n_head * c_.head_dim, kv = c_.n_head_kv * c_.head_dim;
  if (end() + B > cap_) fail("GPU DFlash drafter: a block at position ", end(), " does not fit its cache");
  // The context rows the block sees (the last c_.context, or all) and the block: every block row attends
  // to all of them, so each one's attention runs as a query at the block's last position over that window.
  const int seen = c_.seen(n_ctx_);
  blk_host_[0] = anchor;
  for (int j = 0; j < B; ++j) blk_host_[1 + j] = end() + B - 1;
  check_cuda(
      cudaMemcpyAsync(blk_dev_, blk_host_, (static_cast<size_t>(B) + 1) * sizeof(int), cudaMemcpyHostToDevice, stream_),
      "DFlash block inputs");
  embed_row(target_.token_embd, blk_dev_, x_, stream_);
  check_cuda(cudaMemcpyAsync(x_ + d, mask_rows_, static_cast<size_t>(B - 1) * d * sizeof(float),
                             cudaMemcpyDeviceToDevice, stream_),
             "DFlash mask rows");
  AttnTokens qt;
  qt.n = B;
  qt.q = qw;
  qt.kv = kv;
  qt.out = qw;
  qt.scratch = static_cast<int64_t>(attn_scratch_per_);
  qt.counters = c_.n_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
  for (Layer& L : layers_) {
    const GemvJob qkv[3] = {job(L.wq, x_, q_, d, qw, GemvMode::Store, L.attn_norm, c_.rms_eps),
                            job(L.wk, x_, kb_, d, kv, GemvMode::Store, L.attn_norm, c_.rms_eps),
                            job(L.wv, x_, vb_, d, kv, GemvMode::Store, L.attn_norm, c_.rms_eps)};
    gemv_batch(qkv, 3, stream_, nullptr, nullptr, nullptr, nullptr, B);
    attn_prep(q_, c_.head_dim, kb_, vb_, L.k_cache, L.v_cache, kv, c_.n_head, c_.n_head_kv, c_.head_dim, L.q_norm,
              L.k_norm, c_.rms_eps, c_.rope_dims, c_.rope_freq_base, iota_ + end(), stream_, {}, 0, nullptr, qt);
    attention_decode_split(q_, c_.head_dim, L.k_cache, L.v_cache, kv, c_.n_head, c_.n_head_kv, c_.head_dim, scale, {},
                           blk_dev_ + 1, cap_, attn_scratch_, attn_counters_, o_, stream_, {}, seen + B, 0, qt);
    const GemvJob out = job(L.wo, o_, x_, qw, d, GemvMode::Accumulate);
    gemv_batch(&out, 1, stream_, nullptr, nullptr, nullptr, nullptr, B);
    GemvJob gu = job(L.gate, x_, g_, d, c_.n_ff, GemvMode::SwigluPair, L.ffn_norm, c_.rms_eps);
    gu.w2 = &L.up;
    gemv_batch(&gu, 1, stream_, nullptr, nullptr, nullptr, nullptr, B);
    const GemvJob down = job(L.down, g_, x_, c_.n_ff, d, GemvMode::Accumulate);
    gemv_batch(&down, 1, stream_, nullptr, nullptr, nullptr, nullptr, B);
  }
  const GemvJob head =
      job(target_.output, x_ + d, logits_dev_, d, c_.n_vocab, GemvMode::Store, output_norm_, c_.rms_eps);
  gemv_batch(&head, 1, stream_, nullptr, nullptr, nullptr, nullptr, B - 1);
}

void GpuDFlashHead::logits(int32_t anchor, float* out) {
  enqueue_block(anchor);
  const size_t n = static_cast<size_t>(c_.block - 1) * static_cast<size_t>(c_.n_vocab);
  check_cuda(cudaMemcpyAsync(out, logits_dev_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "DFlash logits");
  check_cuda(cudaStreamSynchronize(stream_), "DFlash logits");
}

void GpuDFlashHead::candidates(int32_t anchor, int depth, int k, int32_t n_allowed,
                               std::vector<PositionCandidates>& out) {
  c_.check_candidates(depth, n_allowed);
  out.clear();
  if (depth == 0) return;
  if (k > kRowTopkMax) {  // beyond the device selection: the host's, on the copied logits
    logits_host_.resize(static_cast<size_t>(c_.block - 1) * static_cast<size_t>(c_.n_vocab));
    logits(anchor, logits_host_.data());
    candidates_from_logits(c_, logits_host_.data(), depth, k, n_allowed, out);
    return;
  }
  enqueue_block(anchor);
  row_topk(logits_dev_, depth, c_.n_vocab, n_allowed, k, ids_dev_, probs_dev_, count_dev_, stream_);
  check_cuda(cudaMemcpyAsync(ids_host_, ids_dev_, static_cast<size_t>(depth) * k * sizeof(int), cudaMemcpyDeviceToHost,
                             stream_),
             "DFlash candidates");
  check_cuda(cudaMemcpyAsync(probs_host_, probs_dev_, static_cast<size_t>(depth) * k * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_),
             "DFlash candidates");
  check_cuda(cudaMemcpyAsync(count_host_, count_dev_, static_cast<size_t>(depth) * sizeof(int), cudaMemcpyDeviceToHost,
                             stream_),
             "DFlash candidates");
  check_cuda(cudaStreamSynchronize(stream_), "DFlash candidates");
  for (int j = 0; j < depth; ++j) {
    const int n = count_host_[j];
    if (n <= 0) fail_no_finite_logit();
    PositionCandidates p;
    p.tokens.assign(ids_host_ + static_cast<size_t>(j) * k, ids_host_ + static_cast<size_t>(j) * k + n);
    p.probs.assign(probs_host_ + static_cast<size_t>(j) * k, probs_host_ + static_cast<size_t>(j) * k + n);
    out.push_back(std::move(p));
  }
}

std::shared_ptr<GpuDFlashHead> GpuDFlashHeadRef::get() const {
  std::shared_ptr<GpuDFlashHead> h = head_.lock();
  if (!h) fail("--spec dflash: the GPU session this drafter was attached to is gone; attach it again");
  return h;
}

}  // namespace strata::cuda
