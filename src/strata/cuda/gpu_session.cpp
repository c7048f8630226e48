// The decode step on the GPU, written as the CPU forward passes are (forward_qwen3moe.cpp,
// forward_qwen35moe.cpp and the blocks they call), one kernel launch per operation, all on one stream.
#include "strata/cuda/gpu_session.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/decode_lookahead.h"
#include "strata/cuda/decode_profile.h"
#include "strata/cuda/device_memory.h"
#include "strata/cuda/device_model.h"
#include "strata/cuda/device_state.h"
#include "strata/cuda/gpu_dflash.h"
#include "strata/cuda/gpu_model.h"
#include "strata/cuda/hybrid_kernels.h"
#include "strata/cuda/hybrid_moe.h"
#include "strata/cuda/kernels.h"
#include "strata/cuda/matvec_kernels.h"
#include "strata/cuda/prefill.h"
#include "strata/cuda/prefill_kernels.h"
#include "strata/cuda/sample_kernels.h"
#include "strata/engine/sequence_state.h"
#include "strata/engine/token_tree.h"
#include "strata/moe/gpu_support.h"
#include "strata/sample/sampler.h"

namespace strata::cuda {

namespace {

// A device buffer of rows that grows to the most rows asked for so far (contents are not kept).
template <class T>
struct GrowingRows {
  T* data = nullptr;
  size_t cap = 0;  // rows

  T* reserve(size_t rows, size_t row_elems, const char* what) {
    if (rows > cap) {
      release();
      data = static_cast<T*>(device_alloc(rows * row_elems * sizeof(T), what));
      cap = rows;
    }
    return data;
  }
  void release() {
    device_free(data);
    data = nullptr;
    cap = 0;
  }
};

}  // namespace

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return n > 0;
}

std::string device_description() {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) return cat("no CUDA device (", cudaGetErrorString(st), ")");
  if (n == 0) return "no CUDA device";
  cudaDeviceProp p{};
  check_cuda(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return cat(p.name, " (cc ", p.major, ".", p.minor, ", ", buf, ")");
}

struct GpuSession::Impl {
  std::shared_ptr<GpuModel> gm;  // weights, hybrid MoE and prefill, shared with other sequences
  const Model& model;
  const ModelConfig& c;
  const DeviceModel& dm;
  GpuSessionOptions opt;
  int max_ctx;
  DeviceSequenceState st;
  int& n_past;  // st.n_past
  cudaStream_t stream = nullptr;
  cudaGraphExec_t graphs[2] = {nullptr, nullptr};  // the decode step by state parity (ping-pong buffers)
  HybridMoe* hybrid = nullptr;  // the model's, when it has an expert plan

  std::vector<void*> allocs;
  size_t state_bytes = 0;
  // io[0] = token, io[1] = position (device copy of the pinned host pair).
  int* d_io = nullptr;
  int* h_io = nullptr;  // pinned
  int* d_argmax = nullptr;
  int* d_pick = nullptr;                       // sample_token's draw
  unsigned char* sample_scratch = nullptr;     // sample_token's scratch
  float* xn = nullptr;
  float* h_logits = nullptr;                  // pinned staging for logits copies (pageable copies are ~8x slower)
  unsigned long long* argmax_part = nullptr;  // argmax_wide scratch
  unsigned int* argmax_counter = nullptr;
  unsigned long long* route_counts = nullptr;  // [n_layer x n_expert] router selections (decode steps)
  unsigned long long* route_counts_saved = nullptr;  // route_counts before the pending tokens
  float* attn_scratch = nullptr;               // attention_decode_split partials
  size_t attn_scratch_per = 0;                 // floats of a token's partials
  unsigned int* attn_counters = nullptr;
  unsigned int* norm_counter = nullptr;        // GemvNorm epilogues (one launch at a time on the stream)
  double* dn_scratch = nullptr;                // deltanet_step_fast per-slice sums of squares
  unsigned int* dn_counters = nullptr;
  DecodeProfile prof;                           // STRATA_GPU_PROFILE=1: per-operation times, direct launches
  // DeltaNet conv fused into the input projection and the step where the step takes the head shape
  // (deltanet_step_fuses_qk_norm); else a separate conv launch.
  bool fuse_conv = false;
  // Decode lookahead (decode_lookahead.h): the next greedy step runs from the pick, launched before the
  // pick is read back, and is kept only when the caller feeds that pick back. Off with
  // GpuSessionOptions::lookahead = false, and where the step is not one graph (direct launches, the
  // profiles).
  bool lookahead = false;
  LookaheadLink link;
  // The DFlash drafter's head on this GPU (make_dflash_head), kept for the drafter file it was made for.
  std::shared_ptr<GpuDFlashHead> dflash;
  std::string dflash_key;
  bool ahead = false;               // a speculative step is launched, neither kept nor dropped yet
  int32_t ahead_input = -1;         // the token it consumes: the last published pick (its publish
                                    // number is link.launched: nothing is launched after it while ahead)
  int64_t argmax_n = 0;             // ids the step's arg-max covers (the graphs are captured for it)
  // Replayed routing (Sequence::set_routing_replay): each decode step's picks are copied from a pinned
  // ring (a slot per step in flight) to d_replay_step, which the step's routing reads; a multi-token
  // step's tokens' go to d_replay_multi (through h_replay_multi), a prefill's to replay_rows_buf.
  // replay_row[il]: layer il's row in a token's picks (-1: a dense layer).
  RoutingSource* replay_src = nullptr;
  static constexpr int kReplaySlots = 4;
  int* d_replay_step = nullptr;
  int* h_replay_ring = nullptr;  // pinned, kReplaySlots tokens
  int* d_replay_multi = nullptr;  // [kMaxStepTokens x replay_stride] (multi_fits only)
  int* h_replay_multi = nullptr;  // pinned, the same
  unsigned replay_launches = 0;
  GrowingRows<int> replay_rows_buf;  // a token per row
  std::vector<int> replay_row;
  size_t replay_stride = 0;      // ints per token

  // The activation rows a step's kernels read and write: one token's (one: the decode step's), or
  // kMaxStepTokens tokens' (multi: the multi-token step's), token t's rows of each kind t widths
  // (RowWidths) in. Layer il's expert picks are at ids + il * ids_layer ([tokens x k] in multi).
  struct StepRows {
    float *x = nullptr, *q = nullptr, *kk = nullptr, *vv = nullptr, *o = nullptr, *ag = nullptr;
    float *qkv = nullptr, *mixed = nullptr, *z = nullptr, *b = nullptr, *alpha = nullptr, *o2 = nullptr;
    float *router = nullptr, *wts = nullptr, *g = nullptr, *gs = nullptr, *sg = nullptr, *logits = nullptr;
    float *ye = nullptr, *ys = nullptr;  // the MoE down jobs' outputs (where gemv_down_sum does not fit)
    int* ids = nullptr;
    int64_t ids_layer = 0;
    const int* pos = nullptr;  // the tokens' positions (device)
  };
  // Floats per token of each row kind: the token strides of the multi-token step's launches.
  struct RowWidths {
    int64_t x = 0, q = 0, kv = 0, o = 0, ch = 0, vd = 0, nv = 0, router = 0, g = 0, gs = 0, ye = 0, vocab = 0;
  };
  RowWidths rw;
  StepRows one;

  // The multi-token decode step (speculative verification, run_multi): the decode step's kernels over
  // a token grid, so token t's logits are bitwise those of t + 1 decode steps. One graph per token
  // count and state parity, captured on first use; captured again when the step records are
  // reallocated (the graph writes into them).
  static constexpr int kMaxStepTokens = kMaxGemvTokens;
  bool multi_fits = false;  // multi_step_fits() at construction
  StepRows multi;
  // The multi-token step's inputs (d_mio, copied from h_mio): kMaxStepTokens each of tokens, positions
  // (the depth's), parents, then the pending base and each token's root-path rows (AttnTokens), then
  // (h_mio only) the picks read back.
  static constexpr int kMioPos = kMaxStepTokens, kMioParents = 2 * kMaxStepTokens, kMioBase = 3 * kMaxStepTokens,
                       kMioPath = 4 * kMaxStepTokens,
                       kMioInputs = kMioPath + kMaxStepTokens * kMaxStepTokens, kMioPicks = kMioInputs;
  int* d_mio = nullptr;
  int* h_mio = nullptr;
  bool tree_pending = false;  // the pending tokens ran as one tree (run_multi with a tree): keep_tree
  const int* tree_io = nullptr;  // d_mio while enqueue_multi captures the trunk's multi-token step
  float* h_mlogits = nullptr;  // pinned [kMaxStepTokens x n_vocab], allocated on first use
  float* h_mhidden = nullptr;  // pinned [kMaxStepTokens x hidden_width()], allocated on first use
  // The multi-token step's per-token arg-max (forward_pending_picks): scratch, counters, picks.
  unsigned long long* mpick_part = nullptr;
  unsigned int* mpick_counter = nullptr;
  int* d_mpicks = nullptr;
  cudaGraphExec_t mgraphs[2][2][kMaxStepTokens + 1] = {};  // [with picks][state parity][tokens]
  int mgraph_steps = 0;  // st.step_cap() when mgraphs were captured
  int32_t mgraph_pick_range = 0;  // the ids the graphs with picks pick among

  Impl(std::shared_ptr<GpuModel> g, int ctx, GpuSessionOptions o)
      : gm(std::move(g)),
        model(gm->model()),
        c(model.config()),
        dm(gm->device()),
        opt(o),
        max_ctx(ctx),
        st(model.config(), ctx, o.kv_types),
        n_past(st.n_past),
        hybrid(gm->hybrid()) {
    try {
      fuse_conv = c.n_deltanet_layers() > 0 && deltanet_step_fuses_qk_norm(c.ssm_head_k);
      // What the batched prefill lacks runs through the decode step, token by token (the plan says so).
      if (!gpu_prefill_unsupported_feature(c).empty()) opt.batched_prefill = false;
      allocate();
      argmax_n = c.n_vocab;
      lookahead = opt.lookahead && opt.use_graph && !prof.on && !prof.graph_on;
      if (lookahead) {
        st.add_alternates();
        link.allocate();
      }
      st.add_snapshot();  // pending tokens return to it; allocated now, not mid-serve
      check_cuda(cudaDeviceSynchronize(), "allocate");  // the zeroing memsets precede any use on the stream
    } catch (...) {
      release();
      throw;
    }
  }
  ~Impl() {
    if (stream) cudaStreamSynchronize(stream);  // a speculative step may still run
    release();
  }

  template <class T>
  T* dalloc(size_t n) {
    const size_t bytes = (n == 0 ? 1 : n) * sizeof(T);
    void* p = alloc_state_bytes(bytes, max_ctx);
    allocs.push_back(p);
    state_bytes += bytes;
    return static_cast<T*>(p);
  }

  int q_stride_head() const { return c.attn_output_gate ? 2 * c.head_dim : c.head_dim; }
  // The attention output gate of this model, applied by the attention kernel as it writes o.
  AttnOutGate out_gate() const {
    AttnOutGate g;
    if (c.attn_output_gate) g.kind = AttnOutGate::SigmoidAfterQuery;
    if (c.attn_gate == AttnGate::SoftplusPerHead) g.kind = AttnOutGate::SoftplusPerHead, g.g = one.ag;
    if (c.attn_gate == AttnGate::SoftplusPerElement) g.kind = AttnOutGate::SoftplusPerElement, g.g = one.ag;
    return g;
  }
  int kv_width() const { return c.n_head_kv * c.head_dim; }

  RowWidths row_widths() const {
    RowWidths w;
    const int64_t H = c.n_attention_layers() > 0 ? c.max_attention_heads() : 0;
    w.x = c.n_embd;
    w.q = H * q_stride_head();
    w.kv = H > 0 ? kv_width() : 0;
    w.o = H * c.head_dim;  // the attention output, and laguna's gate rows
    if (c.n_deltanet_layers() > 0) {
      w.ch = c.ssm_conv_channels();
      w.vd = static_cast<int64_t>(c.ssm_v_heads) * c.ssm_head_v;
      w.nv = c.ssm_v_heads;
    }
    w.router = c.n_expert;
    // The routed experts' or a dense layer's gate/up output.
    w.g = std::max(static_cast<int64_t>(c.n_expert_used) * c.n_ff_exp, static_cast<int64_t>(c.n_ff));
    w.gs = c.n_ff_shexp;
    w.ye = static_cast<int64_t>(c.n_expert_used) * c.n_embd;
    w.vocab = c.n_vocab;
    return w;
  }

