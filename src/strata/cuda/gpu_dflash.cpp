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
  return upload_floats(v, [this](size_t n) { return static_cast<void*>(alloc<uint8_t>(n, "vectors")); });
}

GpuDFlashHead::GpuDFlashHead(const DFlashModel& m, const DeviceModel& target, cudaStream_t stream, int max_ctx,
                             bool use_graph)
    : c_(m.config()), target_(target), stream_(stream), use_graph_(use_graph) {
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
    const size_t tap_row = static_cast<size_t>(d) * c_.target_layers.size();
    ints_bytes_ = (static_cast<size_t>(at_context() + kChunk) * sizeof(int) + 255) / 256 * 256;
    const size_t in_bytes = ints_bytes_ + static_cast<size_t>(kChunk) * tap_row * sizeof(float);
    in_dev_ = alloc<unsigned char>(in_bytes, "staged inputs");
    check_cuda(cudaMallocHost(&in_host_, in_bytes), "cudaMallocHost(DFlash)");
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
    out_bytes_ = static_cast<size_t>(B - 1) * (2 * kRowTopkMax + 1) * sizeof(int);
    out_dev_ = alloc<unsigned char>(out_bytes_, "candidates");
    check_cuda(cudaMallocHost(&out_host_, out_bytes_), "cudaMallocHost(DFlash)");
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
  destroy_graphs();
  for (void* p : allocs_) device_free(p);
  allocs_.clear();
  for (unsigned char** p : {&in_host_, &out_host_}) {
    if (*p) cudaFreeHost(*p);
    *p = nullptr;
  }
}

void GpuDFlashHead::restart(int pos) {
  if (pos < 0) fail("dflash: restart at position ", pos);
  pos0_ = pos;
  n_ctx_ = 0;
  pending_ = 0;
}

void GpuDFlashHead::add_context(const float* taps, int n) {
  if (n <= 0) return;
  if (end() + n + c_.block > cap_)
    fail("GPU DFlash drafter: context up to position ", end() + n, " does not fit its cache of ", cap_ - c_.block);
  // Rows are staged and run with the next draft (in its graph), a full staging area's worth at once.
  const size_t tap_row = static_cast<size_t>(c_.n_embd) * c_.target_layers.size();
  int* ints = reinterpret_cast<int*>(in_host_);
  float* staged = reinterpret_cast<float*>(in_host_ + ints_bytes_);
  while (n > 0) {
    if (pending_ == kChunk) flush_context();
    const int take = std::min(n, kChunk - pending_);
    std::memcpy(staged + static_cast<size_t>(pending_) * tap_row, taps,
                static_cast<size_t>(take) * tap_row * sizeof(float));
    for (int t = 0; t < take; ++t) ints[at_context() + pending_ + t] = end() + t;
    pending_ += take;
    n_ctx_ += take;
    taps += static_cast<size_t>(take) * tap_row;
    n -= take;
  }
}

void GpuDFlashHead::enqueue_context(int n) {
  const int d = c_.n_embd, kv = c_.n_head_kv * c_.head_dim;
  const int64_t tap_row = static_cast<int64_t>(d) * static_cast<int64_t>(c_.target_layers.size());
  check_cuda(cudaMemcpyAsync(in_dev_, in_host_, ints_bytes_ + static_cast<size_t>(n) * tap_row * sizeof(float),
                             cudaMemcpyHostToDevice, stream_),
             "DFlash inputs");
  if (n == 0) return;
  const float* taps = reinterpret_cast<const float*>(in_dev_ + ints_bytes_);
  const GemvJob f = job(fc_, taps, feat_, tap_row, d);
  gemv_batch(&f, 1, stream_, nullptr, nullptr, nullptr, nullptr, n);
  // Every layer's keys and values read the normed context rows (the norm staged by each job).
  std::vector<GemvJob> kvjobs;
  for (Layer& L : layers_) {
    kvjobs.push_back(job(L.wk, feat_, L.kk, d, kv, GemvMode::Store, hidden_norm_, c_.rms_eps));
    kvjobs.push_back(job(L.wv, feat_, L.vv, d, kv, GemvMode::Store, hidden_norm_, c_.rms_eps));
  }
  for (size_t j = 0; j < kvjobs.size(); j += kMaxGemvJobs)
    gemv_batch(kvjobs.data() + j, static_cast<int>(std::min<size_t>(kMaxGemvJobs, kvjobs.size() - j)), stream_, nullptr,
               nullptr, nullptr, nullptr, n);
  AttnTokens tk;
  tk.n = n;
  tk.kv = kv;
  const int* pos = reinterpret_cast<const int*>(in_dev_) + at_context();
  for (Layer& L : layers_)  // no query heads: keys normed and rotated into the cache, values copied
    attn_prep(nullptr, c_.head_dim, L.kk, L.vv, L.k_cache, L.v_cache, kv, 0, c_.n_head_kv, c_.head_dim, nullptr,
              L.k_norm, c_.rms_eps, c_.rope_dims, c_.rope_freq_base, pos, stream_, {}, 0, nullptr, tk);
}

void GpuDFlashHead::flush_context() {
  guarded([&] {
    enqueue_context(pending_);
    check_cuda(cudaStreamSynchronize(stream_), "DFlash context");  // the staging area is reused
  });
  pending_ = 0;
}

template <class F>
void GpuDFlashHead::guarded(F work) {
  try {
    work();
  } catch (...) {
    // Nothing may still read the staging area when the caller writes it again, and rows that may not
    // have run are not context: the head goes on from here with none (acceptance is all that costs).
    cudaStreamSynchronize(stream_);
    pending_ = 0;
    restart(end());
    throw;
  }
}

