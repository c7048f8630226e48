// The hybrid hot/cold MoE (issue 8). Per MoE layer and decode step (one token, or the multi-token step's
// tokens in one job), on the sequence's stream (the session's step, gpu_session.cpp, runs the GPU launches;
// this file owns the mailbox and the CPU side):
//   router matvec                                     (GPU, the all-GPU launch)
//   route + ring: top-k, the picks classified through  (GPU, one small launch; writes the job and the
//         the layer's slot map                          normed input to mapped host memory and rings
//                                                       the doorbell only when some pick is cold)
//   hot experts + shared expert                       (GPU, the all-GPU launches over the hot stack,
//                                                       overlapping the CPU's cold work)
//   cold experts                                      (CPU pool, ColdExpertPool, from the mapped GGUF)
//   cold add in ascending expert id                   (GPU; waits for the CPU only with cold picks)
// The CPU learns about a job from a listener thread spinning on the job's doorbell, so the stream never
// stops for the host and the token stays one CUDA graph (and the decode lookahead works as all-GPU).
// Batched prefill (cold_batch_begin/finish, driven by GpuPrefill): the prefill routes the chunk and runs
// the hot experts with its grouped GEMMs over this layer's slot map; here the ids and inputs are copied
// to pinned memory, the CPU pool computes the cold pairs grouped by expert (each cold expert's weights
// read once per chunk) while the GPU runs the hot ones, and the rows go back into the sorted expert
// outputs before the prefill's combine.
// Expert cache (GpuSessionOptions::expert_cache_slots, moe/expert_cache.h): each layer's stacks have
// cache slots after the pinned ones. At every step boundary (order_after_last, before the next step or
// prefill is enqueued) the policy sees the picks counted so far (a snapshot copied back without
// stopping the stream), copies that finished are mapped and the slots about to be refilled unmapped, by
// one small launch on the step's stream; after the step is enqueued (record_last) the chosen experts are
// staged from the mapped GGUF into pinned memory and copied on a copy stream that waits for those writes,
// so a copy never touches a slot that a step in flight may read, and the decode graph never changes.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <thread>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/hybrid_kernels.h"
#include "strata/cuda/hybrid_moe.h"
#include "strata/cuda/matvec_kernels.h"
#include "strata/cuda/prefill_kernels.h"
#include "strata/cpu/cold_experts.h"
#include "strata/moe/expert_cache.h"

namespace strata::cuda {

namespace {

// Longest the GPU waits for the CPU's answer to one layer before it gives up loudly.
constexpr double kCpuTimeoutS = 60.0;
// The doorbell listener spins this long after its last job, then polls with short sleeps.
constexpr auto kListenerSpin = std::chrono::microseconds(3000);
constexpr auto kListenerNap = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

class HybridMoeImpl final : public HybridMoe {
 public:
  HybridMoeImpl(const Model& model, const DeviceModel& dm, const GpuSessionOptions& opt)
      : model_(model),
        dm_(dm),
        c_(model.config()),
        pool_(opt.cpu_threads > 0 ? opt.cpu_threads : ColdExpertPool::default_threads()),
        cache_slots_(opt.expert_cache_slots),
        cache_policy_(opt.expert_cache_policy),
        cache_admit_margin_(opt.expert_cache_admit_margin),
        copy_budget_(opt.expert_cache_copy_bytes) {
    if (!dm.hybrid()) fail("hybrid MoE: the device model was built without an expert slot map");
    if (c_.n_expert_used < 1 || c_.n_expert_used > kHybridMaxK)
      fail("hybrid MoE: ", c_.n_expert_used, " experts per token (supported: 1..", kHybridMaxK, ")");
    try {
      allocate();
    } catch (...) {
      release();
      throw;
    }
    prefault_cold_experts();
    if (opt.prefill_stream) start_streaming();
    listener_ = std::thread([this] { listen(); });
  }

  ~HybridMoeImpl() override {
    stop_.store(true, std::memory_order_release);
    if (listener_.joinable()) listener_.join();
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);  // copies may still read the staging buffers
    release();
  }

  void route_decode(int il, const float* logits, const float* x, const float* norm_w, cudaStream_t s,
                    const RouteRule& rule, const HybridTokens& tokens) override {
    check_cuda(cudaEventRecord(ev_fork_, s), "hybrid: fork");
    check_cuda(cudaStreamWaitEvent(side_stream_, ev_fork_, 0), "hybrid: fork");
    hybrid_route_ring(il, logits, c_.n_expert, c_.n_expert_used, rule, device_slot_map(il), x, norm_w, c_.rms_eps,
                      c_.n_embd, ring_, side_stream_, tokens.n, tokens.logits, tokens.x);
    check_cuda(cudaEventRecord(ev_join_, side_stream_), "hybrid: join");
    posting_ = true;
  }

  void join_post(cudaStream_t s) override {
    if (posting_) check_cuda(cudaStreamWaitEvent(s, ev_join_, 0), "hybrid: join");
    posting_ = false;
  }