  // The rows of n tokens for every row kind this model uses; every layer's picks -1 (a dense layer's
  // stay so), the MTP layers' after the trunk's (layer_ids of il = n_layer + j).
  StepRows alloc_rows(int n) {
    const size_t t = static_cast<size_t>(n);
    const size_t k = static_cast<size_t>(c.n_expert_used);
    StepRows r;
    r.x = dalloc<float>(t * rw.x);
    if (c.n_attention_layers() > 0) {
      r.q = dalloc<float>(t * rw.q);
      r.kk = dalloc<float>(t * rw.kv);
      r.vv = dalloc<float>(t * rw.kv);
      r.o = dalloc<float>(t * rw.o);
      if (c.attn_gate != AttnGate::None) r.ag = dalloc<float>(t * rw.o);
    }
    if (c.n_deltanet_layers() > 0) {
      r.qkv = dalloc<float>(t * rw.ch);
      r.mixed = dalloc<float>(t * rw.ch);
      r.z = dalloc<float>(t * rw.vd);
      r.b = dalloc<float>(t * rw.nv);
      r.alpha = dalloc<float>(t * rw.nv);
      r.o2 = dalloc<float>(t * rw.vd);
    }
    r.router = dalloc<float>(t * rw.router);
    r.wts = dalloc<float>(t * k);
    r.g = dalloc<float>(t * rw.g);
    if (c.n_ff_shexp > 0) {
      r.sg = dalloc<float>(t);
      r.gs = dalloc<float>(t * rw.gs);
      r.ys = dalloc<float>(t * rw.x);
    }
    r.ye = dalloc<float>(t * rw.ye);
    r.logits = dalloc<float>(t * rw.vocab);
    r.ids_layer = static_cast<int64_t>(t * k);
    const size_t n_ids = static_cast<size_t>(c.n_layer + c.n_mtp) * t * k;
    r.ids = dalloc<int>(n_ids);
    // -1: a dense layer's ids stay so (a dropped lookahead step uncounts only what was routed).
    check_cuda(cudaMemset(r.ids, 0xff, n_ids * sizeof(int)), "cudaMemset(ids)");
    return r;
  }

