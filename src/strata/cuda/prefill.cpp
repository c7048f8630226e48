// GpuPrefill (prefill.h): the layer loop of the batched prefill, written as the CPU forward pass is
// (engine/forward.cpp and the blocks it calls) and the decode step (gpu_session.cpp) runs the layer
// program, one launch per operation over a whole chunk of tokens, on the caller's stream.
#include "strata/cuda/prefill.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>
#include <vector>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/device_model.h"
#include "strata/cuda/device_state.h"
#include "strata/cuda/hybrid_moe.h"
#include "strata/moe/gpu_expert_plan.h"
#include "strata/cuda/kernels.h"
#include "strata/cuda/prefill_kernels.h"
#include "strata/engine/sequence_state.h"
#include "strata/moe/gpu_support.h"

namespace strata::cuda {
namespace {

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error in ", what, ": status ", static_cast<int>(st));
}

// STRATA_PREFILL_PROFILE=1: the per-piece times of every prefill on stderr (debugging output only).
bool env_profile() {
  const char* v = std::getenv("STRATA_PREFILL_PROFILE");
  return v && *v && std::string(v) != "0";
}

enum Piece { kEmbedNormAdd, kProjections, kAttention, kDeltaNet, kRouting, kExperts, kCombine, kLogits, kPieces };

}  // namespace

std::string PrefillProfile::summary() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "[prefill] %d tokens in %.3f ms (%.0f tok/s): projections %.3f, attention %.3f, deltanet %.3f, "
                "routing %.3f, experts %.3f, combine %.3f, embed/norm/add %.3f, logits %.3f ms",
                tokens, total, total > 0 ? tokens / (total * 1e-3) : 0.0, projections, attention, deltanet, routing,
                experts, combine, embed_norm_add, logits);
  return buf;
}

struct GpuPrefill::Impl {
  const DeviceModel& dm;
  const ModelConfig& c;
  PrefillOptions opt;
  bool profiling;
  cublasHandle_t blas = nullptr;
  cudaStream_t s = nullptr;
  PrefillProfile prof;
  // The DeltaNet rule over a chunk: the chunkwise-parallel form where it takes the head shape, else
  // the staged token scan (set in allocate).
  bool chunked_deltanet = false;

  std::vector<void*> allocs;
  size_t bytes = 0;
  int chunk;
  std::vector<int> routed_index;     // layer -> its row in a replay's token (-1: routes nothing)
  int replay_stride = 0;             // ints per token of a replay (routed layers x k)
  const int* replay_chunk = nullptr;  // this chunk's first token's replayed picks, or null
  int64_t wcap = 0;  // elements of the weight scratch
  int64_t xcap = 0;  // elements of the half input scratch

  int* tokens_d = nullptr;
  float *x = nullptr, *xn = nullptr, *y = nullptr;
  float* wscratch = nullptr;  // float weights (exact) or half weights (fast), wcap elements either way
  __half* xh = nullptr;
  __half* xe_h = nullptr;  // fast mode: the normed hidden state xn in half, shared by the GEMMs reading it
  __half* gh = nullptr;    // fast mode: SwiGLU output of the routed experts in half (down projection input)
  // Fast mode: half copies of the dense matrices (decoded once, on first use; PrefillOptions::cache_dense_f16).
  std::unordered_map<const uint8_t*, __half*> f16_cache;
  bool cache_on = false;  // fast mode with opt.cache_dense_f16
  size_t cache_bytes = 0;
  // attention
  float *q = nullptr, *kk = nullptr, *o = nullptr;
  float* ag = nullptr;  // the softplus output gate's pre-activations (AttnGate)
  // DeltaNet
  float *qkv = nullptr, *mixed = nullptr, *z = nullptr, *bb = nullptr, *al = nullptr, *o2 = nullptr;
  float* dn_scratch = nullptr;  // the chunked DeltaNet form's per-chunk records
  // MoE
  float *router = nullptr, *wts = nullptr, *g = nullptr, *u = nullptr, *ye = nullptr;
  int* ids = nullptr;
  prefill::ExpertGroups groups;
  prefill::ExpertGroups stream_tiles;  // groups' rows, tiles of the streamed experts (hybrid_stream.h)
  int tiles_bound = 0;
  float *sg = nullptr, *gs = nullptr, *us = nullptr, *ys = nullptr;  // shared expert, and dense FFN layers
  // logits
  float* logits = nullptr;
  float* logits_all = nullptr;  // chunk x vocab, allocated on the first all-positions run
  // PrefillPicks: the chunk's per-token arg-max (scratch, zeroed counters, ids), allocated on first use.
  unsigned long long* pick_part = nullptr;
  unsigned int* pick_counter = nullptr;
  int* d_picks = nullptr;