  void cold_add(int il, float* x, const int* ids, const float* weights, cudaStream_t s,
                const HybridTokens& tokens) override {
    join_post(s);  // a no-op after the session's own join
    hybrid_cold_add(il, x, ids, weights, device_slot_map(il), c_.n_expert_used, c_.n_embd, ring_, kCpuTimeoutS, s,
                    tokens.n, tokens.x);
  }

  void uncount_decode(const int* ids, cudaStream_t s) override {
    hybrid_uncount(ids, c_.n_layer, c_.n_expert_used, c_.n_expert, d_slot_, ring_, s);
  }

  void order_after_last(cudaStream_t s) override {
    if (last_stream_ && last_stream_ != s) check_cuda(cudaStreamWaitEvent(s, ev_last_, 0), "hybrid: order steps");
    if (cache_) cache_between_steps(s);
  }

  void record_last(cudaStream_t s) override {
    check_cuda(cudaEventRecord(ev_last_, s), "hybrid: record step");
    last_stream_ = s;
    if (cache_) cache_after_launch();
  }

  // ---- grouped batched prefill (hybrid_moe.h) ----------------------------------------------------------
  const int* device_slot_map(int il) const override {
    return d_slot_ + static_cast<size_t>(il) * static_cast<size_t>(c_.n_expert);
  }
  int hot_experts(int il) const override { return cache_ ? cache_->resident(il) : n_hot_[static_cast<size_t>(il)]; }

  void cold_batch_begin(int il, const int* ids, const int* counts, const float* xn, int n, cudaStream_t s) override {
    const size_t ne = static_cast<size_t>(c_.n_expert), uil = static_cast<size_t>(il);
    prefill::add_counts(counts, c_.n_expert, ring_.expert_picks + uil * ne, s);
    batch_calls_[uil] += static_cast<uint64_t>(n);
    pending_ = false;
    if (hot_experts(il) == c_.n_expert) return;  // every expert of the layer is resident: no CPU work
    if (streamer_ && streamer_->streams(il)) return;  // its cold experts are copied to the GPU this chunk
    fit_batch(n, s);
    const size_t k = static_cast<size_t>(c_.n_expert_used), d = static_cast<size_t>(c_.n_embd);
    const size_t un = static_cast<size_t>(n);
    check_cuda(cudaMemcpyAsync(bids_h_, ids, un * k * sizeof(int), cudaMemcpyDeviceToHost, s), "hybrid batch: ids");
    check_cuda(cudaMemcpyAsync(bxn_h_, xn, un * d * sizeof(float), cudaMemcpyDeviceToHost, s), "hybrid batch: xn");
    check_cuda(cudaEventRecord(ev_copied_, s), "hybrid batch: event");
    pending_ = true;
    pending_il_ = il;
    pending_n_ = n;
  }