  void allocate() {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMallocHost(&h_io, 2 * sizeof(int)), "cudaMallocHost");
    d_io = dalloc<int>(2);
    d_argmax = dalloc<int>(1);
    const size_t d = static_cast<size_t>(c.n_embd);
    rw = row_widths();
    one = alloc_rows(1);
    one.pos = d_io + 1;
    xn = dalloc<float>(d);
    multi_fits = multi_step_fits();
    if (c.n_attention_layers() > 0) {  // a token's scratch and counters each (the multi-token step's tokens)
      const int H = c.max_attention_heads();
      const size_t tokens = multi_fits ? kMaxStepTokens : 1;
      attn_scratch_per = attention_scratch_floats(H, c.head_dim, max_ctx);
      attn_scratch = dalloc<float>(tokens * attn_scratch_per);
      attn_counters = dalloc<unsigned int>(tokens * static_cast<size_t>(H));
    }
    if (c.n_deltanet_layers() > 0) {
      // The multi-token step's recurrence keeps every token's sums.
      dn_scratch = dalloc<double>(deltanet_scratch_doubles(c.ssm_v_heads, c.ssm_head_v) * (multi_fits ? kMaxStepTokens : 1));
      dn_counters = dalloc<unsigned int>(static_cast<size_t>(c.ssm_v_heads));
    }
    argmax_part = dalloc<unsigned long long>(static_cast<size_t>(argmax_wide_blocks(c.n_vocab)));
    d_pick = dalloc<int>(1);
    sample_scratch = dalloc<unsigned char>(sample_scratch_bytes(c.n_vocab));
    argmax_counter = dalloc<unsigned int>(1);
    route_counts = dalloc<unsigned long long>(static_cast<size_t>(c.n_layer) * c.n_expert);
    route_counts_saved = dalloc<unsigned long long>(static_cast<size_t>(c.n_layer) * c.n_expert);
    norm_counter = dalloc<unsigned int>(1);
    check_cuda(cudaMallocHost(&h_logits, static_cast<size_t>(c.n_vocab) * sizeof(float)), "cudaMallocHost(logits)");
    if (multi_fits) {
      multi = alloc_rows(kMaxStepTokens);
      d_mio = dalloc<int>(kMioInputs);
      multi.pos = d_mio + kMioPos;
      check_cuda(cudaMallocHost(&h_mio, (kMioPicks + kMaxStepTokens) * sizeof(int)), "cudaMallocHost");
      mpick_part = dalloc<unsigned long long>(kMaxStepTokens * static_cast<size_t>(argmax_wide_blocks(c.n_vocab)));
      mpick_counter = dalloc<unsigned int>(kMaxStepTokens);
      d_mpicks = dalloc<int>(kMaxStepTokens);
    }
    check_cuda(cudaDeviceSynchronize(), "allocate");
  }

  void release() {
    destroy_graphs();
    link.release();
    if (h_replay_ring) cudaFreeHost(h_replay_ring);
    h_replay_ring = nullptr;
    if (h_replay_multi) cudaFreeHost(h_replay_multi);
    h_replay_multi = nullptr;
    replay_rows_buf.release();
    hidden_buf.release();
    trace_buf.release();
    mtp_release();  // before allocs: its rows are among them
    for (void* p : allocs) device_free(p);  // alloc_state_bytes: device_alloc
    allocs.clear();
    if (h_io) cudaFreeHost(h_io);
    h_io = nullptr;
    if (h_mio) cudaFreeHost(h_mio);
    h_mio = nullptr;
    if (h_mlogits) cudaFreeHost(h_mlogits);
    h_mlogits = nullptr;
    if (h_mhidden) cudaFreeHost(h_mhidden);
    h_mhidden = nullptr;
    d_taps.release();
    if (h_logits) cudaFreeHost(h_logits);
    h_logits = nullptr;
    prof.release();
    if (stream) cudaStreamDestroy(stream);
    stream = nullptr;
  }

  // A job whose input is rmsnorm(x) * norm_w of the residual stream x: each block of the launch
  // computes the norm as it stages x (no separate norm pass, no single-block epilogue).
  void normed_input(GemvJob& j, const StepRows& r, const float* norm_w) const {
    j.x = r.x;
    j.x_token_stride = rw.x;
    j.norm_w = norm_w;
    j.norm_eps = c.rms_eps;
  }
  // A fresh job writing rows y of width y_width per token.
  static GemvJob job_to(const DevMatrix& w, float* y, int64_t y_width) {
    GemvJob j;
    j.w = &w, j.y = y, j.y_token_stride = y_width;
    return j;
  }

  // A layer's mixer input projections, each reading rmsnorm(x) * attn_norm: attention q/k/v, or
  // DeltaNet qkv (with the conv1d + SiLU fused in when fuse_conv and conv, else the raw projection for
  // the multi-token step's conv launch) / z / beta / alpha. Returns the count.
  int mixer_in_jobs(const DevLayer& D, DeviceLayerState& L, GemvJob* jobs, const StepRows& r, bool conv) const {
    if (is_attention(D.kind)) {
      const DevAttention& w = D.attn;
      jobs[0] = job_to(w.q, r.q, rw.q);
      jobs[1] = job_to(w.k, r.kk, rw.kv);
      jobs[2] = job_to(w.v, r.vv, rw.kv);
      int n = 3;
      if (c.attn_gate != AttnGate::None) jobs[n++] = job_to(w.gate, r.ag, rw.o);
      for (int i = 0; i < n; ++i) normed_input(jobs[i], r, D.attn_norm);
      return n;
    }
    const DevDeltaNet& w = D.deltanet;
    jobs[0] = job_to(w.qkv, r.qkv, rw.ch);
    jobs[1] = job_to(w.gate, r.z, rw.vd);
    jobs[2] = job_to(w.beta, r.b, rw.nv);
    jobs[3] = job_to(w.alpha, r.alpha, rw.nv);
    for (int i = 0; i < 4; ++i) normed_input(jobs[i], r, D.attn_norm);
    if (fuse_conv && conv) {  // conv1d + SiLU per qkv row in the projection, q/k norms in the step: no conv launch
      jobs[0].y = r.mixed;
      jobs[0].conv_w = w.conv, jobs[0].conv_state = L.conv, jobs[0].conv_state_out = L.conv_alt;
      jobs[0].conv_k = c.ssm_conv_kernel;
      jobs[0].conv_channels = c.ssm_conv_channels();
    }
    return 4;
  }

  // Layer il's spec: a trunk layer's, or for il = n_layer + j the MTP layer's.
  const LayerSpec& layer_spec(int il) const { return il < c.n_layer ? c.layer(il) : c.mtp_layer; }

  // What runs between a mixer's input and output projections for T tokens of rows r at positions
  // pos[0..T): attention's q/k norm + rope + KV store and the split-K attention; DeltaNet's conv (when
  // not fused into the projection) and recurrent step. T > 1: the multi-token step (its DeltaNet conv
  // has run; the state is updated in place, the step records keep each token's).
  void mixer_core(int il, const DevLayer& D, DeviceLayerState& L, const StepRows& r, int T, const int* pos) {
    if (is_attention(D.kind)) {
      const DevAttention& w = D.attn;
      const LayerSpec& ls = layer_spec(il);
      const int hd = c.head_dim;
      AttnTokens tk;
      tk.n = T, tk.q = rw.q, tk.kv = rw.kv, tk.out = rw.o, tk.gate = rw.o;
      tk.scratch = static_cast<int64_t>(attn_scratch_per), tk.counters = c.max_attention_heads();
      if (T > 1 && tree_io) {  // the trunk's multi-token step: rows and root paths (a chain's: its positions)
        tk.path = tree_io + kMioPath, tk.path_stride = kMaxStepTokens, tk.base = tree_io + kMioBase;
      }
      // Every token's KV row is stored before any token attends: a sliding ring keeps window +
      // forward_token_limit - 1 rows, so no pending token's row is one an earlier pending token reads.
      attn_prep(r.q, q_stride_head(), r.kk, r.vv, L.k, L.v, kv_width(), ls.n_head, c.n_head_kv, hd, w.q_norm, w.k_norm,
                c.rms_eps, ls.rope_dims, ls.rope_freq_base, pos, stream, L.kv, L.rows, &ls.yarn, tk);
      prof.mark("attn norm+rope", stream);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const int window = ls.mixer == LayerKind::SlidingAttention ? ls.window : 0;
      AttnOutGate gate = out_gate();
      if (gate.g) gate.g = r.ag;
      attention_decode_split(r.q, q_stride_head(), L.k, L.v, kv_width(), ls.n_head, c.n_head_kv, hd, scale, gate, pos,
                             max_ctx, attn_scratch, attn_counters, r.o, stream, L.kv, window, L.rows, tk);
      prof.mark("attn decode", stream);
      return;
    }
    const DevDeltaNet& w = D.deltanet;
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(c.ssm_head_k));
    if (!fuse_conv) {  // the decode step only (the multi-token step needs fuse_conv)
      conv_qk_norm(r.qkv, w.conv, c.ssm_conv_kernel, L.conv, r.mixed, c.ssm_k_heads, c.ssm_v_heads, c.ssm_head_k,
                   c.ssm_head_v, q_scale, stream, L.conv_alt);
      prof.mark("dn conv+qknorm", stream);
    }
    // The multi-token step runs the recurrence for its T tokens in one launch: token t's state goes to
    // step record t, the last token's to the live state (a kept prefix of m < T tokens selects step
    // m - 1).
    DeltaNetTokens tk;
    tk.n = T;
    tk.mixed_stride = rw.ch, tk.gate_stride = rw.nv, tk.out_stride = rw.vd;
    if (T > 1) {
      tk.records = st.ssm_step(L, 0);
      tk.record_stride = static_cast<int64_t>(st.ssm_state_floats());
      tk.parents = tree_io ? tree_io + kMioParents : nullptr;
    }
    deltanet_step_fast(L.ssm, r.mixed, r.b, r.alpha, w.a, w.dt_bias, w.norm, r.z, c.rms_eps, c.ssm_k_heads,
                       c.ssm_v_heads, c.ssm_head_k, c.ssm_head_v, dn_scratch, dn_counters, r.o2, stream, fuse_conv,
                       q_scale, T == 1 ? L.ssm_alt : L.ssm, false, tk);
    prof.mark("dn step", stream);
  }

  // The mixer's output projection, added into the residual stream x.
  GemvJob mixer_out_job(const DevLayer& D, const StepRows& r) const {
    const bool attn = is_attention(D.kind);
    GemvJob out = job_to(attn ? D.attn.o : D.deltanet.out, r.x, rw.x);
    out.x = attn ? r.o : r.o2;
    out.x_token_stride = attn ? rw.o : rw.vd;
    out.mode = GemvMode::Accumulate;
    return out;
  }

  // One layer's mixer in separate launches: x += out(core(in(rmsnorm(x) * attn_norm))), for T tokens
  // of rows r at positions r.pos (T > 1: the multi-token step).
  void mixer(int il, const DevLayer& D, DeviceLayerState& L, const StepRows& r, int T) {
    const bool attn = is_attention(D.kind);
    GemvJob in[4];
    const int n = mixer_in_jobs(D, L, in, r, T == 1);
    gemv_batch(in, n, stream, nullptr, nullptr, nullptr, nullptr, T);
    prof.mark(attn ? "attn q/k/v gemv" : (fuse_conv && T == 1 ? "dn in gemv+conv" : "dn in gemv"), stream);
    if (T > 1 && !attn) {  // the conv is sequential in the tokens: one launch walks them
      conv_silu_tokens(r.qkv, T, D.deltanet.conv, c.ssm_conv_kernel, c.ssm_conv_channels(), L.conv, st.conv_step(L, 0),
                       r.mixed, stream, tree_io ? tree_io + kMioParents : nullptr);
      prof.mark("dn conv", stream);
    }
    mixer_core(il, D, L, r, T, r.pos);
    const GemvJob out = mixer_out_job(D, r);
    gemv_batch(&out, 1, stream, nullptr, nullptr, nullptr, nullptr, T);
    prof.mark(attn ? "attn out gemv" : "dn out gemv", stream);
  }

  // The lm_head over rmsnorm(x) * output_norm.
  GemvJob head_job(const StepRows& r) const {
    GemvJob head = job_to(dm.output, r.logits, rw.vocab);
    normed_input(head, r, dm.output_norm);
    return head;
  }

  // Layer il's replayed picks in the decode step, or its first token's in a multi-token step of T > 1
  // tokens (device; token t's at + t * replay_stride), or null when the router picks (always in the MTP
  // layers: the replay holds the trunk's).
  const int* replay_for(int il, int T) const {
    if (!replay_src || il >= c.n_layer) return nullptr;
    return (T > 1 ? d_replay_multi : d_replay_step) +
           static_cast<size_t>(replay_row[static_cast<size_t>(il)]) * c.n_expert_used;
  }

  // Layer il's k expert ids (its own, so a dropped lookahead step's picks can be uncounted); a token
  // grid's token t's at + t * k.
  int* layer_ids(int il, const StepRows& r) const { return r.ids + il * r.ids_layer; }

  // The jobs of the MoE FFN x += experts(rmsnorm(x) * ffn_norm) up to the down projections: the router
  // (+ the shared expert's gate input), the k routed gate/up pairs and the shared expert's pair.
  struct MoeJobs {
    std::vector<GemvJob> first, up;  // up ends with the shared expert's pair
    GemvRoute rt;  // softmax + top-k of the router logits
  };
  MoeJobs moe_jobs(int il, const DevLayer& D, const StepRows& r, int T) const {
    const DevMoe& w = D.moe;
    MoeJobs m;
    const int k = c.n_expert_used;
    int* ids_l = layer_ids(il, r);
    GemvRoute& rt = m.rt;
    rt.logits = r.router, rt.n_expert = c.n_expert, rt.k = k, rt.norm_topk = c.norm_topk, rt.ids = ids_l;
    rt.weights = r.wts, rt.counter = norm_counter;
    // The routing counts are the trunk's; the MTP head's picks are not counted.
    rt.counts = il < c.n_layer ? route_counts + static_cast<size_t>(il) * c.n_expert : nullptr;
    rt.rule = route_rule(c, w.selection_bias);
    rt.rule.replay = replay_for(il, T);
    rt.rule.replay_stride = static_cast<int>(replay_stride);
    rt.logits_token_stride = rw.router;
    m.first.push_back(job_to(w.router, r.router, rw.router));
    if (w.has_shared && w.shared_gated) m.first.push_back(job_to(w.shared_gate_inp, r.sg, 1));
    for (GemvJob& j : m.first) normed_input(j, r, D.ffn_norm);
    for (int j = 0; j < k; ++j) {
      GemvJob a = job_to(w.gate, r.g + static_cast<int64_t>(j) * c.n_ff_exp, rw.g);
      a.w2 = &w.up, a.mode = GemvMode::SwigluPair, a.ids = ids_l, a.slot = j, a.ids_token_stride = k;
      normed_input(a, r, D.ffn_norm);
      m.up.push_back(a);
    }
    if (w.has_shared) {
      GemvJob pair = job_to(w.shared_gate, r.gs, rw.gs);
      pair.w2 = &w.shared_up, pair.mode = GemvMode::SwigluPair;
      normed_input(pair, r, D.ffn_norm);
      m.up.push_back(pair);
    }
    return m;
  }

  // The fused MoE down projection + combine of layer il (gemv_down_sum) for T tokens of rows r.
  GemvDownSum down_sum(int il, const DevLayer& D, const StepRows& r, int T, const int* slot_of) const {
    GemvDownSum f;
    f.down = &D.moe.down, f.ids = layer_ids(il, r), f.weights = r.wts, f.k = c.n_expert_used, f.g = r.g;
    f.slot_of_expert = slot_of;
    if (D.moe.has_shared) f.shared = &D.moe.shared_down, f.gs = r.gs, f.shared_gate = D.moe.shared_gated ? r.sg : nullptr;
    f.x = r.x;
    f.n_tokens = T, f.g_token_stride = rw.g, f.gs_token_stride = rw.gs, f.x_token_stride = rw.x;
    return f;
  }

  // Whether the multi-token step takes this session's model: the DeltaNet conv in the form the
  // multi-token conv launch shares with the decode step (fuse_conv), and every MoE layer in one routed
  // expert launch and one down launch (gemv_down_sum, or the down jobs; the several-launch forms route
  // and combine in one-per-launch epilogues). A hybrid model's MoE layers route all the step's tokens in
  // one job for the CPU (hybrid_moe.h).
  bool multi_step_fits() const {
    static_assert(kMaxStepTokens <= kHybridMaxTokens, "a hybrid job holds a multi-token step's tokens");
    if (c.n_deltanet_layers() > 0 && !fuse_conv) return false;
    for (int il = 0; il < c.n_layer; ++il) {
      const DevLayer& D = dm.layers[static_cast<size_t>(il)];
      if (c.layers[static_cast<size_t>(il)].ffn != FfnKind::Moe) continue;
      if (c.n_expert_used + (D.moe.has_shared ? 1 : 0) > kMaxGemvJobs) return false;
    }
    return true;
  }

  // The MoE down projections where gemv_down_sum does not fit: the k routed
  // down jobs writing per-expert rows ye (+ the shared down into ys), combined into x by the launch's
  // last block (when one launch holds them) or by moe_combine_add_norm.
  // T > 1: the multi-token step over rows r (one down launch: multi_step_fits).
  void moe_down_jobs(int il, const DevLayer& D, const int* slot_of, const StepRows& r, int T) {
    const DevMoe& w = D.moe;
    const int* ids_l = layer_ids(il, r);
    const int k = c.n_expert_used;
    const int64_t d = c.n_embd;
    std::vector<GemvJob> down;
    for (int j = 0; j < k; ++j) {
      GemvJob e = job_to(w.down, r.ye + j * d, rw.ye);
      e.x = r.g + static_cast<int64_t>(j) * c.n_ff_exp, e.x_token_stride = rw.g;
      e.ids = ids_l, e.ids_token_stride = k, e.slot = j, e.slot_of_expert = slot_of;
      down.push_back(e);
    }
    if (w.has_shared) {
      GemvJob sd = job_to(w.shared_down, r.ys, rw.x);
      sd.x = r.gs, sd.x_token_stride = rw.gs;
      down.push_back(sd);
    }
    const float* shared_rows = w.has_shared ? r.ys : nullptr;
    const float* shared_gate = w.shared_gated ? r.sg : nullptr;
    if (T > 1) {
      // The combine epilogue's last-block counter is one per launch: a combine launch per token, the
      // epilogue's block function (the same sums, element by element, at any block size).
      gemv_batch(down.data(), static_cast<int>(down.size()), stream, nullptr, nullptr, nullptr, nullptr, T);
      prof.mark("moe experts+shared down", stream);
      for (int t = 0; t < T; ++t)
        moe_combine_add_norm(r.x + t * rw.x, r.ye + t * rw.ye, ids_l + t * k, r.wts + t * k, k, c.n_embd,
                             w.has_shared ? r.ys + t * rw.x : nullptr, w.shared_gated ? r.sg + t : nullptr, nullptr,
                             c.rms_eps, xn, stream);
      prof.mark("moe combine", stream);
    } else if (down.size() <= static_cast<size_t>(kMaxGemvJobs)) {  // combine by the launch's last block
      GemvCombine cb;
      cb.x = r.x, cb.ye = r.ye, cb.ids = ids_l, cb.weights = r.wts, cb.k = k, cb.d = c.n_embd;
      cb.ys = shared_rows, cb.shared_gate = shared_gate, cb.norm_w = nullptr, cb.eps = c.rms_eps, cb.xn = nullptr;
      cb.counter = norm_counter;
      gemv_batch(down.data(), static_cast<int>(down.size()), stream, nullptr, nullptr, &cb);
      prof.mark("moe experts+shared down+combine", stream);
    } else {
      gemv_chunks(down, "moe experts+shared down");
      moe_combine_add_norm(r.x, r.ye, ids_l, r.wts, k, c.n_embd, shared_rows, shared_gate, nullptr, c.rms_eps, xn,
                           stream);
      prof.mark("moe combine", stream);
    }
  }

  // The MoE FFN in separate launches: router (+ shared gate), routed gate+up+SwiGLU with the top-k
  // computed in every block (+ the shared expert's gate/up), routed + shared down + combine. The next
  // layer's input norm is computed by its own launches. Hybrid: the same launches over the layer's hot
  // experts (their routed jobs read the slot map; a cold pick gives zeros), the cold picks posted to the
  // CPU beside the expert launch (hybrid_moe.h), their rows added into x at the end.
  // T > 1: the multi-token step over rows r (multi_step_fits: the one-expert-launch form).
  void moe(int il, const DevLayer& D, const StepRows& r, int T) {
    MoeJobs m = moe_jobs(il, D, r, T);
    const int* slot_of = hybrid ? hybrid->device_slot_map(il) : nullptr;
    HybridTokens tokens;
    tokens.n = T, tokens.logits = rw.router, tokens.x = rw.x;
    for (GemvJob& j : m.up)
      if (j.ids) j.slot_of_expert = slot_of;
    const bool one_launch = m.up.size() <= static_cast<size_t>(kMaxGemvJobs);  // it routes itself
    // Several launches: the router launch's last block routes once for all of them.
    gemv_batch(m.first.data(), static_cast<int>(m.first.size()), stream, nullptr, one_launch ? nullptr : &m.rt, nullptr,
               nullptr, T);
    prof.mark(one_launch ? "moe router+shared gate" : "moe router+top-k+shared gate", stream);
    if (hybrid) hybrid->route_decode(il, r.router, r.x, D.ffn_norm, stream, m.rt.rule, tokens);
    if (one_launch) {
      // A hybrid layer leaves one block slot free: the posting launch beside it (one block) starts at once.
      gemv_batch(m.up.data(), static_cast<int>(m.up.size()), stream, nullptr, nullptr, nullptr, &m.rt, T,
                 hybrid ? 1 : 0);
      prof.mark("moe top-k+experts gate+up+shared gate/up", stream);
    } else {
      gemv_chunks(m.up, "moe experts gate+up", T);
    }
    if (hybrid) hybrid->join_post(stream);  // the posting reads x, which the down projection writes
    const GemvDownSum fused = down_sum(il, D, r, T, slot_of);
    if (gemv_down_sum_fits(fused)) {  // one launch, no per-expert outputs
      gemv_down_sum(fused, stream);
      prof.mark("moe experts+shared down+combine", stream);
    } else {
      moe_down_jobs(il, D, slot_of, r, T);
    }
    if (hybrid) {
      hybrid->cold_add(il, r.x, layer_ids(il, r), r.wts, stream, tokens);
      prof.mark("hybrid cold wait+add", stream);
    }
  }

  // A dense SwiGLU layer: x += down(silu(gate . xn) * (up . xn)), xn = rmsnorm(x) * ffn_norm, for T
  // tokens of rows r.
  void dense_ffn(const DevLayer& D, const StepRows& r, int T) {
    GemvJob pair = job_to(D.dense.gate, r.g, rw.g);
    pair.w2 = &D.dense.up, pair.mode = GemvMode::SwigluPair;
    normed_input(pair, r, D.ffn_norm);
    gemv_batch(&pair, 1, stream, nullptr, nullptr, nullptr, nullptr, T);
    prof.mark("dense ffn gate+up", stream);
    GemvJob down = job_to(D.dense.down, r.x, rw.x);
    down.x = r.g, down.x_token_stride = rw.g, down.mode = GemvMode::Accumulate;
    gemv_batch(&down, 1, stream, nullptr, nullptr, nullptr, nullptr, T);
    prof.mark("dense ffn down", stream);
  }

  // Runs jobs in launches of at most kMaxGemvJobs, for T tokens.
  void gemv_chunks(const std::vector<GemvJob>& jobs, const char* what, int T = 1) {
    for (size_t i = 0; i < jobs.size(); i += kMaxGemvJobs)
      gemv_batch(jobs.data() + i, static_cast<int>(std::min<size_t>(kMaxGemvJobs, jobs.size() - i)), stream, nullptr,
                 nullptr, nullptr, nullptr, T);
    prof.mark(what, stream);
  }

  // Layer il's FFN for T tokens of rows r.
  void ffn(int il, const DevLayer& D, const StepRows& r, int T) {
    switch (D.ffn) {
      case FfnKind::Moe: moe(il, D, r, T); break;
      case FfnKind::Dense: dense_ffn(D, r, T); break;
    }
  }

  // The layers and the lm_head of T tokens of rows r, their embeddings in r.x. With layer taps
  // (tap_of), each tapped layer's output rows go to d_taps ([T x taps x n_embd]) as the step runs.
  void enqueue_layers(const StepRows& r, int T) {
    for (int il = 0; il < c.n_layer; ++il) {
      const DevLayer& D = dm.layers[il];
      mixer(il, D, st.layers[il], r, T);  // the layer program's mixer (DevLayer::kind = ModelConfig::mixer)
      ffn(il, D, r, T);
      if (!tap_of.empty() && tap_of[static_cast<size_t>(il)] >= 0) {
        const size_t d = static_cast<size_t>(c.n_embd), w = hidden_width();
        check_cuda(cudaMemcpy2DAsync(d_taps.data + static_cast<size_t>(tap_of[static_cast<size_t>(il)]) * d,
                                     w * sizeof(float), r.x, static_cast<size_t>(rw.x) * sizeof(float),
                                     d * sizeof(float), static_cast<size_t>(T), cudaMemcpyDeviceToDevice, stream),
                   "copy layer taps");
      }
    }
    const GemvJob head = head_job(r);
    gemv_batch(&head, 1, stream, nullptr, nullptr, nullptr, nullptr, T);
    prof.mark("lm_head gemv+norm", stream);
  }

  // Every kernel of the multi-token step of T tokens (d_mio: the tokens, then their positions).
  void enqueue_multi(int T) {
    if (prof.on) {
      char tag[16];
      std::snprintf(tag, sizeof tag, "T%d: ", T);
      prof.tag = tag;
    }
    prof.mark(nullptr, stream);  // step start
    // The prefill's embedding of token rows: the decode step's row decoding, T rows in one launch.
    prefill::embed_rows(dm.token_embd, d_mio, T, multi.x, stream);
    prof.mark("embed", stream);
    struct Clear {
      const int*& p;
      ~Clear() { p = nullptr; }
    } clear{tree_io};
    tree_io = d_mio;
    enqueue_layers(multi, T);
    if (prof.on) prof.tag.clear();
  }

  // Every kernel of one decode step, reading the token and position from d_io.
  void enqueue_step() {
    prof.mark(nullptr, stream);  // step start
    embed_row(dm.token_embd, d_io, one.x, stream);
    prof.mark("embed", stream);
    enqueue_layers(one, 1);
    // With lookahead the arg-max's last block also publishes the pick: the next step's input, on the device.
    argmax_wide(one.logits, argmax_n, argmax_part, argmax_counter, d_argmax, stream, false, lookahead ? &link : nullptr,
                d_io);
    prof.mark("argmax", stream);
  }

  // Runs one token at position n_past; leaves logits and arg-max on the device (stream not synchronised).
  void step(int32_t token) {
    // The previous step's copy of h_io has completed: every step is waited for (synchronised, or its
    // published pick read) before the next host token is written.
    h_io[0] = token;
    h_io[1] = n_past;
    check_cuda(cudaMemcpyAsync(d_io, h_io, 2 * sizeof(int), cudaMemcpyHostToDevice, stream), "copy token");
    launch_step();
    if (lookahead) {
      ++link.launched;
      st.swap_alternates();  // kept: its outputs are the state now
    }
    ++n_past;
  }

  // Enqueues the step that reads the token and position in d_io and the current state (the graph of the
  // state's parity, captured on first use).
  void launch_step() {
    if (hybrid) hybrid->order_after_last(stream);
    if (replay_src) {
      // Stream order puts the copy after the previous step, which reads d_replay_step; the ring slot is
      // not written again while a step that copies from it can be in flight.
      int* h = h_replay_ring + static_cast<size_t>(replay_launches++ % kReplaySlots) * replay_stride;
      replay_src->next(1, h);
      check_cuda(cudaMemcpyAsync(d_replay_step, h, replay_stride * sizeof(int), cudaMemcpyHostToDevice, stream),
                 "copy replayed picks");
    }
    run_graph(graphs[st.parity()], "decode step (graph)", [this] { enqueue_step(); });
    if (hybrid) hybrid->record_last(stream);
  }

  void destroy_graphs() {
    for (cudaGraphExec_t& g : graphs) {
      if (g) cudaGraphExecDestroy(g);
      g = nullptr;
    }
    destroy_multi_graphs();
  }
  void destroy_multi_graphs() {
    for (auto& by_pick : mgraphs)
      for (auto& by_parity : by_pick)
        for (cudaGraphExec_t& g : by_parity) {
          if (g) cudaGraphExecDestroy(g);
          g = nullptr;
        }
  }

  // Step record t's picks: token t's row of every layer's [tokens x k] ids of the multi-token step.
  void enqueue_step_record_picks(int n) {
    const size_t k = static_cast<size_t>(c.n_expert_used);
    const size_t step_ids = static_cast<size_t>(c.n_layer) * k;
    std::vector<DeviceCopy> records(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) {
      DeviceCopy& r = records[static_cast<size_t>(t)];
      r.dst = st.route_steps + static_cast<size_t>(t) * step_ids;
      r.src = multi.ids + static_cast<size_t>(t) * k;
      r.row_bytes = k * sizeof(int);
      r.rows = static_cast<size_t>(c.n_layer);
      r.src_pitch = static_cast<size_t>(multi.ids_layer) * sizeof(int);
    }
    copy_batch(records, stream);
  }

  // Lookahead: the step at n_past from the last pick (on the device), launched before the pick is read.
  void speculate() {
    if (n_past >= max_ctx) return;  // it would write position n_past
    launch_step();
    ++link.launched;
    ahead = true;
  }

  // The speculative step is the one the caller wants: its state buffers become the state.
  void keep() {
    ahead = false;
    st.swap_alternates();
    ++n_past;
  }

  // Drops a speculative step: the state stays on the buffers it read (its writes went to the other
  // ones), and its router picks leave the routing counts. Every entry point other than the greedy step
  // calls this before it touches the state.
  void drop() {
    if (!ahead) return;
    uncount_routes(one.ids, c.n_layer, c.n_expert_used, c.n_expert, route_counts, stream);
    if (hybrid) hybrid->uncount_decode(one.ids, stream);
    ahead = false;
  }

  // The step's arg-max covers ids < n: the graphs are captured again when n changes.
  void set_argmax_range(int64_t n) {
    if (n == argmax_n) return;
    drop();
    check_cuda(cudaStreamSynchronize(stream), "decode step");
    destroy_graphs();
    argmax_n = n;
  }

  // One greedy step from `token`; returns the pick (arg-max over ids < argmax_n). With lookahead, the
  // step launched from the previous pick is kept when `token` is that pick, and dropped otherwise (the
  // step then runs from the host's token); either way the next step is launched from this step's pick
  // before the pick is read back.
  int32_t greedy_step(int32_t token) {
    if (!lookahead) {
      step(token);
      return read_token(d_argmax);
    }
    if (ahead && token == ahead_input) {
      keep();
    } else {
      drop();
      step(token);
    }
    const unsigned long long no = link.launched;  // this step's publish number
    speculate();
    const int32_t id = link.wait(stream, no);
    ahead_input = id;
    if (id < 0) drop();  // no finite logit: the caller fails (the step ran from token 0: publish_pick_dev)
    return id;
  }

  // enqueue() as the graph g (captured on first use; a step of the graph profile named `label` unless
  // that is null), or launched directly when graphs are off or the per-operation profile is on.
  template <class F>
  void run_graph(cudaGraphExec_t& g, const char* label, F enqueue) {
    if (!opt.use_graph || prof.on) {
      enqueue();
      return;
    }
    if (!g) g = capture_graph(stream, enqueue);
    if (label) prof.mark_graph(nullptr, stream);
    check_cuda(cudaGraphLaunch(g, stream), "cudaGraphLaunch");
    if (label) prof.mark_graph(label, stream);
  }

  void sync() {
    check_cuda(cudaStreamSynchronize(stream), "decode step");
    prof.collect();
  }

  // The token id a step's pick left at d (the device arg-max or sampler), after the step completes.
  int32_t read_token(const int* d) {
    check_cuda(cudaMemcpyAsync(h_io, d, sizeof(int), cudaMemcpyDeviceToHost, stream), "copy the picked token");
    sync();
    return h_io[0];
  }

  // The hybrid MoE's buffers belong to the model: a hybrid step holds the model while it runs.
  std::unique_lock<std::mutex> hold_hybrid() {
    return hybrid ? std::unique_lock<std::mutex>(gm->exclusive()) : std::unique_lock<std::mutex>();
  }

  // The device rows a run of n tokens copies its hidden rows into (final states or layer taps; null
  // without a hidden record). The multi-token step reads layer taps back from d_taps itself.
  float* hidden_rows_for(int n) {
    return hidden ? hidden_buf.reserve(static_cast<size_t>(n), hidden_width(), "hidden rows") : nullptr;
  }

  // Runs n validated tokens (the batched prefill, or the decode step token by token) and advances n_past.
  // record: token t's DeltaNet state and expert picks go to step t of the state's step records (room
  // for n reserved by the caller).
  // picks: the batched prefill's per-token arg-max (GpuPrefill::run) instead of logits.
  void run(const int32_t* tokens, int n, float* logits_out, bool all_positions, bool record = false,
           const PrefillPicks* picks = nullptr) {
    float* hid = hidden_rows_for(n);
    const bool tracing = trace && !record;
    if (tracing) trace_picks.resize(static_cast<size_t>(n) * layer_picks());
    if (record && multi_applies(n)) {  // pending tokens: the multi-token step, bitwise the decode steps'
      run_multi(tokens, n, logits_out, all_positions, hid);
      return;
    }
    // Prompts, and pending tokens the multi-token step does not take (multi_applies says why).
    if (n > 1 && opt.batched_prefill) {
      int* traced = tracing ? trace_buf.reserve(static_cast<size_t>(n), layer_picks(), "routing trace rows") : nullptr;
      {
        std::lock_guard<std::mutex> lock(gm->exclusive());
        if (hybrid) hybrid->order_after_last(stream);
        gm->prefill().run(st, tokens, n, logits_out, all_positions, stream, hybrid, route_counts, replay_rows(n),
                          record, hid, picks, traced, hid && !tap_of.empty() ? &tap_layers : nullptr);
        if (hybrid) hybrid->record_last(stream);
      }
      if (hid) copy_hidden(n);
      if (traced) {
        check_cuda(cudaMemcpyAsync(trace_picks.data(), traced, trace_picks.size() * sizeof(int), cudaMemcpyDeviceToHost,
                                   stream),
                   "copy expert picks");
        sync();
      }
      return;
    }
    const auto lock = hold_hybrid();
    const size_t vocab = static_cast<size_t>(c.n_vocab);
    for (int t = 0; t < n; ++t) {
      step(tokens[t]);
      if (hid) step_hidden_rows(one.x, 1, hid + static_cast<size_t>(t) * hidden_width());
      if (record) {
        st.record_step(t, stream);
        const size_t picks = layer_picks();
        check_cuda(cudaMemcpyAsync(st.route_steps + static_cast<size_t>(t) * picks, one.ids, picks * sizeof(int),
                                   cudaMemcpyDeviceToDevice, stream),
                   "record expert picks");
      }
      if (tracing)  // pageable host memory: the copy is complete when the call returns
        check_cuda(cudaMemcpyAsync(trace_picks.data() + static_cast<size_t>(t) * layer_picks(), one.ids,
                                   layer_picks() * sizeof(int), cudaMemcpyDeviceToHost, stream),
                   "copy expert picks");
      const bool copy = logits_out && (all_positions || t == n - 1);
      if (copy)
        check_cuda(cudaMemcpyAsync(h_logits, one.logits, vocab * sizeof(float), cudaMemcpyDeviceToHost, stream),
                   "copy logits");
      sync();
      if (copy)
        std::memcpy(logits_out + (all_positions ? static_cast<size_t>(t) * vocab : 0), h_logits, vocab * sizeof(float));
    }
    if (hid) copy_hidden(n);
  }

  // Whether the multi-token step runs these n pending tokens: the model fits it (multi_step_fits) and n
  // is within a token grid.
  bool multi_applies(int n) const { return multi_fits && n >= 2 && n <= kMaxStepTokens; }

  // Runs n pending tokens (multi_applies) as one multi-token step at positions n_past.. and advances
  // n_past: token t's logits (logits_out: [n x n_vocab], or the last token's unless all_positions; may
  // be null) and hidden row (hid, may be null) are what t + 1 decode steps give, and step record t holds
  // the DeltaNet state and expert picks after token t (the caller reserved n records; the last token's
  // state is the live one, its record holds only the conv window and the picks).
  // picks: instead of logits, token t's arg-max over ids < n_pick (argmax_wide) to picks[t].
  // tree (null: a chain): token t sits at position n_past + depth(t), its key/value rows at n_past + t;
  // it attends to the kept tokens and its ancestors and runs from its parent's DeltaNet state, so its
  // logits are what the decode steps of its root path give.
  void run_multi(const int32_t* tokens, int n, float* logits_out, bool all_positions, float* hid,
                 int32_t* picks = nullptr, int32_t n_pick = 0, const TokenTree* tree = nullptr) {
    h_mio[kMioBase] = n_past;
    for (int t = 0; t < n; ++t) {
      const int depth = tree ? tree->depth(t) : t;
      h_mio[t] = tokens[t];
      h_mio[kMioPos + t] = n_past + depth;
      h_mio[kMioParents + t] = tree ? tree->parent(t) : t - 1;
      int* path = h_mio + kMioPath + t * kMaxStepTokens;
      for (int u = t, d = depth; u >= 0; u = tree ? tree->parent(u) : u - 1, --d) path[d] = n_past + u;
    }
    check_cuda(cudaMemcpyAsync(d_mio, h_mio, kMioInputs * sizeof(int), cudaMemcpyHostToDevice, stream),
               "copy tokens");
    if (replay_src) {  // the previous step's copy from h_replay_multi completed before it returned
      replay_src->next(n, h_replay_multi);
      check_cuda(cudaMemcpyAsync(d_replay_multi, h_replay_multi, static_cast<size_t>(n) * replay_stride * sizeof(int),
                                 cudaMemcpyHostToDevice, stream),
                 "copy replayed picks");
    }
    const auto lock = hold_hybrid();
    if (hybrid) hybrid->order_after_last(stream);
    if (mgraph_steps != st.step_cap() || (picks && n_pick != mgraph_pick_range)) {
      // The graphs write into the step records and pick over ids < n_pick: captured again.
      check_cuda(cudaStreamSynchronize(stream), "multi-token step");
      destroy_multi_graphs();
      mgraph_steps = st.step_cap();
      if (picks) mgraph_pick_range = n_pick;
    }
    // One graph: the step, its step records' picks and, for picks, the arg-max of every row.
    const bool pick = picks != nullptr;
    run_graph(mgraphs[pick ? 1 : 0][st.parity()][n], "multi-token step (graph)", [this, n, pick] {
      enqueue_multi(n);
      enqueue_step_record_picks(n);
      if (pick)
        argmax_wide(multi.logits, mgraph_pick_range, mpick_part, mpick_counter, d_mpicks, stream, false, nullptr,
                    nullptr, n, static_cast<int64_t>(c.n_vocab));
    });
    if (hybrid) hybrid->record_last(stream);
    n_past += n;
    // The layer taps are read back from where the step left them; final states are normed first.
    const float* hid_rows = hid && !tap_of.empty() ? d_taps.data : hid;
    if (hid && tap_of.empty()) step_hidden_rows(multi.x, n, hid);
    const size_t vocab = static_cast<size_t>(c.n_vocab);
    const size_t first = all_positions ? 0 : static_cast<size_t>(n - 1);  // the rows copied
    const size_t floats = (static_cast<size_t>(n) - first) * vocab;
    if (logits_out) {
      if (!h_mlogits)
        check_cuda(cudaMallocHost(&h_mlogits, kMaxStepTokens * vocab * sizeof(float)), "cudaMallocHost(logits)");
      check_cuda(cudaMemcpyAsync(h_mlogits, multi.logits + first * vocab, floats * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream),
                 "copy logits");
    }
    int* h_picks = h_mio + kMioPicks;
    if (picks) {
      check_cuda(cudaMemcpyAsync(h_picks, d_mpicks, static_cast<size_t>(n) * sizeof(int), cudaMemcpyDeviceToHost, stream),
                 "copy picks");
    }
    const size_t hid_floats = hid ? static_cast<size_t>(n) * hidden_width() : 0;
    if (hid) {  // read back with the rest: one synchronisation
      if (!h_mhidden)
        check_cuda(cudaMallocHost(&h_mhidden, kMaxStepTokens * hidden_width() * sizeof(float)),
                   "cudaMallocHost(hidden rows)");
      check_cuda(cudaMemcpyAsync(h_mhidden, hid_rows, hid_floats * sizeof(float), cudaMemcpyDeviceToHost, stream),
                 "copy hidden rows");
    }
    sync();
    if (logits_out) std::memcpy(logits_out, h_mlogits, floats * sizeof(float));
    if (picks) std::copy_n(h_picks, n, picks);
    if (hid) hidden_rows.assign(h_mhidden, h_mhidden + hid_floats);
  }

  // The next n tokens' replayed picks on the device for a prefill (null without a replay). The prefill
  // synchronises its stream before it returns, so the buffer is free again by the next call.
  const int* replay_rows(int n) {
    if (!replay_src) return nullptr;
    int* d_rows = replay_rows_buf.reserve(static_cast<size_t>(n), replay_stride, "replayed picks");
    std::vector<int> h(static_cast<size_t>(n) * replay_stride);
    replay_src->next(n, h.data());
    // A pageable source: the call returns once h is staged, so h may go.
    check_cuda(cudaMemcpyAsync(d_rows, h.data(), h.size() * sizeof(int), cudaMemcpyHostToDevice, stream),
               "copy replayed picks");
    return d_rows;
  }

  // Replayed routing from now on (null: the router again). The decode graphs read the picks through
  // the routing rule, so they are captured again.
  void set_replay(RoutingSource* src) {
    if (src) check_replay_shape(*src, static_cast<int>(c.routed_layers().size()), c.n_expert, c.n_expert_used);
    drop();
    check_cuda(cudaStreamSynchronize(stream), "decode step");
    destroy_graphs();
    replay_src = src;
    if (!src || d_replay_step) return;
    replay_row = c.routed_index();
    replay_stride = c.routed_layers().size() * static_cast<size_t>(c.n_expert_used);
    d_replay_step = dalloc<int>(replay_stride);
    check_cuda(cudaMallocHost(&h_replay_ring, kReplaySlots * replay_stride * sizeof(int)), "cudaMallocHost(replay)");
    if (multi_fits) {
      d_replay_multi = dalloc<int>(kMaxStepTokens * replay_stride);
      check_cuda(cudaMallocHost(&h_replay_multi, kMaxStepTokens * replay_stride * sizeof(int)),
                 "cudaMallocHost(replay)");
    }
  }

  // Pending tokens (Sequence::forward_pending): a chain runs once, recording the DeltaNet state and
  // expert picks after each token (DeviceSequenceState step records); keep() of m of them copies step
  // m-1's state back, uncounts the later tokens' picks and moves n_past (the KV rows beyond are written
  // again before they are read). A tree of up to kMaxStepTokens tokens runs as one multi-token step where
  // that step runs (each token at its depth's position over its ancestors' rows, its DeltaNet state from
  // its parent's record; keep_tree moves the kept rows). Otherwise a tree runs path by path from a
  // snapshot of the state taken before the pending tokens; keep() of a path that is no prefix of the last
  // one run runs it again from there.
  bool has_pending = false;
  int pending_base = 0;     // n_past before the pending tokens
  TokenTree begin_pending(const int32_t* tokens, int n, const int* parents);
  void abandon_pending();  // after a failed pending run: back to the snapshot, nothing pending
  TokenTree pending;
  std::vector<int> held;    // the pending root path the state holds now
  std::vector<int32_t> pending_tokens;

  // Sequence::set_hidden_record: while set, each run copies its tokens' hidden rows (the final states,
  // rmsnorm(x) * output_norm, what the lm_head scores; or the layer taps) to hidden_rows; forward()
  // appends them to the record, and
  // pending tokens' rows wait in pending_hidden until keep() says which of them the record gets.
  std::shared_ptr<HiddenRecord> hidden;
  // Sequence::set_routing_trace: while set, a plain run (record off) copies its tokens' picks to
  // trace_picks and forward() appends them; keep() appends the kept pending tokens' from the step
  // records. Decode steps then go through forward() too (no on-device pick, no lookahead).
  RoutingTraceWriter* trace = nullptr;
  uint32_t trace_stream = 0;
  std::vector<int> trace_picks;  // [n x n_layer x k] of the last plain run
  GrowingRows<int> trace_buf;    // a prefill's picks on the device
  size_t layer_picks() const { return static_cast<size_t>(c.n_layer) * static_cast<size_t>(c.n_expert_used); }
  // A record with layers: tap_of[il] is layer il's place among them (-1: not tapped; empty: no taps);
  // the steps copy the tapped layers' rows to d_taps, [kMaxStepTokens x taps x n_embd].
  std::vector<int> tap_of;
  std::vector<int> tap_layers;  // the record's layers when it was set (empty: final states)
  GrowingRows<float> d_taps;
  size_t hidden_width() const { return static_cast<size_t>(c.n_embd) * std::max<size_t>(1, tap_layers.size()); }
  // A decode or multi-token step's T hidden rows (x: its final residual rows) into hid: the layer taps
  // the step copied to d_taps, or the final states.
  void step_hidden_rows(const float* x, int T, float* hid) {
    if (tap_of.empty()) {
      rmsnorm_rows(x, dm.output_norm, c.rms_eps, T, c.n_embd, hid, stream);
      return;
    }
    check_cuda(cudaMemcpyAsync(hid, d_taps.data, static_cast<size_t>(T) * hidden_width() * sizeof(float),
                               cudaMemcpyDeviceToDevice, stream),
               "copy layer taps");
  }
  std::vector<float> hidden_rows;     // [n x hidden_width()] of the last run
  std::vector<float> pending_hidden;  // [pending tokens x hidden_width()]
  GrowingRows<float> hidden_buf;      // the device rows of a run
  // The run's n rows from the device (its stream has run them).
  void copy_hidden(int n) {
    hidden_rows.resize(static_cast<size_t>(n) * hidden_width());
    check_cuda(cudaMemcpyAsync(hidden_rows.data(), hidden_buf.data, hidden_rows.size() * sizeof(float), cudaMemcpyDeviceToHost,
                               stream),
               "copy hidden rows");
    sync();
  }

  // The DeltaNet state, n_past and the routing counters as they were before the pending tokens: the
  // counters then hold the kept tokens' picks only, each once (as the CPU engine counts them).
  void save_snapshot() {
    copy_snapshot(true);
    pending_base = n_past;
  }
  void restore_snapshot() {
    copy_snapshot(false);
    n_past = pending_base;
  }
  // The DeltaNet state and the routing counters, aside or back, in one launch.
  void copy_snapshot(bool save) {
    std::vector<DeviceCopy> copies;
    st.snapshot_copies(save, copies);
    DeviceCopy counts;
    counts.dst = save ? route_counts_saved : route_counts;
    counts.src = save ? route_counts : route_counts_saved;
    counts.row_bytes = route_counts_bytes();
    copies.push_back(counts);
    copy_batch(copies, stream);
  }
  size_t route_counts_bytes() const {
    return static_cast<size_t>(c.n_layer) * static_cast<size_t>(c.n_expert) * sizeof(unsigned long long);
  }

  // Runs pending path `path` from the snapshot, recording each token: n_past = pending_base + its length.
  void run_path(const std::vector<int>& path, float* logits_out) {
    restore_snapshot();
    held.clear();  // until the path has run, the state holds no pending path
    if (path.empty()) return;
    std::vector<int32_t> tokens;
    for (int i : path) tokens.push_back(pending_tokens[static_cast<size_t>(i)]);
    run(tokens.data(), static_cast<int>(tokens.size()), logits_out, logits_out != nullptr, true);
    held = path;
  }

  // Keeps root path path[0..m) of a tree that ran as one multi-token step (tree_pending): each kept token's
  // key/value rows move from its row (pending_base + its index) to its position's (pending_base + depth),
  // in depth order (a row read later is never one written earlier: path[i] >= i); the state of the last
  // kept token comes back from its step record (the last token's is the live one); the other tokens'
  // picks are uncounted. m == 0: the snapshot.
  void keep_tree(const int* path, int m) {
    const int n = pending.size();
    tree_pending = false;
    held.clear();
    if (m == 0) {
      restore_snapshot();
      return;
    }
    for (int i = 0; i < m; ++i) {
      if (path[i] == i) continue;
      std::vector<DeviceCopy> copies;
      for (const DeviceLayerState& L : st.layers) {
        if (!L.k) continue;
        auto row = [&L](int p) { return static_cast<size_t>(L.rows > 0 ? p % L.rows : p); };
        const size_t from = row(pending_base + path[i]), to = row(pending_base + i);
        const size_t kb = kv_row_bytes(L.kv.k, kv_width()), vb = kv_row_bytes(L.kv.v, kv_width());
        DeviceCopy k, v;
        k.dst = static_cast<char*>(L.k) + to * kb, k.src = static_cast<const char*>(L.k) + from * kb, k.row_bytes = kb;
        v.dst = static_cast<char*>(L.v) + to * vb, v.src = static_cast<const char*>(L.v) + from * vb, v.row_bytes = vb;
        copies.push_back(k);
        copies.push_back(v);
      }
      for (size_t b = 0; b < copies.size(); b += kMaxDeviceCopies)
        copy_batch(copies.data() + b, static_cast<int>(std::min<size_t>(kMaxDeviceCopies, copies.size() - b)), stream);
    }
    if (path[m - 1] != n - 1) st.select_step(path[m - 1], stream);
    std::vector<char> kept(static_cast<size_t>(n), 0);
    for (int i = 0; i < m; ++i) kept[static_cast<size_t>(path[i])] = 1;
    for (int t = 0; t < n; ++t)
      if (!kept[static_cast<size_t>(t)]) uncount_step(t);
    n_past = pending_base + m;
  }

  // Takes the router picks of step record t out of the routing counts.
  void uncount_step(int t) {
    const size_t picks = static_cast<size_t>(c.n_layer) * c.n_expert_used;
    uncount_routes(st.route_steps + static_cast<size_t>(t) * picks, c.n_layer, c.n_expert_used, c.n_expert,
                   route_counts, stream);
  }

  // Keeps the first m tokens of the path the state holds (m <= held.size()): the state of step m-1, the
  // router picks of the tokens before it. A hybrid session's telemetry still counts every token run.
  void keep_held_prefix(int m) {
    if (m == 0) {
      restore_snapshot();
    } else {
      const int len = static_cast<int>(held.size());
      if (m < len) st.select_step(m - 1, stream);
      for (int t = m; t < len; ++t) uncount_step(t);
      n_past = pending_base + m;
    }
    held.resize(static_cast<size_t>(m));
  }

  void validate(const int32_t* tokens, int n) const {
    if (has_pending) fail("tokens are pending: keep() them (or none) before the next forward");
    if (n <= 0) fail("forward needs at least one token");
    if (n_past + n > max_ctx) fail("prompt of ", n_past + n, " tokens exceeds the context of ", max_ctx);
    for (int t = 0; t < n; ++t)
      if (tokens[t] < 0 || tokens[t] >= c.n_vocab)
        fail("token id ", tokens[t], " at index ", t, " is out of range (vocabulary of ", c.n_vocab, ")");
  }

  // The MTP head (GpuMtpHead), allocated on first use: block 0 of dm.mtp over a cache of its own. T
  // rows (up to mtp_max_rows()) are one graph replay of the decode step's layer launches over a token
  // grid, as the multi-token step, reading tokens and positions from io and hidden rows from h; the
  // last row's pick goes to io[0] and its output to h's first row, so chained rows (T = 1) run with no
  // host in between.
  struct MtpPart {
    DeviceSequenceState st;  // the MTP layer's KV cache
    StepRows r;
    int* io = nullptr;      // [kMaxStepTokens each: tokens, positions, the chained rows' positions]
    float* h = nullptr;     // [kMaxStepTokens x n_embd]
    float* both = nullptr;  // [kMaxStepTokens x 2 n_embd]: each row's en then hn, as eh_proj's columns
    // A call's inputs: staged in pinned host memory (copies from it are asynchronous, so the host
    // never waits for the stream before the last read back), then on the device.
    unsigned char* h_stage = nullptr;
    size_t h_stage_bytes = 0;
    GrowingRows<int> ints;      // the chained rows' positions, the rows' tokens, the rows' positions
    GrowingRows<float> rows_h;  // the rows' hidden rows
    GrowingRows<int> picks;     // the picks read back
    cudaGraphExec_t graphs[kMaxStepTokens + 1] = {};  // by row count
    // A whole draft (draft_fused): T rows and C chained rows in one graph, by (T, C); the chained rows'
    // positions at io + 2 kMaxStepTokens, the picks in `out`; inputs staged through h_in / h_rows.
    std::map<std::pair<int, int>, cudaGraphExec_t> drafts;
    int* out = nullptr;               // [kMaxStepTokens + 1] picks
    int* h_in = nullptr;              // pinned [3 kMaxStepTokens] ints, then [kMaxStepTokens + 1] picks
    float* h_rows = nullptr;          // pinned [kMaxStepTokens x n_embd]
    bool in_flight = false;           // a draft_fused call's copies may still be running
    int64_t n_allowed = 0;  // ids the graphs' arg-max covers
    int n_past = 0;
    MtpPart(const Model& model, int ctx, KvCacheTypes kv) : st(mtp_cache_config(model), ctx, kv) {}
    void destroy_graphs() {
      for (cudaGraphExec_t& g : graphs) {
        if (g) cudaGraphExecDestroy(g);
        g = nullptr;
      }
      // Direct launches (STRATA_GPU_PROFILE=1) leave null entries; destroying one would leave an error
      // behind that the next launch check reports as its own.
      for (auto& [shape, g] : drafts)
        if (g) cudaGraphExecDestroy(g);
      drafts.clear();
    }
  };
  std::unique_ptr<MtpPart> mtp;

  // Why this session cannot run the MTP head on the GPU ("" when it can).
  std::string mtp_unsupported() const {
    if (c.n_mtp == 0) return "the model has no multi-token-prediction layer";
    if (hybrid || dm.hybrid())
      return "the session keeps experts on the CPU (hybrid), whose VRAM plan leaves the MTP layer off the GPU";
    if (!is_attention(c.mtp_layer.mixer)) return "the MTP layer's mixer is not attention";
    return "";
  }

  // The most rows one MTP graph runs: a token grid where the multi-token step's scratch exists and the
  // MTP layer's experts fit one launch (multi_step_fits' rule), else one.
  int mtp_max_rows() const {
    if (!multi_fits) return 1;
    const bool shared = c.mtp_layer.ffn == FfnKind::Moe && dm.mtp[0].layer.moe.has_shared;
    return c.mtp_layer.ffn != FfnKind::Moe || c.n_expert_used + (shared ? 1 : 0) <= kMaxGemvJobs ? kMaxStepTokens : 1;
  }

  void mtp_setup() {
    if (mtp) return;
    const std::string why = mtp_unsupported();
    if (!why.empty()) fail("GPU MTP head: ", why);
    gm->device_with_mtp();  // dm is that device model
    mtp = std::make_unique<MtpPart>(model, max_ctx, opt.kv_types);
    const size_t rows = static_cast<size_t>(kMaxStepTokens) * static_cast<size_t>(c.n_embd);
    mtp->r = alloc_rows(kMaxStepTokens);
    mtp->io = dalloc<int>(3 * kMaxStepTokens);
    mtp->r.pos = mtp->io + kMaxStepTokens;
    mtp->out = dalloc<int>(kMaxStepTokens + 1);
    check_cuda(cudaMallocHost(&mtp->h_in, (4 * kMaxStepTokens + 1) * sizeof(int)), "cudaMallocHost(MTP rows)");
    check_cuda(cudaMallocHost(&mtp->h_rows, rows * sizeof(float)), "cudaMallocHost(MTP rows)");
    mtp->h = dalloc<float>(rows);
    mtp->both = dalloc<float>(2 * rows);
    check_cuda(cudaDeviceSynchronize(), "allocate");  // alloc_rows' memsets precede any use on the stream
  }

  void mtp_release() {
    if (!mtp) return;
    mtp->destroy_graphs();
    if (mtp->h_stage) cudaFreeHost(mtp->h_stage);
    if (mtp->h_in) cudaFreeHost(mtp->h_in);
    if (mtp->h_rows) cudaFreeHost(mtp->h_rows);
    mtp->ints.release();
    mtp->rows_h.release();
    mtp->picks.release();
    mtp.reset();
  }

  // Every kernel of T MTP rows (engine/mtp.h's formulas), with the decode step's layer launches; the
  // lm_head and arg-max for the last row only.
  // tokens, pos: the rows' token ids and positions (device; the tokens may be an earlier row's pick:
  // embed_rows starts after the previous kernel has completed); the last row's pick goes to *pick.
  void enqueue_mtp_rows(int T, const int* tokens, const int* pos, int* pick) {
    MtpPart& m = *mtp;
    const DevMtp& w = dm.mtp[0];
    const int d = c.n_embd;
    StepRows r = m.r;
    r.pos = pos;
    prefill::embed_rows(dm.token_embd, tokens, T, m.r.x, stream);
    // The embedding half first, as eh_proj's columns are ordered.
    rmsnorm_rows_pair(m.r.x, w.enorm, m.h, w.hnorm, c.rms_eps, T, d, m.both, 2 * static_cast<int64_t>(d), stream);
    GemvJob in = job_to(w.eh_proj, m.r.x, rw.x);
    in.x = m.both, in.x_token_stride = 2 * static_cast<int64_t>(d);
    gemv_batch(&in, 1, stream, nullptr, nullptr, nullptr, nullptr, T);
    const int il = c.n_layer;  // the MTP layer's index (layer_spec, layer_ids)
    mixer(il, w.layer, m.st.layers[0], r, T);
    ffn(il, w.layer, r, T);
    // The last row's output is what a chained row takes: it goes to h's first row.
    rmsnorm_rows(m.r.x + static_cast<int64_t>(T - 1) * rw.x, w.shared_head_norm, c.rms_eps, 1, d, m.h, stream);
    GemvJob head = job_to(dm.output, m.r.logits, rw.vocab);
    head.x = m.h;
    gemv_batch(&head, 1, stream);
    argmax_wide(m.r.logits, m.n_allowed, argmax_part, argmax_counter, pick, stream);
  }
  // io's rows: tokens and positions there, the pick to io[0] (where a chained row takes its token).
  void enqueue_mtp_rows(int T) { enqueue_mtp_rows(T, mtp->io, mtp->io + kMaxStepTokens, mtp->io); }

  // Enqueues T MTP rows at positions mtp->n_past.. (io and h already hold their inputs) and advances.
  void launch_mtp_rows(int T, int32_t n_allowed) {
    MtpPart& m = *mtp;
    if (T < 1 || T > mtp_max_rows()) fail("GPU MTP head: ", T, " rows in one launch");
    if (m.n_past + T > max_ctx) fail("GPU MTP head: ", m.n_past + T, " positions exceed the context of ", max_ctx);
    set_mtp_argmax_range(n_allowed);
    run_graph(m.graphs[T], nullptr, [this, T] { enqueue_mtp_rows(T); });
    m.n_past += T;
  }

  // The MTP graphs' arg-max covers ids < n_allowed: they are captured again when it changes.
  void set_mtp_argmax_range(int32_t n_allowed) {
    MtpPart& m = *mtp;
    if (n_allowed == m.n_allowed) return;
    check_cuda(cudaStreamSynchronize(stream), "MTP rows");
    m.destroy_graphs();
    m.n_allowed = n_allowed;
  }

  // Whether draft_fused takes n rows and `count` chained rows.
  bool mtp_fused_fits(int n, int count) const { return n >= 1 && n <= mtp_max_rows() && count >= 0 && count < kMaxStepTokens; }

  // T rows (io, h) then C chained rows: row i of the chain takes the pick out[i] at position io[2K + i]
  // and leaves its pick in out[i + 1] (what launch_mtp_rows and the copies of GpuMtpHead do, with no
  // host and no copy in between).
  void enqueue_mtp_draft(int T, int C) {
    MtpPart& m = *mtp;
    constexpr int K = kMaxStepTokens;
    enqueue_mtp_rows(T, m.io, m.io + K, m.out);
    for (int i = 0; i < C; ++i) enqueue_mtp_rows(1, m.out + i, m.io + 2 * K + i, m.out + i + 1);
  }

  // GpuMtpHead::draft in one graph: the inputs in two copies, the picks in one. The caller has checked
  // the inputs, the room in the head's context and mtp_fused_fits(n, count).
  void draft_fused(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
                   std::vector<int32_t>& picks) {
    MtpPart& m = *mtp;
    constexpr int K = kMaxStepTokens;
    set_mtp_argmax_range(n_allowed);
    if (m.in_flight) sync();  // a call that failed midway may have left copies reading the pinned inputs
    m.in_flight = true;
    for (int t = 0; t < n; ++t) {
      m.h_in[t] = tokens[t];
      m.h_in[K + t] = m.n_past + t;
    }
    for (int i = 0; i < count; ++i) m.h_in[2 * K + i] = m.n_past + n + i;
    const size_t d = static_cast<size_t>(c.n_embd);
    std::copy_n(hidden, static_cast<size_t>(n) * d, m.h_rows);
    check_cuda(cudaMemcpyAsync(m.io, m.h_in, 3 * K * sizeof(int), cudaMemcpyHostToDevice, stream), "copy MTP rows");
    check_cuda(cudaMemcpyAsync(m.h, m.h_rows, static_cast<size_t>(n) * d * sizeof(float), cudaMemcpyHostToDevice, stream),
               "copy MTP hidden rows");
    run_graph(m.drafts[{n, count}], nullptr, [this, n, count] { enqueue_mtp_draft(n, count); });
    int* h_out = m.h_in + 3 * K;
    check_cuda(cudaMemcpyAsync(h_out, m.out, static_cast<size_t>(count + 1) * sizeof(int), cudaMemcpyDeviceToHost, stream),
               "copy MTP picks");
    sync();
    m.in_flight = false;
    m.n_past += n + count;
    for (int i = 0; i <= count; ++i) {
      if (h_out[i] < 0) fail("GPU MTP head: no token has a finite logit");
      picks.push_back(h_out[i]);
    }
  }
};