  // Profiling: event pairs per piece, summed after the run.
  std::vector<cudaEvent_t> events;
  std::vector<std::pair<int, int>> marks;  // (piece, index of start event)
  size_t next_event = 0;

  Impl(const DeviceModel& m, PrefillOptions o_) : dm(m), c(m.config()), opt(o_), profiling(o_.profile || env_profile()) {
    if (opt.max_chunk <= 0) fail("prefill chunk size must be positive, got ", opt.max_chunk);
    routed_index = c.routed_index();
    replay_stride = static_cast<int>(c.routed_layers().size()) * c.n_expert_used;
    chunk = opt.max_chunk;
    cache_on = opt.math == PrefillMath::Fast && opt.cache_dense_f16;
    try {
      check_cublas(cublasCreate(&blas), "cublasCreate");
      allocate();
    } catch (...) {
      release();
      throw;
    }
  }
  ~Impl() { release(); }

  void release() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    events.clear();
    for (void* p : allocs) device_free(p);
    allocs.clear();
    if (blas) cublasDestroy(blas);
    blas = nullptr;
  }

  template <class T>
  T* dalloc(int64_t n) {
    const size_t nb = static_cast<size_t>(n <= 0 ? 1 : n) * sizeof(T);
    void* p = device_alloc(nb, cat("the prefill workspace (chunk ", chunk, " tokens, ", bytes, " bytes already)"));
    allocs.push_back(p);
    bytes += nb;
    return static_cast<T*>(p);
  }

  int q_stride_head() const { return c.attn_output_gate ? 2 * c.head_dim : c.head_dim; }
  int kv_width() const { return c.n_head_kv * c.head_dim; }
  int v_dim() const { return c.ssm_v_heads * c.ssm_head_v; }

  void allocate() {
    const int64_t C = chunk, d = c.n_embd;
    bool has_attn = false, has_dn = false;
    int64_t ff_plain = 0;  // widest SwiGLU of a shared expert or a dense FFN layer
    for (const LayerSpec& l : c.layers) {
      (is_attention(l.mixer) ? has_attn : has_dn) = true;
      ff_plain = std::max<int64_t>(ff_plain, l.ffn == FfnKind::Moe ? c.n_ff_shexp : c.n_ff);
    }
    // Largest dense matrix (the output projection is sliced to fit) and widest GEMM input.
    auto fit = [&](const DevMatrix& m) {
      wcap = std::max(wcap, m.n_rows * m.n_cols);
      xcap = std::max(xcap, m.n_cols);
    };
    for (const DevLayer& L : dm.layers) {
      if (is_attention(L.kind)) {
        for (const DevMatrix* m : {&L.attn.q, &L.attn.k, &L.attn.v, &L.attn.o}) fit(*m);
        if (c.attn_gate != AttnGate::None) fit(L.attn.gate);
      } else {
        for (const DevMatrix* m : {&L.deltanet.qkv, &L.deltanet.gate, &L.deltanet.beta, &L.deltanet.alpha,
                                   &L.deltanet.out})
          fit(*m);
      }
      if (L.ffn == FfnKind::Dense) {
        for (const DevMatrix* m : {&L.dense.gate, &L.dense.up, &L.dense.down}) fit(*m);
        continue;
      }
      fit(L.moe.router);
      if (L.moe.has_shared) {
        for (const DevMatrix* m : {&L.moe.shared_gate, &L.moe.shared_up, &L.moe.shared_down}) fit(*m);
        if (L.moe.shared_gated) fit(L.moe.shared_gate_inp);
      }
    }
    xcap = std::max<int64_t>(xcap, d);
    wcap = std::max<int64_t>(wcap, std::min<int64_t>(dm.output.n_rows * dm.output.n_cols, int64_t(1) << 24));
    tokens_d = dalloc<int>(C);
    x = dalloc<float>(C * d);
    xn = dalloc<float>(C * d);
    y = dalloc<float>(C * d);
    wscratch = dalloc<float>(wcap);
    xh = dalloc<__half>(C * xcap);
    if (opt.math == PrefillMath::Fast) xe_h = dalloc<__half>(C * d);
    if (has_attn) {
      const int64_t H = c.max_attention_heads();
      q = dalloc<float>(C * H * q_stride_head());
      kk = dalloc<float>(C * kv_width());
      // o also carries the values on their way into a cache they are not written to directly.
      o = dalloc<float>(C * std::max<int64_t>(H * c.head_dim, kv_width()));
      if (c.attn_gate != AttnGate::None) ag = dalloc<float>(C * H * c.head_dim);
    }
    if (has_dn) {
      qkv = dalloc<float>(C * c.ssm_conv_channels());
      mixed = dalloc<float>(C * c.ssm_conv_channels());
      z = dalloc<float>(C * v_dim());
      bb = dalloc<float>(C * c.ssm_v_heads);
      al = dalloc<float>(C * c.ssm_v_heads);
      o2 = dalloc<float>(C * v_dim());
      // The chunked form takes the real models' head shapes; others run the staged scan (the same rule).
      chunked_deltanet = prefill::deltanet_chunked_supported(c.ssm_head_k, c.ssm_head_v, c.ssm_conv_channels());
      if (chunked_deltanet)
        dn_scratch = dalloc<float>(prefill::deltanet_chunked_scratch_floats(static_cast<int>(C), c.ssm_v_heads,
                                                                            c.ssm_head_k, c.ssm_head_v));
    }
    if (ff_plain > 0) {
      sg = dalloc<float>(C);
      gs = dalloc<float>(C * ff_plain);
      us = dalloc<float>(C * ff_plain);
      ys = dalloc<float>(C * d);
    }
    const int64_t k = c.n_expert_used, pairs = C * k;
    router = dalloc<float>(C * c.n_expert);
    ids = dalloc<int>(pairs);
    wts = dalloc<float>(pairs);
    g = dalloc<float>(pairs * c.n_ff_exp);
    u = dalloc<float>(pairs * c.n_ff_exp);
    ye = dalloc<float>(pairs * d);
    if (opt.math == PrefillMath::Fast) gh = dalloc<__half>(pairs * c.n_ff_exp);
    tiles_bound = prefill::max_tiles(static_cast<int>(pairs), c.n_expert, prefill::kGroupTileM);
    groups.counts = dalloc<int>(c.n_expert);
    groups.cursor = dalloc<int>(c.n_expert);
    groups.src_pair = dalloc<int>(pairs);
    groups.pair_row = dalloc<int>(pairs);
    groups.tile_expert = dalloc<int>(tiles_bound);
    groups.tile_row0 = dalloc<int>(tiles_bound);
    groups.tile_rows = dalloc<int>(tiles_bound);
    groups.n_tiles = dalloc<int>(1);
    stream_tiles = groups;
    stream_tiles.tile_expert = dalloc<int>(tiles_bound);
    stream_tiles.tile_row0 = dalloc<int>(tiles_bound);
    stream_tiles.tile_rows = dalloc<int>(tiles_bound);
    stream_tiles.n_tiles = dalloc<int>(1);
    logits = dalloc<float>(c.n_vocab);
  }

  // ---- profiling -------------------------------------------------------------------------------------
  int mark_start(int piece) {
    if (!profiling) return -1;
    if (next_event + 2 > events.size()) {
      for (int i = 0; i < 64; ++i) {
        cudaEvent_t e;
        check_cuda(cudaEventCreate(&e), "cudaEventCreate");
        events.push_back(e);
      }
    }
    const int i = static_cast<int>(next_event);
    next_event += 2;
    check_cuda(cudaEventRecord(events[i], s), "cudaEventRecord");
    marks.push_back({piece, i});
    return i;
  }
  void mark_end(int i) {
    if (i >= 0) check_cuda(cudaEventRecord(events[i + 1], s), "cudaEventRecord");
  }
  struct Timed {
    Impl& m;
    int i;
    Timed(Impl& m_, int piece) : m(m_), i(m_.mark_start(piece)) {}
    ~Timed() { m.mark_end(i); }
  };

  // ---- dense projections -----------------------------------------------------------------------------
  // Y[n x N] = X[n x K] W^T (row-major), W decoded into the scratch in row slices that fit it.
  // Xh (fast mode, optional): X already in half.
  void dense(const DevMatrix& w, const float* X, int n, float* Y, bool exact_only = false, const __half* Xh = nullptr) {
    const int64_t N = w.n_rows, K = w.n_cols;
    const bool fast = opt.math == PrefillMath::Fast && !exact_only;
    const int64_t slice = std::max<int64_t>(1, std::min<int64_t>(N, wcap / K));
    const float one = 1.0f, zero = 0.0f;
    if (fast && !Xh) {
      check_arg(K <= xcap, "prefill dense: input wider than the half scratch");
      prefill::to_half(X, static_cast<int64_t>(n) * K, xh, s);
      Xh = xh;
    }
    if (fast && cache_on) {
      check_cublas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), n, static_cast<int>(K), &one,
                                cached_f16(w), CUDA_R_16F, static_cast<int>(K), Xh, CUDA_R_16F, static_cast<int>(K),
                                &zero, Y, CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
      return;
    }
    for (int64_t r0 = 0; r0 < N; r0 += slice) {
      const int64_t R = std::min(slice, N - r0);
      if (fast) {
        __half* wh = reinterpret_cast<__half*>(wscratch);
        prefill::dequant_rows_f16(w, r0, R, wh, s);
        check_cublas(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(R), n, static_cast<int>(K), &one, wh,
                                  CUDA_R_16F, static_cast<int>(K), Xh, CUDA_R_16F, static_cast<int>(K), &zero, Y + r0,
                                  CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmEx");
      } else {
        prefill::dequant_rows_f32(w, r0, R, wscratch, s);
        check_cublas(cublasSgemm(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(R), n, static_cast<int>(K), &one,
                                 wscratch, static_cast<int>(K), X, static_cast<int>(K), &zero, Y + r0,
                                 static_cast<int>(N)),
                     "cublasSgemm");
      }
    }
  }

  // The half copy of a dense matrix, decoded on first use.
  const __half* cached_f16(const DevMatrix& w) {
    const auto it = f16_cache.find(w.data);
    if (it != f16_cache.end()) return it->second;
    __half* p = dalloc<__half>(w.n_rows * w.n_cols);
    cache_bytes += static_cast<size_t>(w.n_rows * w.n_cols) * sizeof(__half);
    prefill::dequant_rows_f16(w, 0, w.n_rows, p, s);
    f16_cache.emplace(w.data, p);
    return p;
  }

  // Fast mode: xn in half (once per norm, for every GEMM that reads it); nullptr in exact mode.
  const __half* xn_half(int m) {
    if (opt.math != PrefillMath::Fast) return nullptr;
    prefill::to_half(xn, static_cast<int64_t>(m) * c.n_embd, xe_h, s);
    return xe_h;
  }

  // ---- blocks ----------------------------------------------------------------------------------------
  // Full or sliding-window attention with the layer's own heads and rotary (LayerSpec). The chunk's keys
  // and values go to the cache rows of their positions (a sliding layer's ring wraps), as attn_prep
  // writes them in the decode step, so decode continues on the same layout.
  void attention(int il, const DevLayer& D, DeviceLayerState& L, int m, int pos0) {
    const DevAttention& w = D.attn;
    const LayerSpec& ls = c.layer(il);
    const int hd = c.head_dim, kvw = kv_width(), qsh = q_stride_head();
    const int q_width = ls.n_head * qsh;
    const int64_t row0 = pos0 % L.rows;
    {
      Timed t(*this, kProjections);
      const __half* h = xn_half(m);
      dense(w.q, xn, m, q, false, h);
      dense(w.k, xn, m, kk, false, h);
      if (L.kv.v == KvType::F32 && row0 + m <= L.rows) {
        dense(w.v, xn, m, static_cast<float*>(L.v) + row0 * kvw, false, h);  // straight into the cache
      } else {
        // An f16 cache or a chunk that wraps the ring: the values go through o (free until the attention
        // below writes it) into their rows.
        dense(w.v, xn, m, o, false, h);
        prefill::store_cache_rows(o, m, kvw, L.v, L.kv.v, L.rows, pos0, s);
      }
      if (c.attn_gate != AttnGate::None) dense(w.gate, xn, m, ag, false, h);
    }
    {
      Timed t(*this, kAttention);
      const RopeYarn* yarn = &ls.yarn;
      prefill::norm_rope_rows(q, q_width, qsh, q, q_width, qsh, m, ls.n_head, hd, w.q_norm, c.rms_eps, ls.rope_dims,
                              ls.rope_freq_base, yarn, pos0, s);
      prefill::norm_rope_rows(kk, kvw, hd, L.k, kvw, hd, m, c.n_head_kv, hd, w.k_norm, c.rms_eps, ls.rope_dims,
                              ls.rope_freq_base, yarn, pos0, s, L.kv.k, L.rows);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const int window = ls.mixer == LayerKind::SlidingAttention ? ls.window : 0;
      prefill::attention_prefill(q, q_width, qsh, L.k, L.v, kvw, m, ls.n_head, c.n_head_kv, hd, scale,
                                 c.attn_output_gate, pos0, o, s, L.kv, window, L.rows);
      // The decode's gate kernel over the chunk's rows: o and the gate are [m x heads] rows of one layout.
      if (c.attn_gate != AttnGate::None)
        attn_gate_mul(o, ag, m * ls.n_head, hd, c.attn_gate == AttnGate::SoftplusPerHead, s);
    }
    Timed t(*this, kProjections);
    dense(w.o, o, m, y);
  }

  // rec0 >= 0: the state after each token goes to L's step records from step rec0 on (always the
  // sequential scan then: the chunked form holds the state at its chunk boundaries only).
  void deltanet(const DevLayer& D, DeviceLayerState& L, int m, int rec0) {
    const DevDeltaNet& w = D.deltanet;
    const int channels = c.ssm_conv_channels();
    {
      Timed t(*this, kProjections);
      const __half* h = xn_half(m);
      dense(w.qkv, xn, m, qkv, false, h);
      dense(w.gate, xn, m, z, false, h);
      dense(w.beta, xn, m, bb, false, h);
      dense(w.alpha, xn, m, al, false, h);
    }
    {
      Timed t(*this, kDeltaNet);
      const bool rec = rec0 >= 0;
      const int64_t conv_floats = static_cast<int64_t>(c.ssm_conv_kernel - 1) * channels;
      const int64_t ssm_floats = static_cast<int64_t>(c.ssm_v_heads) * c.ssm_head_k * c.ssm_head_v;
      prefill::conv1d_silu_chunk(qkv, w.conv, c.ssm_conv_kernel, channels, m, L.conv, mixed, s,
                                 rec ? L.conv_steps + rec0 * conv_floats : nullptr);
      prefill::deltanet_qk_norm_rows(mixed, channels, m, c.ssm_k_heads, c.ssm_head_k,
                                     1.0f / std::sqrt(static_cast<float>(c.ssm_head_k)), s);
      if (rec) {
        prefill::deltanet_scan(L.ssm, mixed, channels, bb, al, w.a, w.dt_bias, m, c.ssm_k_heads, c.ssm_v_heads,
                               c.ssm_head_k, c.ssm_head_v, o2, s, L.ssm_steps + rec0 * ssm_floats);
      } else if (chunked_deltanet) {
        prefill::deltanet_scan_chunked(L.ssm, mixed, channels, bb, al, w.a, w.dt_bias, m, c.ssm_k_heads,
                                       c.ssm_v_heads, c.ssm_head_k, c.ssm_head_v, o2, dn_scratch, s);
      } else {
        prefill::deltanet_scan(L.ssm, mixed, channels, bb, al, w.a, w.dt_bias, m, c.ssm_k_heads, c.ssm_v_heads,
                               c.ssm_head_k, c.ssm_head_v, o2, s);
      }
      prefill::gated_rmsnorm_rows(o2, z, w.norm, c.rms_eps, m, c.ssm_v_heads, c.ssm_head_v, s);
    }
    Timed t(*this, kProjections);
    dense(w.out, o2, m, y);
  }

  // The MoE FFN of a chunk: x += experts(xn). With a HybridMoe (hot/cold experts, issue 8) the grouping
  // uses the layer's slot map so the grouped GEMMs compute only the hot experts (indexed by slot in the
  // hot-only stacks), while the HybridMoe computes the cold pairs on the CPU (started before the hot
  // GEMMs are enqueued, waited for after): the combine then sees every pair's row, in the same order and
  // with the same kernels as the all-GPU path. counts_out (device, [n_expert] of this layer, optional):
  // += picks per expert (routing statistics). rec_ids (device, optional): the chunk's first token's row
  // of the step records (DeviceSequenceState::route_steps) or of a trace's rows, which get every token's picks.
  void moe(int il, const DevMoe& w, int m, HybridMoe* hybrid, unsigned long long* counts_out, int* rec_ids) {
    const int k = c.n_expert_used;
    const bool fast = opt.math == PrefillMath::Fast;
    const int pairs = m * k;
    const int* slot_of = hybrid ? hybrid->device_slot_map(il) : nullptr;
    {
      Timed t(*this, kRouting);
      dense(w.router, xn, m, router, /*exact_only=*/true);  // expert choice stays float32 in both modes
      RouteRule rule = route_rule(c, w.selection_bias);
      if (replay_chunk) {
        rule.replay = replay_chunk + static_cast<size_t>(routed_index[static_cast<size_t>(il)]) * k;
        rule.replay_stride = replay_stride;
      }
      prefill::route_topk_rows(router, m, c.n_expert, k, c.norm_topk, rule, ids, wts, s);
      if (rec_ids) {
        const size_t row = static_cast<size_t>(k) * sizeof(int);
        check_cuda(cudaMemcpy2DAsync(rec_ids + static_cast<size_t>(il) * k, row * c.n_layer, ids, row, row,
                                     static_cast<size_t>(m), cudaMemcpyDeviceToDevice, s),
                   "record expert picks");
      }
      prefill::group_by_expert(ids, pairs, k, c.n_expert, prefill::kGroupTileM, groups, s, slot_of);
      if (counts_out) prefill::add_counts(groups.counts, c.n_expert, counts_out, s);
    }
    if (hybrid) hybrid->cold_batch_begin(il, ids, groups.counts, xn, m, s);
    const bool any_hot = !hybrid || hybrid->hot_experts(il) > 0;
    const int bound = prefill::max_tiles(pairs, c.n_expert, prefill::kGroupTileM);
    const __half* h = fast ? xn_half(m) : nullptr;
    // The routed experts of `tiles` from these stacks into their sorted rows of ye.
    auto experts = [&](const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down,
                       const prefill::ExpertGroups& tiles) {
      Timed t(*this, kExperts);
      if (fast) {
        prefill::grouped_gemm_h(gate, h, true, k, tiles, bound, g, s);
        prefill::grouped_gemm_h(up, h, true, k, tiles, bound, u, s);
        prefill::swiglu_rows_h(g, u, static_cast<int64_t>(pairs) * c.n_ff_exp, gh, s);
        prefill::grouped_gemm_h(down, gh, false, k, tiles, bound, ye, s);
      } else {
        prefill::grouped_gemm(gate, xn, true, k, tiles, bound, g, s);
        prefill::grouped_gemm(up, xn, true, k, tiles, bound, u, s);
        prefill::swiglu_rows(g, u, static_cast<int64_t>(pairs) * c.n_ff_exp, g, s);
        prefill::grouped_gemm(down, g, false, k, tiles, bound, ye, s);
      }
    };
    if (any_hot) experts(w.gate, w.up, w.down, groups);
    // Cold experts copied to the GPU for this chunk: the same kernels over their stream buffer (after
    // the hot ones, which run while the copies finish).
    if (hybrid) {
      const StreamedLayer sl = hybrid->stream_acquire(il, s);
      if (sl.n > 0) {
        try {
          prefill::plan_tiles(groups, c.n_expert, prefill::kGroupTileM, sl.rank, slot_of, sl.n, stream_tiles, s);
          experts(sl.gate, sl.up, sl.down, stream_tiles);
        } catch (...) {
          hybrid->stream_release(il, s);  // what was enqueued reads the buffer: the next copy into it waits
          throw;
        }
        hybrid->stream_release(il, s);
      }
    }
    if (w.has_shared) {
      Timed t(*this, kProjections);
      if (w.shared_gated) dense(w.shared_gate_inp, xn, m, sg, /*exact_only=*/true);
      swiglu_ffn(w.shared_gate, w.shared_up, w.shared_down, m, h, ys);
    }
    if (hybrid) {
      Timed t(*this, kExperts);
      hybrid->cold_batch_finish(il, groups.pair_row, ye, m, s);
    }
    Timed t(*this, kCombine);
    prefill::moe_combine_rows(x, ye, ids, wts, groups.pair_row, m, k, c.n_embd, w.has_shared ? ys : nullptr,
                              w.shared_gated ? sg : nullptr, s);
  }

  // out = down(silu(gate . xn) * (up . xn)) for the chunk's rows (a shared expert or a dense FFN layer);
  // h: xn in half (fast mode) or null.
  void swiglu_ffn(const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down, int m, const __half* h,
                  float* out) {
    dense(gate, xn, m, gs, false, h);
    dense(up, xn, m, us, false, h);
    prefill::swiglu_rows(gs, us, static_cast<int64_t>(m) * gate.n_rows, gs, s);
    dense(down, gs, m, out);
  }

  // A dense FFN layer: x += down(silu(gate . xn) * (up . xn)).
  void dense_ffn(const DevDenseFfn& w, int m) {
    Timed t(*this, kProjections);
    swiglu_ffn(w.gate, w.up, w.down, m, xn_half(m), ys);
    add_inplace(x, ys, static_cast<int64_t>(m) * c.n_embd, s);
  }

  void run(DeviceSequenceState& st, const int32_t* tokens, int n, float* logits_out, bool all_positions,
           HybridMoe* hybrid, unsigned long long* route_counts, const int* replay, bool record_steps,
           float* hidden_out, const PrefillPicks* picks, int* trace_ids, const std::vector<int>* hidden_layers) {
    if (record_steps && st.step_cap() < n) fail("prefill: ", n, " tokens to record, room for ", st.step_cap());
    const size_t taps = hidden_out && hidden_layers ? hidden_layers->size() : 0;
    if (record_steps && trace_ids) fail("prefill: picks go to the step records or to a trace, not both");
    if (picks && (!picks->out || picks->n_allowed <= 0 || picks->n_allowed > c.n_vocab))
      fail("prefill: picks need an output and 1..", c.n_vocab, " allowed ids");
    check_cublas(cublasSetStream(blas, s), "cublasSetStream");
    marks.clear();
    next_event = 0;
    cudaEvent_t t_begin = nullptr, t_end = nullptr;
    if (profiling) {
      check_cuda(cudaEventCreate(&t_begin), "cudaEventCreate");
      check_cuda(cudaEventCreate(&t_end), "cudaEventCreate");
      check_cuda(cudaEventRecord(t_begin, s), "cudaEventRecord");
    }
    const int d = c.n_embd;
    const int64_t vocab = c.n_vocab;
    const int logit_rows = std::min(chunk, kPrefillLogitRows);
    if (((all_positions && logits_out) || picks) && !logits_all)
      logits_all = dalloc<float>(static_cast<int64_t>(logit_rows) * vocab);
    if (picks && !d_picks) {
      pick_part = dalloc<unsigned long long>(static_cast<int64_t>(chunk) * argmax_wide_blocks(vocab));
      pick_counter = dalloc<unsigned int>(chunk);
      check_cuda(cudaMemset(pick_counter, 0, sizeof(unsigned int) * static_cast<size_t>(chunk)), "cudaMemset");
      d_picks = dalloc<int>(chunk);
    }
    // A sliding layer's ring holds the window and at most forward_token_limit newer positions: a longer
    // chunk would overwrite rows its own first queries still read.
    const int step = std::min(chunk, forward_token_limit(c, st.max_ctx()));
    for (int c0 = 0; c0 < n; c0 += step) {
      const int m = std::min(step, n - c0);
      const int pos0 = st.n_past;
      replay_chunk = replay ? replay + static_cast<size_t>(c0) * static_cast<size_t>(replay_stride) : nullptr;
      if (hybrid) hybrid->stream_chunk(m);
      {
        Timed t(*this, kEmbedNormAdd);
        check_cuda(cudaMemcpyAsync(tokens_d, tokens + c0, sizeof(int) * m, cudaMemcpyHostToDevice, s), "copy tokens");
        prefill::embed_rows(dm.token_embd, tokens_d, m, x, s);
      }
      for (int il = 0; il < c.n_layer; ++il) {
        const DevLayer& D = dm.layers[il];
        {
          Timed t(*this, kEmbedNormAdd);
          rmsnorm_rows(x, D.attn_norm, c.rms_eps, m, d, xn, s);
        }
        if (is_attention(D.kind)) {
          attention(il, D, st.layers[il], m, pos0);
        } else {
          deltanet(D, st.layers[il], m, record_steps ? c0 : -1);
        }
        {
          Timed t(*this, kEmbedNormAdd);
          add_inplace(x, y, static_cast<int64_t>(m) * d, s);
          rmsnorm_rows(x, D.ffn_norm, c.rms_eps, m, d, xn, s);
        }
        unsigned long long* counts_out =
            route_counts ? route_counts + static_cast<size_t>(il) * static_cast<size_t>(c.n_expert) : nullptr;
        switch (c.layers[static_cast<size_t>(il)].ffn) {
          case FfnKind::Moe: {
            int* rec_ids = record_steps ? st.route_steps : trace_ids;
            if (rec_ids) rec_ids += static_cast<size_t>(c0) * c.n_layer * c.n_expert_used;
            moe(il, D.moe, m, hybrid, counts_out, rec_ids);
            break;
          }
          case FfnKind::Dense: dense_ffn(D.dense, m); break;
        }
        for (size_t j = 0; j < taps; ++j) {
          if ((*hidden_layers)[j] != il) continue;
          const size_t row = static_cast<size_t>(d) * sizeof(float);
          Timed t(*this, kEmbedNormAdd);
          check_cuda(cudaMemcpy2DAsync(hidden_out + (static_cast<size_t>(c0) * taps + j) * static_cast<size_t>(d),
                                       taps * row, x, row, row, static_cast<size_t>(m), cudaMemcpyDeviceToDevice, s),
                     "copy layer taps");
        }
      }
      st.n_past = pos0 + m;
      if (hidden_out && !taps) {
        Timed t(*this, kLogits);
        rmsnorm_rows(x, dm.output_norm, c.rms_eps, m, d, hidden_out + static_cast<int64_t>(c0) * d, s);
      }
      if (logits_out || picks) {
        Timed t(*this, kLogits);
        if ((all_positions && logits_out) || picks) {
          rmsnorm_rows(x, dm.output_norm, c.rms_eps, m, d, xn, s);
          // logit_rows rows at a time: a long pass needs no chunk x vocab buffer.
          for (int r0 = 0; r0 < m; r0 += logit_rows) {
            const int rows = std::min(logit_rows, m - r0);
            dense(dm.output, xn + static_cast<int64_t>(r0) * d, rows, logits_all, /*exact_only=*/true);
            if (picks)
              argmax_wide(logits_all, picks->n_allowed, pick_part, pick_counter, d_picks + r0, s, false, nullptr,
                          nullptr, rows, vocab);
            if (logits_out && all_positions)
              check_cuda(cudaMemcpyAsync(logits_out + static_cast<int64_t>(c0 + r0) * vocab, logits_all,
                                         sizeof(float) * static_cast<size_t>(rows) * static_cast<size_t>(vocab),
                                         cudaMemcpyDeviceToHost, s),
                         "copy logits");
          }
        }
        if (picks) {
          check_cuda(cudaMemcpyAsync(picks->out + c0, d_picks, sizeof(int) * static_cast<size_t>(m),
                                     cudaMemcpyDeviceToHost, s),
                     "copy picks");
        }
        if (logits_out && !all_positions && c0 + m == n) {
          const float* last = x + static_cast<int64_t>(m - 1) * d;
          rmsnorm_rows(last, dm.output_norm, c.rms_eps, 1, d, xn, s);
          matvec(dm.output, xn, logits, s);
          check_cuda(cudaMemcpyAsync(logits_out, logits, sizeof(float) * static_cast<size_t>(vocab),
                                     cudaMemcpyDeviceToHost, s),
                     "copy logits");
        }
      }
    }
    if (profiling) check_cuda(cudaEventRecord(t_end, s), "cudaEventRecord");
    check_cuda(cudaStreamSynchronize(s), "prefill");
    if (profiling) {
      double sums[kPieces] = {};
      for (const auto& [piece, i] : marks) {
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, events[i], events[i + 1]), "cudaEventElapsedTime");
        sums[piece] += ms;
      }
      float total = 0;
      check_cuda(cudaEventElapsedTime(&total, t_begin, t_end), "cudaEventElapsedTime");
      cudaEventDestroy(t_begin);
      cudaEventDestroy(t_end);
      prof = PrefillProfile{};
      prof.embed_norm_add = sums[kEmbedNormAdd];
      prof.projections = sums[kProjections];
      prof.attention = sums[kAttention];
      prof.deltanet = sums[kDeltaNet];
      prof.routing = sums[kRouting];
      prof.experts = sums[kExperts];
      prof.combine = sums[kCombine];
      prof.logits = sums[kLogits];
      prof.total = total;
      prof.tokens = n;
      if (env_profile()) std::fprintf(stderr, "%s (%s)\n", prof.summary().c_str(), prefill_math_name(opt.math));
    }
  }
};