  void cold_batch_finish(int il, const int* pair_row, float* ye, int n, cudaStream_t s) override {
    if (!pending_) return;
    pending_ = false;
    if (pending_il_ != il || pending_n_ != n)
      fail("hybrid batch: finish of layer ", il, " (", n, " tokens) after begin of layer ", pending_il_, " (",
           pending_n_, " tokens)");
    // Only the routing and the copies are waited for; the hot GEMMs enqueued since keep running.
    check_cuda(cudaEventSynchronize(ev_copied_), "hybrid batch: wait for routing");
    const int k = c_.n_expert_used;
    const size_t d = static_cast<size_t>(c_.n_embd);
    // The map as the device holds it now: the cache changes it only at step boundaries.
    const std::vector<int>& slot = cache_ ? cache_->slot_map(il) : dm_.expert_slots()[static_cast<size_t>(il)];
    bpicks_.clear();
    int nc = 0;
    const int pinned = cache_ ? cache_->pinned(il) : n_hot_[static_cast<size_t>(il)];
    for (int p = 0; p < n * k; ++p) {
      const int e = bids_h_[p];
      if (e < 0 || e >= c_.n_expert) fail("hybrid batch: router gave expert id ", e, " in layer ", il);
      batch_hits_[static_cast<size_t>(il)] += slot[static_cast<size_t>(e)] >= pinned ? 1 : 0;
      if (slot[static_cast<size_t>(e)] >= 0) continue;
      bpairs_h_[nc] = p;
      bpicks_.push_back({p / k, e, byc_h_ + static_cast<size_t>(nc) * d});
      ++nc;
    }
    batch_cold_[static_cast<size_t>(il)] += static_cast<uint64_t>(nc);
    if (nc == 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    pool_.run_batch(model_.weights().layers[static_cast<size_t>(il)].moe, bxn_h_, n, bpicks_.data(), nc);
    cpu_ns_.fetch_add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
    cpu_jobs_.fetch_add(1);
    const size_t unc = static_cast<size_t>(nc);
    check_cuda(cudaMemcpyAsync(byc_d_, byc_h_, unc * d * sizeof(float), cudaMemcpyHostToDevice, s),
               "hybrid batch: cold rows");
    check_cuda(cudaMemcpyAsync(bpairs_d_, bpairs_h_, unc * sizeof(int), cudaMemcpyHostToDevice, s),
               "hybrid batch: cold pairs");
    prefill::scatter_rows(byc_d_, bpairs_d_, pair_row, nc, c_.n_embd, ye, s);
  }

  void stream_chunk(int n) override {
    if (streamer_) streamer_->begin_chunk(n);
  }
  StreamedLayer stream_acquire(int il, cudaStream_t s) override {
    return streamer_ ? streamer_->acquire(il, s) : StreamedLayer{};
  }
  void stream_release(int il, cudaStream_t s) override {
    if (streamer_) streamer_->release(il, s);
  }

  HybridTelemetry telemetry() const override {
    HybridTelemetry t;
    t.cpu_threads = pool_.n_threads();
    t.stream_note = streamer_ && !streamer_->failure().empty() ? cat("off after a staging error: ", streamer_->failure())
                                                                 : stream_note_;
    if (streamer_) {
      const StreamStats& st = streamer_->stats();
      t.stream_chunks = st.chunks - stream_base_.chunks;
      t.stream_layers = st.layers - stream_base_.layers;
      t.stream_experts = st.experts - stream_base_.experts;
      t.stream_bytes = st.bytes - stream_base_.bytes;
    }
    const size_t nl = static_cast<size_t>(c_.n_layer);
    std::vector<unsigned long long> calls(nl), cold(nl);
    HybridDevCounters ctr{};
    check_cuda(cudaMemcpy(calls.data(), ring_.calls, nl * sizeof(unsigned long long), cudaMemcpyDeviceToHost), "telemetry");
    check_cuda(cudaMemcpy(cold.data(), ring_.cold_picks, nl * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
               "telemetry");
    check_cuda(cudaMemcpy(&ctr, ring_.ctr, sizeof ctr, cudaMemcpyDeviceToHost), "telemetry");
    // Token passes of the grouped batched prefill are counted on the host (batch_calls_, batch_cold_).
    for (size_t l = 0; l < nl; ++l) {
      calls[l] += batch_calls_[l];
      cold[l] += batch_cold_[l];
    }
    // Tokens: passes through the first layer that routes (a model may begin with dense layers).
    const std::vector<int> routed = c_.routed_layers();
    t.tokens = routed.empty() ? 0 : calls[static_cast<size_t>(routed.front())];
    t.cold_picks_per_layer.assign(cold.begin(), cold.end());
    std::vector<unsigned long long> per_expert(nl * static_cast<size_t>(c_.n_expert));
    check_cuda(cudaMemcpy(per_expert.data(), ring_.expert_picks, per_expert.size() * sizeof(unsigned long long),
                          cudaMemcpyDeviceToHost),
               "telemetry");
    t.expert_picks.assign(per_expert.begin(), per_expert.end());
    for (size_t l = 0; l < nl; ++l) {
      t.picks += calls[l] * static_cast<uint64_t>(c_.n_expert_used);
      t.cold_picks += cold[l];
    }
    // Decode jobs are counted on the device (a dropped lookahead step takes its own back out).
    t.cpu_jobs = cpu_jobs_.load() + (ctr.jobs - jobs_base_);
    t.cpu_cold_ms = static_cast<double>(cpu_ns_.load()) * 1e-6;
    t.gpu_wait_ms = static_cast<double>(ctr.wait_ns - wait_ns_base_) * 1e-6;
    t.answer_ms = static_cast<double>(ctr.answer_ns - answer_ns_base_) * 1e-6;
    if (cache_) {
      std::vector<unsigned long long> hits(nl);
      check_cuda(cudaMemcpy(hits.data(), ring_.cache_hits, nl * sizeof(unsigned long long), cudaMemcpyDeviceToHost),
                 "telemetry");
      // The batched prefill's hits are counted on the host.
      for (size_t l = 0; l < nl; ++l) hits[l] += batch_hits_[l];
      t.cache_hits_per_layer.assign(hits.begin(), hits.end());
      for (uint64_t h : t.cache_hits_per_layer) t.cache_hits += h;
      t.cache_slots = cache_->total_cache_slots();
      t.cache_policy = expert_cache_policy_name(cache_->policy());
      t.cache_admit_margin = cache_admit_margin_;
      const ExpertCache::Stats& st = cache_->stats();
      t.cache_copies = st.copies - cache_base_.copies;
      t.cache_copy_bytes = st.bytes - cache_base_.bytes;
      t.cache_evictions = st.evictions - cache_base_.evictions;
    }
    return t;
  }

  void reset_telemetry() override {
    const size_t nl = static_cast<size_t>(c_.n_layer);
    check_cuda(cudaMemset(ring_.calls, 0, nl * sizeof(unsigned long long)), "telemetry reset");
    check_cuda(cudaMemset(ring_.cold_picks, 0, nl * sizeof(unsigned long long)), "telemetry reset");
    check_cuda(cudaMemset(ring_.expert_picks, 0, nl * static_cast<size_t>(c_.n_expert) * sizeof(unsigned long long)),
               "telemetry reset");
    HybridDevCounters ctr{};
    check_cuda(cudaMemcpy(&ctr, ring_.ctr, sizeof ctr, cudaMemcpyDeviceToHost), "telemetry reset");
    wait_ns_base_ = ctr.wait_ns;
    answer_ns_base_ = ctr.answer_ns;
    jobs_base_ = ctr.jobs;
    cpu_jobs_.store(0);
    cpu_ns_.store(0);
    std::fill(batch_calls_.begin(), batch_calls_.end(), 0);
    std::fill(batch_cold_.begin(), batch_cold_.end(), 0);
    std::fill(batch_hits_.begin(), batch_hits_.end(), 0);
    check_cuda(cudaMemset(ring_.cache_hits, 0, nl * sizeof(unsigned long long)), "telemetry reset");
    if (cache_) cache_base_ = cache_->stats();
    if (streamer_) stream_base_ = streamer_->stats();
  }

 private:
  template <class T>
  T* dalloc(size_t n) {
    void* p = device_alloc(std::max<size_t>(n, 1) * sizeof(T), "the hybrid MoE");
    allocs_.push_back(p);
    check_cuda(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T)), "hybrid MoE: cudaMemset");
    return static_cast<T*>(p);
  }