GpuSession::GpuSession(const Model& model, int max_ctx, GpuSessionOptions options)
    : GpuSession(make_gpu_model(model, options), max_ctx, options) {}

GpuSession::GpuSession(std::shared_ptr<GpuModel> model, int max_ctx, GpuSessionOptions options)
    : impl_(std::make_unique<Impl>(std::move(model), max_ctx, std::move(options))) {}

GpuSession::~GpuSession() = default;

void GpuSession::forward(const int32_t* tokens, int n, float* logits_out, bool all_positions) {
  Impl& m = *impl_;
  m.validate(tokens, n);
  m.drop();
  m.run(tokens, n, logits_out, all_positions);
  if (m.hidden) m.hidden->append(tokens, m.hidden_rows.data(), n);
  if (m.trace) append_layer_picks(*m.trace, m.trace_stream, m.c, m.trace_picks.data(), n);
}

// What every pending run does first: checks, room for the step records, the snapshot to return to.
TokenTree GpuSession::Impl::begin_pending(const int32_t* tokens, int n, const int* parents) {
  validate(tokens, n);
  // A sliding layer's ring keeps the window behind a limited number of pending tokens (as the CPU's).
  const int limit = forward_token_limit(c, max_ctx);
  if (n > limit)
    fail("forward_pending: ", n, " tokens at once; this sequence's sliding-window caches take at most ", limit,
         " per forward");
  TokenTree tree = TokenTree::from_parents(parents, n);
  drop();
  // What one run records: a chain's tokens or a tree's when it runs as one multi-token step, else the
  // longest root path of the tree (run path by path).
  int longest = 0;
  for (int t = 0; t < n; ++t) longest = std::max(longest, tree.depth(t) + 1);
  st.reserve_steps(multi_applies(n) ? n : longest);
  save_snapshot();
  held.clear();  // no pending path has run yet (held may still name the last round's kept path)
  tree_pending = false;
  pending_tokens.assign(tokens, tokens + n);
  has_pending = true;  // from here on a failure leaves the snapshot to return to
  return tree;
}