void GpuDFlashHead::stage_block(int32_t anchor) {
  if (anchor < 0 || anchor >= c_.n_vocab) fail("dflash: anchor token ", anchor, " is out of range");
  const int B = c_.block;
  if (end() + B > cap_) fail("GPU DFlash drafter: a block at position ", end(), " does not fit its cache");
  int* ints = reinterpret_cast<int*>(in_host_);
  ints[at_anchor()] = anchor;
  // Every block row attends to the context rows the block sees (the last c_.context, or all) and to the
  // whole block: each one's attention runs as a query at the block's last position from the first seen.
  for (int j = 0; j < B; ++j) {
    ints[at_attend() + j] = end() + B - 1;
    ints[at_rows() + j] = end() + j;
  }
  ints[at_first()] = end() - c_.seen(n_ctx_);
}

void GpuDFlashHead::enqueue_block() {
  const int B = c_.block, d = c_.n_embd, qw = c_.n_head * c_.head_dim, kv = c_.n_head_kv * c_.head_dim;
  const int* ints = reinterpret_cast<const int*>(in_dev_);
  embed_row(target_.token_embd, ints + at_anchor(), x_, stream_);
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
  qt.first = ints + at_first();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
  for (Layer& L : layers_) {
    const GemvJob qkv[3] = {job(L.wq, x_, q_, d, qw, GemvMode::Store, L.attn_norm, c_.rms_eps),
                            job(L.wk, x_, kb_, d, kv, GemvMode::Store, L.attn_norm, c_.rms_eps),
                            job(L.wv, x_, vb_, d, kv, GemvMode::Store, L.attn_norm, c_.rms_eps)};
    gemv_batch(qkv, 3, stream_, nullptr, nullptr, nullptr, nullptr, B);
    attn_prep(q_, c_.head_dim, kb_, vb_, L.k_cache, L.v_cache, kv, c_.n_head, c_.n_head_kv, c_.head_dim, L.q_norm,
              L.k_norm, c_.rms_eps, c_.rope_dims, c_.rope_freq_base, ints + at_rows(), stream_, {}, 0, nullptr, qt);
    attention_decode_split(q_, c_.head_dim, L.k_cache, L.v_cache, kv, c_.n_head, c_.n_head_kv, c_.head_dim, scale, {},
                           ints + at_attend(), cap_, attn_scratch_, attn_counters_, o_, stream_, {}, 0, 0, qt);
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

GpuDFlashHead::Candidates GpuDFlashHead::candidates_at(unsigned char* base) const {
  Candidates c;
  const size_t per = static_cast<size_t>(c_.block - 1) * kRowTopkMax;
  c.ids = reinterpret_cast<int*>(base);
  c.probs = reinterpret_cast<float*>(c.ids + per);
  c.count = reinterpret_cast<int*>(c.probs + per);
  return c;
}

void GpuDFlashHead::destroy_graphs() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
}

template <class F>
void GpuDFlashHead::run(const std::array<int, 3>& key, F enqueue) {
  if (!use_graph_) {
    enqueue();
    return;
  }
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= 64) destroy_graphs();  // shapes seldom seen: start over rather than grow
    it = graphs_.emplace(key, capture_graph(stream_, enqueue)).first;
  }
  check_cuda(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch(DFlash)");
}

void GpuDFlashHead::logits(int32_t anchor, float* out) {
  stage_block(anchor);
  guarded([&] {
    enqueue_context(pending_);
    enqueue_block();
    const size_t n = static_cast<size_t>(c_.block - 1) * static_cast<size_t>(c_.n_vocab);
    check_cuda(cudaMemcpyAsync(out, logits_dev_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "DFlash logits");
    check_cuda(cudaStreamSynchronize(stream_), "DFlash logits");
  });
  pending_ = 0;
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
  stage_block(anchor);
  // Every block position's top k, whatever the depth asked (one graph serves every depth).
  const int n = pending_, rows = c_.block - 1;
  const Candidates dev = candidates_at(out_dev_);
  guarded([&] {
    run({n, k, n_allowed}, [&] {
      enqueue_context(n);
      enqueue_block();
      row_topk(logits_dev_, rows, c_.n_vocab, n_allowed, k, dev.ids, dev.probs, dev.count, stream_);
      check_cuda(cudaMemcpyAsync(out_host_, out_dev_, out_bytes_, cudaMemcpyDeviceToHost, stream_),
                 "DFlash candidates");
    });
    check_cuda(cudaStreamSynchronize(stream_), "DFlash candidates");
  });
  pending_ = 0;
  const Candidates host = candidates_at(out_host_);
  for (int j = 0; j < depth; ++j) {
    const int c = host.count[j];
    if (c <= 0) fail_no_finite_logit();
    PositionCandidates p;
    p.tokens.assign(host.ids + static_cast<size_t>(j) * k, host.ids + static_cast<size_t>(j) * k + c);
    p.probs.assign(host.probs + static_cast<size_t>(j) * k, host.probs + static_cast<size_t>(j) * k + c);
    out.push_back(std::move(p));
  }
}

std::shared_ptr<GpuDFlashHead> GpuDFlashHeadRef::get() const {
  std::shared_ptr<GpuDFlashHead> h = head_.lock();
  if (!h) fail("--spec dflash: the GPU session this drafter was attached to is gone; attach it again");
  return h;
}

}  // namespace strata::cuda