  // Pinned host buffers (and their device twins) of the grouped batched prefill for n tokens: grown on
  // demand, after the stream has drained (the old buffers may still be in flight).
  void fit_batch(int n, cudaStream_t s) {
    if (n <= batch_cap_) return;
    check_cuda(cudaStreamSynchronize(s), "hybrid batch: grow");
    free_batch();
    const size_t un = static_cast<size_t>(n), k = static_cast<size_t>(c_.n_expert_used),
                 d = static_cast<size_t>(c_.n_embd);
    check_cuda(cudaMallocHost(reinterpret_cast<void**>(&bids_h_), un * k * sizeof(int)), "hybrid batch: cudaMallocHost");
    check_cuda(cudaMallocHost(reinterpret_cast<void**>(&bpairs_h_), un * k * sizeof(int)), "hybrid batch: cudaMallocHost");
    check_cuda(cudaMallocHost(reinterpret_cast<void**>(&bxn_h_), un * d * sizeof(float)), "hybrid batch: cudaMallocHost");
    check_cuda(cudaMallocHost(reinterpret_cast<void**>(&byc_h_), un * k * d * sizeof(float)),
               "hybrid batch: cudaMallocHost");
    byc_d_ = static_cast<float*>(device_alloc(un * k * d * sizeof(float), "the hybrid prefill's cold rows"));
    bpairs_d_ = static_cast<int*>(device_alloc(un * k * sizeof(int), "the hybrid prefill's cold rows"));
    batch_cap_ = n;
  }

  void free_batch() {
    if (bids_h_) cudaFreeHost(bids_h_);
    if (bpairs_h_) cudaFreeHost(bpairs_h_);
    if (bxn_h_) cudaFreeHost(bxn_h_);
    if (byc_h_) cudaFreeHost(byc_h_);
    device_free(byc_d_);
    device_free(bpairs_d_);
    bids_h_ = bpairs_h_ = bpairs_d_ = nullptr;
    bxn_h_ = byc_h_ = byc_d_ = nullptr;
    batch_cap_ = 0;
  }