void GpuSession::Impl::abandon_pending() {
  has_pending = false;
  tree_pending = false;
  restore_snapshot();
  sync();
}

void GpuSession::forward_pending_picks(const int32_t* tokens, int n, const int* parents, int32_t n_allowed,
                                       int32_t* picks) {
  Impl& m = *impl_;
  // The multi-token step (chains and trees) and the batched prefill (chains) pick on the device; a run
  // token by token or path by path copies its logits and picks on the host.
  const bool chain = parents == nullptr || TokenTree::from_parents(parents, n).is_chain();
  const bool multi = m.multi_applies(n);
  if (!multi && !(chain && n > 1 && m.opt.batched_prefill))
    return Sequence::forward_pending_picks(tokens, n, parents, n_allowed, picks);
  check_pick_range(n_allowed);
  TokenTree tree = m.begin_pending(tokens, n, chain ? nullptr : parents);
  try {
    if (!chain) {
      m.run_multi(tokens, n, nullptr, false, m.hidden_rows_for(n), picks, n_allowed, &tree);
    } else {
      for (int i = 0; i < n; ++i) m.held.push_back(i);
      if (multi) {
        m.run_multi(tokens, n, nullptr, false, m.hidden_rows_for(n), picks, n_allowed);
      } else {
        PrefillPicks pp;
        pp.out = picks, pp.n_allowed = n_allowed;
        m.run(tokens, n, nullptr, true, true, &pp);
      }
    }
    if (m.hidden) m.pending_hidden = m.hidden_rows;
    for (int t = 0; t < n; ++t)
      if (picks[t] < 0) fail("sampler: no token has a finite logit (all banned or NaN)");
  } catch (...) {
    m.abandon_pending();
    throw;
  }
  m.tree_pending = !chain;
  m.pending = std::move(tree);
}