GpuPrefill::GpuPrefill(const DeviceModel& dm, PrefillOptions opt) {
  const std::string what = gpu_prefill_unsupported_feature(dm.config());
  if (!what.empty()) fail("the batched GPU prefill does not implement ", what, " (model ", dm.config().arch_name, ")");
  impl_ = std::make_unique<Impl>(dm, opt);
}
GpuPrefill::~GpuPrefill() = default;

void GpuPrefill::run(DeviceSequenceState& st, const int32_t* tokens, int n, float* logits_out, bool all_positions,
                     cudaStream_t s, HybridMoe* hybrid, unsigned long long* route_counts, const int* replay,
                     bool record_steps, float* hidden_out, const PrefillPicks* picks, int* trace_ids,
                     const std::vector<int>* hidden_layers) {
  if (n <= 0) fail("prefill needs at least one token");
  if (st.n_past + n > st.max_ctx()) fail("prompt of ", st.n_past + n, " tokens exceeds the context of ", st.max_ctx());
  impl_->s = s;
  impl_->run(st, tokens, n, logits_out, all_positions, hybrid, route_counts, replay, record_steps, hidden_out, picks,
             trace_ids, hidden_layers);
}

const PrefillOptions& GpuPrefill::options() const { return impl_->opt; }
const PrefillProfile& GpuPrefill::last_profile() const { return impl_->prof; }
size_t GpuPrefill::workspace_bytes() const { return impl_->bytes; }
size_t GpuPrefill::dense_cache_bytes() const { return impl_->cache_bytes; }

}  // namespace strata::cuda