  template <class T>
  T* halloc_mapped(size_t n, T** dev) {
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, std::max<size_t>(n, 1) * sizeof(T), cudaHostAllocMapped), "hybrid MoE: cudaHostAlloc");
    host_allocs_.push_back(p);
    std::memset(p, 0, std::max<size_t>(n, 1) * sizeof(T));
    void* dp = nullptr;
    check_cuda(cudaHostGetDevicePointer(&dp, p, 0), "hybrid MoE: cudaHostGetDevicePointer");
    *dev = static_cast<T*>(dp);
    return static_cast<T*>(p);
  }

  void allocate() {
    const std::vector<std::vector<int>>& slots = dm_.expert_slots();
    const size_t nl = static_cast<size_t>(c_.n_layer), ne = static_cast<size_t>(c_.n_expert);
    const size_t k = static_cast<size_t>(c_.n_expert_used), d = static_cast<size_t>(c_.n_embd);
    if (slots.size() != nl) fail("hybrid MoE: slot map has ", slots.size(), " layers, the model ", nl);
    std::vector<int> flat(nl * ne, -1);
    n_hot_.assign(nl, 0);
    for (size_t l = 0; l < nl; ++l) {
      // A dense layer routes nothing: its row is empty, its slots stay -1 (never read).
      if (c_.layer(static_cast<int>(l)).ffn != FfnKind::Moe && slots[l].empty()) continue;
      if (slots[l].size() != ne) fail("hybrid MoE: slot map layer ", l, " has ", slots[l].size(), " entries, not ", ne);
      for (size_t e = 0; e < ne; ++e) {
        flat[l * ne + e] = slots[l][e];
        n_hot_[l] += slots[l][e] >= 0 ? 1 : 0;
      }
    }
    d_slot_ = dalloc<int>(flat.size());
    check_cuda(cudaMemcpy(d_slot_, flat.data(), flat.size() * sizeof(int), cudaMemcpyHostToDevice), "hybrid: slot map");
    ring_.ctr = dalloc<HybridDevCounters>(1);
    ring_.wait_seq = dalloc<unsigned long long>(nl);
    ring_.calls = dalloc<unsigned long long>(nl);
    ring_.cold_picks = dalloc<unsigned long long>(nl);
    ring_.expert_picks = dalloc<unsigned long long>(nl * ne);
    ring_.cache_hits = dalloc<unsigned long long>(nl);
    int* pinned_d = dalloc<int>(nl);
    check_cuda(cudaMemcpy(pinned_d, n_hot_.data(), nl * sizeof(int), cudaMemcpyHostToDevice), "hybrid: pinned counts");
    ring_.pinned = pinned_d;
    float* xn_d = nullptr;
    float* yec_d = nullptr;
    job_h_ = halloc_mapped<HostJob>(1, &ring_.job);
    const size_t T = static_cast<size_t>(kHybridMaxTokens);
    xn_h_ = halloc_mapped<float>(T * d, &xn_d);
    yec_h_ = halloc_mapped<float>(T * k * d, &yec_d);
    ring_.xn_host = xn_d;
    ring_.ye_cold = yec_d;
    check_cuda(cudaEventCreateWithFlags(&ev_last_, cudaEventDisableTiming), "hybrid: event");
    check_cuda(cudaEventCreateWithFlags(&ev_copied_, cudaEventDisableTiming), "hybrid: event");
    check_cuda(cudaEventCreateWithFlags(&ev_fork_, cudaEventDisableTiming), "hybrid: event");
    check_cuda(cudaEventCreateWithFlags(&ev_join_, cudaEventDisableTiming), "hybrid: event");
    check_cuda(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking), "hybrid: side stream");
    batch_calls_.assign(nl, 0);
    batch_cold_.assign(nl, 0);
    batch_hits_.assign(nl, 0);
    if (cache_slots_ > 0) allocate_cache();
    check_cuda(cudaDeviceSynchronize(), "hybrid MoE: allocate");
  }

  // ---- expert cache ----------------------------------------------------------------------------------
  // Bytes of one expert of layer l in the device stacks (gate + up + down), 0 for a dense layer.
  uint64_t expert_copy_bytes(size_t l) const {
    const DevMoe& w = dm_.layers[l].moe;
    if (c_.layer(static_cast<int>(l)).ffn != FfnKind::Moe) return 0;
    return w.gate.expert_stride + w.up.expert_stride + w.down.expert_stride;
  }

  void allocate_cache() {
    ExpertCacheConfig cfg;
    cfg.pinned = dm_.expert_slots();
    cfg.slots_per_layer = cache_slots_;
    cfg.policy = cache_policy_;
    cfg.admit_margin = cache_admit_margin_;
    uint64_t largest = 0;
    for (size_t l = 0; l < cfg.pinned.size(); ++l) {
      cfg.expert_bytes.push_back(expert_copy_bytes(l));
      largest = std::max(largest, cfg.expert_bytes.back());
    }
    cache_ = std::make_unique<ExpertCache>(std::move(cfg));
    if (cache_->total_cache_slots() == 0) {  // every layer's experts are pinned: nothing to cache
      cache_.reset();
      return;
    }
    for (size_t l = 0; l < dm_.layers.size(); ++l) {
      const int have = dm_.layers[l].moe.gate.n_expert - n_hot_[l];
      if (c_.layer(static_cast<int>(l)).ffn == FfnKind::Moe && have != cache_->cache_slots(static_cast<int>(l)))
        fail("hybrid MoE: layer ", l, " has ", have, " cache slots on the device, the cache wants ",
             cache_->cache_slots(static_cast<int>(l)));
    }
    // At least one expert per step, or nothing could ever be cached.
    copy_budget_ = std::max(copy_budget_ > 0 ? copy_budget_ : largest * static_cast<uint64_t>(c_.n_expert_used),
                            largest);
    for (int b = 0; b < 2; ++b) {
      void* p = nullptr;
      check_cuda(cudaMallocHost(&p, std::max<uint64_t>(copy_budget_, 1)), "expert cache: staging (cudaMallocHost)");
      staging_[b] = static_cast<uint8_t*>(p);
      check_cuda(cudaEventCreateWithFlags(&ev_copied_to_slot_[b], cudaEventDisableTiming), "expert cache: event");
    }
    check_cuda(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "expert cache: copy stream");
    check_cuda(cudaEventCreateWithFlags(&ev_map_, cudaEventDisableTiming), "expert cache: event");
    check_cuda(cudaEventCreateWithFlags(&ev_snap_, cudaEventDisableTiming), "expert cache: event");
    const size_t n = static_cast<size_t>(c_.n_layer) * static_cast<size_t>(c_.n_expert);
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, n * sizeof(unsigned long long)), "expert cache: snapshot (cudaMallocHost)");
    snap_h_ = static_cast<unsigned long long*>(p);
    snap_prev_.assign(n, 0);
    snap_delta_.assign(n, 0);
  }

  // A failure leaves the prompts' cold experts on the CPU, and says so once on stderr and in telemetry.
  void start_streaming() {
    try {
      streamer_ = std::make_unique<ExpertStreamer>(model_, dm_, dm_.expert_slots());
      stream_note_ = cat("on (", ExpertStreamer::kBuffers, " buffers of ",
                         streamer_->device_bytes() / ExpertStreamer::kBuffers >> 20, " MiB, ",
                         streamer_->staging_threads(), " staging threads)");
    } catch (const std::exception& e) {
      stream_note_ = cat("off: ", e.what());
      std::fprintf(stderr, "prefill streaming %s; prompts compute their cold experts on the CPU\n",
                   stream_note_.c_str());
    }
  }

  void release_cache() {
    for (int b = 0; b < 2; ++b) {
      if (staging_[b]) cudaFreeHost(staging_[b]);
      staging_[b] = nullptr;
      if (ev_copied_to_slot_[b]) cudaEventDestroy(ev_copied_to_slot_[b]);
      ev_copied_to_slot_[b] = nullptr;
    }
    if (snap_h_) cudaFreeHost(snap_h_);
    snap_h_ = nullptr;
    for (cudaEvent_t* e : {&ev_map_, &ev_snap_}) {
      if (*e) cudaEventDestroy(*e);
      *e = nullptr;
    }
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
    copy_stream_ = nullptr;
  }

  // Whether work before `e` finished, without waiting.
  static bool done(cudaEvent_t e) {
    const cudaError_t st = cudaEventQuery(e);
    if (st == cudaErrorNotReady) return false;
    check_cuda(st, "expert cache: event query");
    return true;
  }

  // Before the next step is enqueued on s (s already ordered after the last step): feed the policy,
  // take finished copies, and write the slot map on s.
  void cache_between_steps(cudaStream_t s) {
    if (snap_pending_ && done(ev_snap_)) {
      // Cumulative counters: a dropped lookahead step or a telemetry reset may take counts back.
      for (size_t i = 0; i < snap_prev_.size(); ++i) {
        snap_delta_[i] = snap_h_[i] > snap_prev_[i] ? snap_h_[i] - snap_prev_[i] : 0;
        snap_prev_[i] = snap_h_[i];
      }
      cache_->observe(snap_delta_, c_.n_expert);
      snap_pending_ = false;
    }
    for (int b = 0; b < 2; ++b) {
      if (in_flight_[b].empty() || !done(ev_copied_to_slot_[b])) continue;
      for (const ExpertCache::Copy& cp : in_flight_[b]) cache_->copy_done(cp.layer, cp.slot);
      in_flight_[b].clear();
    }
    staging_free_ = in_flight_[0].empty() ? 0 : in_flight_[1].empty() ? 1 : -1;
    ExpertCache::StepPlan plan = cache_->between_steps(staging_free_ >= 0 ? copy_budget_ : 0);
    SlotWrites w;
    for (size_t i = 0; i < plan.writes.size(); ++i) {
      const ExpertCache::SlotWrite& x = plan.writes[i];
      w.index[w.n] = x.layer * c_.n_expert + x.expert;
      w.slot[w.n] = x.slot;
      if (++w.n == kMaxSlotWrites || i + 1 == plan.writes.size()) {
        hybrid_write_slots(d_slot_, w, s);
        w.n = 0;
      }
    }
    to_copy_ = std::move(plan.copies);
    if (!to_copy_.empty()) check_cuda(cudaEventRecord(ev_map_, s), "expert cache: record map");
  }

  // After the step is enqueued: stage and copy the experts chosen at the boundary (the host work
  // overlaps the step), and ask for a snapshot of the pick counters once the step is done.
  void cache_after_launch() {
    if (!to_copy_.empty()) {
      const int b = staging_free_;
      check_cuda(cudaStreamWaitEvent(copy_stream_, ev_map_, 0), "expert cache: order copies");
      uint8_t* dst_h = staging_[b];
      size_t off = 0;
      for (const ExpertCache::Copy& cp : to_copy_) {
        const size_t l = static_cast<size_t>(cp.layer);
        const MoeWeights& hw = model_.weights().layers[l].moe;
        const DevMoe& dw = dm_.layers[l].moe;
        for (const auto& [stack, dev] : {std::pair<const ExpertStack*, const DevMatrix*>{&hw.gate, &dw.gate},
                                         {&hw.up, &dw.up},
                                         {&hw.down, &dw.down}}) {
          const WeightMatrix src = stack->expert(cp.expert);
          const size_t rows = static_cast<size_t>(src.n_rows);
          for (size_t r = 0; r < rows; ++r)
            std::memcpy(dst_h + off + r * dev->row_bytes, src.data + r * src.row_stride, dev->row_bytes);
          // The stacks are const for the kernels that read them; their cache slots are this cache's to fill.
          uint8_t* dst_d = const_cast<uint8_t*>(dev->data) + static_cast<size_t>(cp.slot) * dev->expert_stride;
          check_cuda(cudaMemcpyAsync(dst_d, dst_h + off, dev->expert_stride, cudaMemcpyHostToDevice, copy_stream_),
                     "expert cache: copy");
          off += dev->expert_stride;
        }
      }
      check_cuda(cudaEventRecord(ev_copied_to_slot_[b], copy_stream_), "expert cache: record copy");
      in_flight_[b] = std::move(to_copy_);
      to_copy_.clear();
    }
    if (!snap_pending_) {
      check_cuda(cudaStreamWaitEvent(copy_stream_, ev_last_, 0), "expert cache: order snapshot");
      check_cuda(cudaMemcpyAsync(snap_h_, ring_.expert_picks, snap_prev_.size() * sizeof(unsigned long long),
                                 cudaMemcpyDeviceToHost, copy_stream_),
                 "expert cache: snapshot");
      check_cuda(cudaEventRecord(ev_snap_, copy_stream_), "expert cache: record snapshot");
      snap_pending_ = true;
    }
  }

  void release() {
    for (void* p : allocs_) device_free(p);
    allocs_.clear();
    for (void* p : host_allocs_) cudaFreeHost(p);
    host_allocs_.clear();
    if (ev_copied_) cudaEventDestroy(ev_copied_);
    ev_copied_ = nullptr;
    if (ev_last_) cudaEventDestroy(ev_last_);
    ev_last_ = nullptr;
    for (cudaEvent_t* e : {&ev_fork_, &ev_join_}) {
      if (*e) cudaEventDestroy(*e);
      *e = nullptr;
    }
    if (side_stream_) cudaStreamDestroy(side_stream_);
    side_stream_ = nullptr;
    free_batch();
    release_cache();
  }

  // Touches every page of the cold experts once, so the first tokens do not pay the page faults of the
  // mapped GGUF (and a file not yet in the page cache is read now rather than mid-decode).
  void prefault_cold_experts() const {
    const std::vector<std::vector<int>>& slots = dm_.expert_slots();
    unsigned sum = 0;
    auto touch = [&sum](const WeightMatrix& w) {
      const size_t n = w.row_stride * static_cast<size_t>(w.n_rows);
      for (size_t i = 0; i < n; i += 4096) sum += w.data[i];
    };
    for (size_t l = 0; l < slots.size(); ++l) {
      const MoeWeights& w = model_.weights().layers[l].moe;
      for (size_t e = 0; e < slots[l].size(); ++e) {
        if (slots[l][e] >= 0) continue;
        const int ei = static_cast<int>(e);
        touch(w.gate.expert(ei));
        touch(w.up.expert(ei));
        touch(w.down.expert(ei));
      }
    }
    prefault_sink_ = sum;
  }

  // Computes the job in job_h_ (its cold picks) and raises the done flag. A job of several tokens runs as
  // one batch (each cold expert's weights read once for the tokens that picked it) with run()'s
  // arithmetic, so that each token's rows are what its own decode step gets.
  void process(unsigned long long seq) {
    const HostJob& J = *job_h_;
    const int il = J.layer;
    const size_t d = static_cast<size_t>(c_.n_embd);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (J.n_tokens < 1 || J.n_tokens > kHybridMaxTokens || J.k < 1 || J.k > kHybridMaxK)
        fail("a job of ", J.n_tokens, " tokens of ", J.k, " picks");
      const ExpertFfn& w = model_.weights().layers[static_cast<size_t>(il)].moe;
      if (J.n_tokens == 1) {
        picks_.clear();
        for (int p = 0; p < J.k; ++p)
          if (J.cold[p]) picks_.push_back({J.ids[p], yec_h_ + static_cast<size_t>(p) * d});
        pool_.run(w, xn_h_, picks_.data(), static_cast<int>(picks_.size()));
      } else {
        token_picks_.clear();
        for (int p = 0; p < J.n_tokens * J.k; ++p)
          if (J.cold[p]) token_picks_.push_back({p / J.k, J.ids[p], yec_h_ + static_cast<size_t>(p) * d});
        pool_.run_batch(w, xn_h_, J.n_tokens, token_picks_.data(), static_cast<int>(token_picks_.size()), true);
      }
    } catch (const std::exception& e) {
      // The GPU is waiting on this job inside a CUDA graph: nothing can report the error upwards.
      std::fprintf(stderr, "strata hybrid MoE: cold experts of layer %d failed: %s\n", il, e.what());
      std::terminate();
    }
    cpu_ns_.fetch_add(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
    last_seq_ = seq;
    __atomic_store_n(&job_h_->done, seq, __ATOMIC_RELEASE);
  }

  // A thread that watches the doorbell for the session's lifetime.
  void listen() {
    auto idle_since = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const unsigned long long bell = __atomic_load_n(&job_h_->doorbell, __ATOMIC_ACQUIRE);
      if (bell != last_seq_) {
        process(bell);
        idle_since = std::chrono::steady_clock::now();
        continue;
      }
      if (stop_.load(std::memory_order_acquire)) return;
      cpu_relax();
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() - idle_since > kListenerSpin)
        std::this_thread::sleep_for(kListenerNap);
    }
  }

  const Model& model_;
  const DeviceModel& dm_;
  const ModelConfig& c_;
  ColdExpertPool pool_;
  std::vector<int> n_hot_;
  std::vector<void*> allocs_, host_allocs_;
  int* d_slot_ = nullptr;
  HybridRing ring_;
  HostJob* job_h_ = nullptr;
  float *xn_h_ = nullptr, *yec_h_ = nullptr;
  // The last hybrid step any sequence enqueued (order_after_last / record_last).
  cudaEvent_t ev_last_ = nullptr;
  cudaStream_t last_stream_ = nullptr;
  // route_decode posts on side_stream_ (forked at ev_fork_); join_post waits for ev_join_ once.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t ev_fork_ = nullptr, ev_join_ = nullptr;
  bool posting_ = false;
  // Grouped batched prefill: pinned ids / inputs / cold outputs / cold pair indices for batch_cap_
  // tokens, the layer begun and not yet finished, host-side pass counters.
  cudaEvent_t ev_copied_ = nullptr;
  int batch_cap_ = 0;
  int *bids_h_ = nullptr, *bpairs_h_ = nullptr, *bpairs_d_ = nullptr;
  float *bxn_h_ = nullptr, *byc_h_ = nullptr, *byc_d_ = nullptr;
  std::vector<ColdTokenPick> bpicks_;
  bool pending_ = false;
  int pending_il_ = -1, pending_n_ = 0;
  std::vector<uint64_t> batch_calls_, batch_cold_, batch_hits_;
  // Expert cache (null without one): the policy, two pinned staging buffers (one may be in flight
  // while the other fills) with the copies each carries, the copy stream, the writes' event that copies
  // wait for, the pick-counter snapshot the policy learns from.
  int cache_slots_ = 0;
  ExpertCachePolicy cache_policy_ = ExpertCachePolicy::Lfu;
  double cache_admit_margin_ = ExpertCacheConfig{}.admit_margin;
  uint64_t copy_budget_ = 0;  // bytes of copies started per step boundary
  std::unique_ptr<ExpertCache> cache_;
  ExpertCache::Stats cache_base_;  // stats at the last telemetry reset
  uint8_t* staging_[2] = {nullptr, nullptr};
  cudaEvent_t ev_copied_to_slot_[2] = {nullptr, nullptr};
  std::vector<ExpertCache::Copy> in_flight_[2];
  std::vector<ExpertCache::Copy> to_copy_;  // chosen at the boundary, started after the step's launch
  int staging_free_ = -1;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t ev_map_ = nullptr, ev_snap_ = nullptr;
  unsigned long long* snap_h_ = nullptr;  // pinned
  bool snap_pending_ = false;
  std::vector<uint64_t> snap_prev_, snap_delta_;
  std::vector<ColdPick> picks_;
  std::vector<ColdTokenPick> token_picks_;
  unsigned long long last_seq_ = 0;  // touched only by the one thread that processes jobs
  unsigned long long wait_ns_base_ = 0, answer_ns_base_ = 0, jobs_base_ = 0;
  mutable volatile unsigned prefault_sink_ = 0;  // keeps the page-touching loop from being optimised away
  std::atomic<uint64_t> cpu_ns_{0}, cpu_jobs_{0};  // cpu_jobs_: the batched prefill's
  std::atomic<bool> stop_{false};
  std::thread listener_;
  // Streaming prefill (null when off, or when it could not start: stream_note_ says why).
  std::unique_ptr<ExpertStreamer> streamer_;
  StreamStats stream_base_;
  std::string stream_note_;
};

}  // namespace

std::unique_ptr<HybridMoe> make_hybrid_moe(const Model& model, const DeviceModel& dm, const GpuSessionOptions& opt) {
  return std::make_unique<HybridMoeImpl>(model, dm, opt);
}

}  // namespace strata::cuda