void GpuSession::forward_pending(const int32_t* tokens, int n, const int* parents, float* logits_out) {
  Impl& m = *impl_;
  const TokenTree tree = m.begin_pending(tokens, n, parents);
  try {
    if (tree.is_chain()) {
      m.held.clear();
      for (int i = 0; i < n; ++i) m.held.push_back(i);
      m.run(tokens, n, logits_out, true, true);
      if (m.hidden) m.pending_hidden = m.hidden_rows;
    } else if (m.multi_applies(n)) {
      // The whole tree in one multi-token step: each token at its depth's position, attending to the kept
      // tokens and its ancestors, its DeltaNet state continuing its parent's record; keep_tree follows.
      m.run_multi(tokens, n, logits_out, true, m.hidden_rows_for(n), nullptr, 0, &tree);
      if (m.hidden) m.pending_hidden = m.hidden_rows;
      m.tree_pending = true;
    } else {
      // Every token lies on some root-to-leaf path: run each leaf's path from the snapshot. The path of
      // first children from the first root (the drafter's likeliest line, verified first) runs last, so
      // that keeping a prefix of it needs no second run.
      std::vector<int> first_child(static_cast<size_t>(n), -1);
      std::vector<char> done(static_cast<size_t>(n), 0);
      for (int i = n - 1; i >= 0; --i)
        if (tree.parent(i) >= 0) first_child[static_cast<size_t>(tree.parent(i))] = i;
      int main_leaf = 0;
      while (first_child[static_cast<size_t>(main_leaf)] >= 0) main_leaf = first_child[static_cast<size_t>(main_leaf)];
      std::vector<int> leaves;
      for (int i = 0; i < n; ++i)
        if (first_child[static_cast<size_t>(i)] < 0 && i != main_leaf) leaves.push_back(i);
      leaves.push_back(main_leaf);
      const size_t vocab = static_cast<size_t>(m.c.n_vocab);
      const size_t d = m.hidden_width();  // a hidden row: final state or layer taps
      if (m.hidden) m.pending_hidden.resize(static_cast<size_t>(n) * d);
      std::vector<float> rows;
      for (const int leaf : leaves) {
        const std::vector<int> path = tree.path_to(leaf);
        rows.resize(path.size() * vocab);
        m.run_path(path, rows.data());
        for (size_t j = 0; j < path.size(); ++j) {
          const size_t t = static_cast<size_t>(path[j]);
          if (done[t]) continue;
          std::memcpy(logits_out + t * vocab, rows.data() + j * vocab, vocab * sizeof(float));
          if (m.hidden) std::memcpy(m.pending_hidden.data() + t * d, m.hidden_rows.data() + j * d, d * sizeof(float));
          done[t] = 1;
        }
      }
    }
  } catch (...) {
    m.abandon_pending();
    throw;
  }
  m.pending = tree;
}

void GpuSession::keep(const int* path, int n) {
  Impl& m = *impl_;
  if (!m.has_pending) fail("keep: no tokens are pending (run forward_pending first)");
  m.pending.check_path(path, n);
  const std::vector<int> want(path, path + n);
  const bool prefix = want.size() <= m.held.size() && std::equal(want.begin(), want.end(), m.held.begin());
  const bool tree = m.tree_pending;
  if (tree) {
    m.keep_tree(path, n);
  } else {
    if (!prefix) m.run_path(want, nullptr);
    m.keep_held_prefix(n);
  }
  if (m.trace && n > 0) {
    // Step record t holds pending token t's picks after a tree's one step, else the t-th token of the
    // path the state ran (the kept path's prefix).
    const size_t step = m.layer_picks();
    m.trace_picks.resize(static_cast<size_t>(n) * step);
    for (int j = 0; j < n; ++j)
      check_cuda(cudaMemcpyAsync(m.trace_picks.data() + static_cast<size_t>(j) * step,
                                 m.st.route_steps + static_cast<size_t>(tree ? path[j] : j) * step, step * sizeof(int),
                                 cudaMemcpyDeviceToHost, m.stream),
                 "copy expert picks");
  }
  // The state's copies need no wait: whatever runs next is queued behind them on the stream.
  if (m.trace) m.sync();
  m.has_pending = false;
  if (m.trace) append_layer_picks(*m.trace, m.trace_stream, m.c, m.trace_picks.data(), n);
  if (!m.hidden) return;
  const size_t d = m.hidden_width();
  for (int j = 0; j < n; ++j) {
    const size_t t = static_cast<size_t>(path[j]);
    m.hidden->append(&m.pending_tokens[t], m.pending_hidden.data() + t * d, 1);
  }
}

void GpuSession::set_hidden_record(std::shared_ptr<HiddenRecord> record) {
  Impl& m = *impl_;
  if (record == m.hidden) return;
  const int width = record ? record->width_for(m.c.n_layer, m.c.n_embd) : m.c.n_embd;  // checks the layers
  std::vector<int> layers = record ? record->layers : std::vector<int>{};
  std::vector<int> tap_of;
  if (!layers.empty()) {
    tap_of.assign(static_cast<size_t>(m.c.n_layer), -1);
    for (size_t j = 0; j < layers.size(); ++j) tap_of[static_cast<size_t>(layers[j])] = static_cast<int>(j);
  }
  if (tap_of != m.tap_of) {  // the step graphs copy the taps: captured again
    // The new taps' buffer first, so that a failed allocation leaves the session as it was.
    GrowingRows<float> taps;
    if (!layers.empty()) taps.reserve(Impl::kMaxStepTokens, static_cast<size_t>(width), "layer taps");
    m.drop();
    check_cuda(cudaStreamSynchronize(m.stream), "decode step");
    m.destroy_graphs();
    m.d_taps.release();
    m.d_taps = taps;
    m.tap_of = std::move(tap_of);
    m.tap_layers = layers;
    m.hidden_buf.release();  // rows of another width
    if (m.h_mhidden) cudaFreeHost(m.h_mhidden);
    m.h_mhidden = nullptr;
  }
  if (record) {
    record->width = width;
    record->restart(n_past());
  }
  m.hidden = std::move(record);
}

bool GpuSession::has_pending() const { return impl_->has_pending; }

void GpuSession::set_routing_trace(RoutingTraceWriter* trace, uint32_t stream) {
  Impl& m = *impl_;
  if (trace) check_trace_fits(trace->header(), m.c);
  m.trace = trace;
  m.trace_stream = stream;
}

std::vector<float> GpuSession::deltanet_state() const {
  Impl& m = *impl_;
  m.drop();  // a lookahead step in flight is not the state
  const size_t conv = m.st.conv_window_floats(), ssm = m.st.ssm_state_floats();
  std::vector<float> out;
  for (const DeviceLayerState& L : m.st.layers) {
    if (!L.ssm) continue;
    const size_t at = out.size();
    out.resize(at + conv + ssm);
    check_cuda(cudaMemcpyAsync(out.data() + at, L.conv, conv * sizeof(float), cudaMemcpyDeviceToHost, m.stream),
               "copy conv state");
    check_cuda(cudaMemcpyAsync(out.data() + at + conv, L.ssm, ssm * sizeof(float), cudaMemcpyDeviceToHost, m.stream),
               "copy DeltaNet state");
  }
  m.sync();
  return out;
}

int32_t GpuSession::decode_argmax(int32_t token) {
  Impl& m = *impl_;
  if (m.hidden || m.trace) {  // the step's hidden row or picks go to a record: a plain forward
    std::vector<float> logits(static_cast<size_t>(m.c.n_vocab));
    forward(&token, 1, logits.data(), false);
    const int32_t id = argmax_logit(logits.data(), m.c.n_vocab);
    if (id < 0) fail("sampler: no token has a finite logit (all banned or NaN)");
    return id;
  }
  m.validate(&token, 1);
  const auto lock = m.hold_hybrid();
  m.set_argmax_range(m.c.n_vocab);
  const int32_t id = m.greedy_step(token);
  if (id < 0) fail("sampler: no token has a finite logit (all banned or NaN)");  // argmax_logit's rule
  return id;
}

int32_t GpuSession::decode_and_pick(int32_t token, Sampler& sampler, const std::vector<int32_t>& history,
                                    int32_t n_allowed, std::vector<float>& scratch) {
  Impl& m = *impl_;
  const SamplerParams& p = sampler.params();
  // With a hidden record or a routing trace every step runs through forward(), which copies the step's
  // row and picks.
  const bool plain = !m.hidden && !m.trace && sampler.plain() && n_allowed > 0 && n_allowed <= m.c.n_vocab;
  const bool device_greedy = plain && p.temperature <= 0;
  const bool device_sample = plain && p.temperature > 0 && n_allowed <= sample_max_ids();
  if (device_greedy) {  // the step's own arg-max, over ids < n_allowed
    m.validate(&token, 1);
    const auto lock = m.hold_hybrid();
    m.set_argmax_range(n_allowed);
    const int32_t id = m.greedy_step(token);
    if (id < 0) fail("sampler: no token has a finite logit (all banned or NaN)");
    return id;
  }
  m.drop();
  if (!device_sample) return Sequence::decode_and_pick(token, sampler, history, n_allowed, scratch);
  m.validate(&token, 1);
  const auto lock = m.hold_hybrid();
  m.step(token);
  // The sampler's reference is the largest finite logit among ids < n_allowed.
  argmax_wide(m.one.logits, n_allowed, m.argmax_part, m.argmax_counter, m.d_argmax, m.stream, true);
  GpuSampling gp;
  gp.inv_temperature = 1.0 / static_cast<double>(p.temperature);
  gp.top_k = p.top_k;
  gp.top_p = static_cast<double>(p.top_p);
  gp.min_p = static_cast<double>(p.min_p);
  sample_token(m.one.logits, n_allowed, m.d_argmax, gp, sampler.draw_uniform(), m.sample_scratch, m.d_pick, m.stream);
  const int32_t id = m.read_token(m.d_pick);
  if (id < 0) fail("sampler: no token has a finite logit (all banned or NaN)");
  return id;
}

void GpuSession::reset() {
  Impl& m = *impl_;
  m.drop();
  m.has_pending = false;
  m.tree_pending = false;
  m.st.reset(m.stream);
  m.sync();
  if (m.hidden) m.hidden->restart(0);
}

std::vector<uint64_t> GpuSession::routing_counts() const {
  Impl& m = *impl_;
  m.drop();
  const size_t n = static_cast<size_t>(m.c.n_layer) * m.c.n_expert;
  std::vector<unsigned long long> raw(n);
  check_cuda(cudaMemcpyAsync(raw.data(), m.route_counts, n * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                             m.stream),
             "copy routing counts");
  check_cuda(cudaStreamSynchronize(m.stream), "copy routing counts");
  return std::vector<uint64_t>(raw.begin(), raw.end());
}

void GpuSession::reset_routing_counts() {
  Impl& m = *impl_;
  m.drop();
  const size_t n = static_cast<size_t>(m.c.n_layer) * m.c.n_expert;
  check_cuda(cudaMemsetAsync(m.route_counts, 0, n * sizeof(unsigned long long), m.stream), "reset routing counts");
  // While tokens are pending, keep() returns the counters to the saved copy: it restarts from zero too.
  check_cuda(cudaMemsetAsync(m.route_counts_saved, 0, n * sizeof(unsigned long long), m.stream), "reset routing counts");
  m.sync();
}

void GpuSession::set_routing_replay(RoutingSource* source) { impl_->set_replay(source); }

int GpuSession::n_past() const { return impl_->has_pending ? impl_->pending_base : impl_->n_past; }
int GpuSession::max_ctx() const { return impl_->max_ctx; }
const Model& GpuSession::model() const { return impl_->model; }
size_t GpuSession::weight_bytes() const { return impl_->dm.bytes(); }
const std::shared_ptr<GpuModel>& GpuSession::gpu_model() const { return impl_->gm; }
size_t GpuSession::state_bytes() const { return impl_->state_bytes + impl_->st.bytes(); }
bool GpuSession::hybrid() const { return impl_->hybrid != nullptr; }
// The hybrid MoE belongs to the model: its counters are read and reset under the model's lock.
HybridTelemetry GpuSession::hybrid_telemetry() const {
  if (!impl_->hybrid) fail("hybrid telemetry: this GPU session has every expert resident (no expert slot map)");
  impl_->drop();  // a lookahead step counts only once it is kept
  impl_->sync();
  std::lock_guard<std::mutex> lock(impl_->gm->exclusive());
  return impl_->hybrid->telemetry();
}
void GpuSession::reset_hybrid_telemetry() {
  if (!impl_->hybrid) return;
  std::lock_guard<std::mutex> lock(impl_->gm->exclusive());
  impl_->hybrid->reset_telemetry();
}

std::unique_ptr<GpuSession> make_gpu_session(const Model& model, int max_ctx, GpuSessionOptions options) {
  return std::make_unique<GpuSession>(model, max_ctx, options);
}

std::unique_ptr<GpuSession> make_gpu_session(std::shared_ptr<GpuModel> model, int max_ctx, GpuSessionOptions options) {
  return std::make_unique<GpuSession>(std::move(model), max_ctx, std::move(options));
}

std::vector<int32_t> generate_greedy(GpuSession& session, const std::vector<int32_t>& prompt, int n_new) {
  std::vector<int32_t> out;
  if (n_new <= 0) return out;
  if (prompt.empty()) fail("greedy generation needs a prompt of at least one token");
  if (session.n_past() + static_cast<int>(prompt.size()) + n_new - 1 > session.max_ctx())
    fail("prompt of ", prompt.size(), " tokens plus ", n_new, " new ones exceeds the context of ", session.max_ctx());
  // Prefill all but the last prompt token without copying logits; the last one yields the first pick.
  if (prompt.size() > 2) {
    // All but the last prompt token in one forward (the batched prefill when the session uses it).
    std::vector<float> discard(static_cast<size_t>(session.model().config().n_vocab));
    session.forward(prompt.data(), static_cast<int>(prompt.size()) - 1, discard.data(), false);
  } else {
    for (size_t i = 0; i + 1 < prompt.size(); ++i) session.decode_argmax(prompt[i]);
  }
  int32_t next = session.decode_argmax(prompt.back());
  for (int i = 0; i < n_new; ++i) {
    out.push_back(next);
    if (i + 1 < n_new) next = session.decode_argmax(next);
  }
  return out;
}

std::unique_ptr<MtpHead> GpuSession::make_mtp_head(int max_ctx, std::string& why_cpu) {
  const std::string why = impl_->mtp_unsupported();
  if (!why.empty()) {
    why_cpu = why;
    return nullptr;
  }
  return std::make_unique<GpuMtpHead>(*this, max_ctx);
}

std::unique_ptr<DFlashHead> GpuSession::make_dflash_head(const DFlashModel& drafter, int max_ctx,
                                                         std::string& why_cpu) {
  const std::string why = gpu_dflash_unsupported(drafter);
  if (!why.empty()) {
    why_cpu = why;
    return nullptr;
  }
  // One head per session, kept across attaches (a drafter attached again keeps its context); a new file,
  // or a longer context than it holds, replaces it.
  const int cap = std::min(max_ctx, impl_->max_ctx);
  const std::string key = cat(reinterpret_cast<uintptr_t>(&drafter), " ", drafter.path());
  if (!impl_->dflash || impl_->dflash_key != key || impl_->dflash->max_ctx() < cap) {
    impl_->dflash.reset();  // its memory back first
    try {
      impl_->dflash = std::make_shared<GpuDFlashHead>(drafter, impl_->dm, impl_->stream, cap,
                                                      impl_->opt.use_graph && !impl_->prof.on);
    } catch (const Error& e) {  // no room for it (--gpu-mem): the CPU drafts, said by the caller
      why_cpu = e.what();
      return nullptr;
    }
    impl_->dflash_key = key;
  }
  return std::make_unique<GpuDFlashHeadRef>(impl_->dflash);
}

GpuMtpHead::GpuMtpHead(GpuSession& session, int max_ctx) : m_(*session.impl_) {
  m_.mtp_setup();
  max_ctx_ = std::min(max_ctx, m_.max_ctx);
  if (m_.mtp->n_past > max_ctx_) m_.mtp->n_past = max_ctx_;
}

int GpuMtpHead::n_past() const { return m_.mtp->n_past; }

void GpuMtpHead::restart(int pos) {
  if (pos < 0 || pos > max_ctx_) fail("GPU MTP head: restart at ", pos, " of ", max_ctx_, " positions");
  // As the CPU head's: no clearing (rows >= n_past are written before read; those before pos keep what
  // they held, which costs acceptance only).
  m_.mtp->n_past = pos;
}

void GpuMtpHead::truncate(int pos) {
  if (pos < 0 || pos > n_past()) fail("MTP cache: truncate to ", pos, " of ", n_past(), " positions");
  m_.mtp->n_past = pos;
}

void GpuMtpHead::check_inputs(const int32_t* tokens, int n, int32_t n_allowed) const {
  const ModelConfig& c = m_.c;
  if (n_allowed <= 0 || n_allowed > c.n_vocab) fail("GPU MTP head: ", n_allowed, " allowed ids of ", c.n_vocab);
  for (int t = 0; t < n; ++t)
    if (tokens[t] < 0 || tokens[t] >= c.n_vocab) fail("GPU MTP head: token id ", tokens[t], " is out of range");
}

void GpuMtpHead::check_room(int rows) const {
  const int end = m_.mtp->n_past + rows;
  if (end > max_ctx_) fail("MTP forward: ", end, " positions exceed the context of ", max_ctx_);
}

// Stages n rows (tokens, hidden rows) and `count` chained rows after them: their positions and
// tokens on the device, and host room for the 1 + count picks read back.
GpuMtpHead::Staged GpuMtpHead::stage(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed) {
  auto& p = *m_.mtp;
  const ModelConfig& c = m_.c;
  check_inputs(tokens, n, n_allowed);
  const size_t d = static_cast<size_t>(c.n_embd), rows = static_cast<size_t>(n), more = static_cast<size_t>(count);
  const size_t n_ints = more + 2 * rows, int_bytes = (n_ints + 1 + more) * sizeof(int);
  const size_t bytes = int_bytes + rows * d * sizeof(float);
  // Every call ends reading back, so nothing reads the staging now; the sync covers a call a failure cut.
  m_.sync();
  if (bytes > p.h_stage_bytes) {
    if (p.h_stage) cudaFreeHost(p.h_stage);
    p.h_stage = nullptr;
    p.h_stage_bytes = 0;
    check_cuda(cudaMallocHost(&p.h_stage, bytes), "cudaMallocHost(MTP staging)");
    p.h_stage_bytes = bytes;
  }
  int* h_ints = reinterpret_cast<int*>(p.h_stage);
  for (size_t i = 0; i < more; ++i) h_ints[i] = p.n_past + n + static_cast<int>(i);
  for (size_t t = 0; t < rows; ++t) {
    h_ints[more + t] = tokens[t];
    h_ints[more + rows + t] = p.n_past + static_cast<int>(t);
  }
  Staged st;
  int* d_ints = p.ints.reserve(n_ints, 1, "MTP rows");
  check_cuda(cudaMemcpyAsync(d_ints, h_ints, n_ints * sizeof(int), cudaMemcpyHostToDevice, m_.stream), "copy MTP rows");
  st.pos = d_ints, st.tokens = d_ints + more, st.row_pos = d_ints + more + rows;
  if (n > 0) {
    float* h_rows = reinterpret_cast<float*>(p.h_stage + int_bytes);
    std::copy_n(hidden, rows * d, h_rows);
    float* d_rows = p.rows_h.reserve(rows, d, "MTP hidden rows");
    check_cuda(cudaMemcpyAsync(d_rows, h_rows, rows * d * sizeof(float), cudaMemcpyHostToDevice, m_.stream),
               "copy MTP hidden rows");
    st.hidden = d_rows;
  }
  st.h_picks = h_ints + n_ints;
  st.d_picks = p.picks.reserve(1 + more, 1, "MTP picks");
  return st;
}

// The n staged rows, in launches of up to mtp_max_rows().
void GpuMtpHead::enqueue_rows(const Staged& st, int n, int32_t n_allowed) {
  auto& p = *m_.mtp;
  const size_t d = static_cast<size_t>(m_.c.n_embd);
  const int most = m_.mtp_max_rows();
  constexpr int K = GpuSession::Impl::kMaxStepTokens;
  for (int t = 0; t < n; t += most) {
    const int T = std::min(most, n - t);
    const size_t T_ints = static_cast<size_t>(T) * sizeof(int);
    check_cuda(cudaMemcpyAsync(p.io, st.tokens + t, T_ints, cudaMemcpyDeviceToDevice, m_.stream), "MTP rows");
    check_cuda(cudaMemcpyAsync(p.io + K, st.row_pos + t, T_ints, cudaMemcpyDeviceToDevice, m_.stream), "MTP rows");
    check_cuda(cudaMemcpyAsync(p.h, st.hidden + static_cast<size_t>(t) * d, static_cast<size_t>(T) * d * sizeof(float),
                               cudaMemcpyDeviceToDevice, m_.stream),
               "MTP rows");
    m_.launch_mtp_rows(T, n_allowed);
  }
}

// io[0] and h's first row hold the last row's pick and output already: each chained row takes only
// its position, and leaves its pick at d_picks[i].
void GpuMtpHead::enqueue_chain(const int* d_pos, int count, int32_t n_allowed, int* d_picks) {
  auto& p = *m_.mtp;
  for (int i = 0; i < count; ++i) {
    check_cuda(cudaMemcpyAsync(p.io + GpuSession::Impl::kMaxStepTokens, d_pos + i, sizeof(int),
                               cudaMemcpyDeviceToDevice, m_.stream),
               "MTP row");
    m_.launch_mtp_rows(1, n_allowed);
    check_cuda(cudaMemcpyAsync(d_picks + i, p.io, sizeof(int), cudaMemcpyDeviceToDevice, m_.stream), "MTP pick");
  }
}

void GpuMtpHead::read_picks(const Staged& st, int count, std::vector<int32_t>& picks) {
  check_cuda(cudaMemcpyAsync(st.h_picks, st.d_picks, static_cast<size_t>(count) * sizeof(int), cudaMemcpyDeviceToHost,
                             m_.stream),
             "copy MTP picks");
  m_.sync();
  for (int i = 0; i < count; ++i) {
    if (st.h_picks[i] < 0) fail("GPU MTP head: no token has a finite logit");
    picks.push_back(st.h_picks[i]);
  }
}

void GpuMtpHead::draft(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
                       std::vector<int32_t>& picks) {
  if (n <= 0) fail("MTP forward needs at least one row");
  check_room(n + count);
  if (!m_.mtp_fused_fits(n, count)) return draft_staged(tokens, hidden, n, count, n_allowed, picks);
  check_inputs(tokens, n, n_allowed);
  m_.draft_fused(tokens, hidden, n, count, n_allowed, picks);
}

// Rows in launches of up to mtp_max_rows() and chained rows one graph each, the last pick left in io[0]
// and the last output in h for chain().
void GpuMtpHead::draft_staged(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
                              std::vector<int32_t>& picks) {
  if (n <= 0) fail("MTP forward needs at least one row");
  check_room(n + count);
  const Staged st = stage(tokens, hidden, n, count, n_allowed);
  enqueue_rows(st, n, n_allowed);
  check_cuda(cudaMemcpyAsync(st.d_picks, m_.mtp->io, sizeof(int), cudaMemcpyDeviceToDevice, m_.stream), "MTP pick");
  enqueue_chain(st.pos, count, n_allowed, st.d_picks + 1);
  read_picks(st, 1 + count, picks);
}

int32_t GpuMtpHead::rows(const int32_t* tokens, const float* hidden, int n, int32_t n_allowed) {
  std::vector<int32_t> pick;
  draft_staged(tokens, hidden, n, 0, n_allowed, pick);
  return pick[0];
}

void GpuMtpHead::chain(int count, int32_t n_allowed, std::vector<int32_t>& picks) {
  if (count <= 0) return;
  if (picks.empty()) fail("GPU MTP head: chained rows follow a row");
  check_room(count);
  const Staged st = stage(nullptr, nullptr, 0, count, n_allowed);
  enqueue_chain(st.pos, count, n_allowed, st.d_picks);
  read_picks(st, count, picks);
}

std::vector<float> GpuMtpHead::logits() const {
  std::vector<float> out(static_cast<size_t>(m_.c.n_vocab));
  check_cuda(cudaMemcpyAsync(out.data(), m_.mtp->r.logits, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                             m_.stream),
             "copy MTP logits");
  m_.sync();
  return out;
}

}  // namespace strata::cuda
