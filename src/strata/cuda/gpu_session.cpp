// The decode step on the GPU, written as the CPU forward passes are (forward_qwen3moe.cpp,
// forward_qwen35moe.cpp and the blocks they call), one kernel launch per operation, all on one stream.
#include "strata/cuda/gpu_session.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "strata/base/error.h"
#include "strata/cuda/cuda_check.h"
#include "strata/cuda/device_model.h"
#include "strata/cuda/device_state.h"
#include "strata/cuda/hybrid_moe.h"
#include "strata/cuda/kernels.h"

namespace strata::cuda {

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
  const Model& model;
  const ModelConfig& c;
  DeviceModel dm;
  GpuSessionOptions opt;
  int max_ctx;
  DeviceSequenceState st;
  int& n_past;  // st.n_past
  cudaStream_t stream = nullptr;
  cudaGraphExec_t graph = nullptr;
  std::unique_ptr<HybridMoe> hybrid;  // set when opt.expert_slots is not empty

  std::vector<void*> allocs;
  size_t state_bytes = 0;
  // io[0] = token, io[1] = position (device copy of the pinned host pair).
  int* d_io = nullptr;
  int* h_io = nullptr;  // pinned
  int* d_argmax = nullptr;
  float *x, *xn, *y, *q, *kk, *vv, *o, *scores;
  float *qkv, *mixed, *z, *b, *alpha, *o2;
  float *router, *wts, *g, *u, *ye, *sg, *gs, *us, *ys;
  int* ids;
  float* logits;

  Impl(const Model& m, int ctx, GpuSessionOptions o)
      : model(m), c(m.config()), dm(m), opt(o), max_ctx(ctx), st(m.config(), ctx), n_past(st.n_past) {
    try {
      allocate();
    } catch (...) {
      release();
      throw;
    }
  }
  ~Impl() { release(); }

  template <class T>
  T* dalloc(size_t n) {
    void* p = nullptr;
    const size_t bytes = (n == 0 ? 1 : n) * sizeof(T);
    const cudaError_t st = cudaMalloc(&p, bytes);
    if (st != cudaSuccess)
      fail("CUDA backend: cannot allocate ", bytes, " bytes for the sequence state (context ", max_ctx, "): ",
           cudaGetErrorString(st));
    allocs.push_back(p);
    state_bytes += bytes;
    check_cuda(cudaMemset(p, 0, bytes), "cudaMemset");
    return static_cast<T*>(p);
  }

  int q_stride_head() const { return c.attn_output_gate ? 2 * c.head_dim : c.head_dim; }
  int kv_width() const { return c.n_head_kv * c.head_dim; }

  void allocate() {
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMallocHost(&h_io, 2 * sizeof(int)), "cudaMallocHost");
    d_io = dalloc<int>(2);
    d_argmax = dalloc<int>(1);
    const size_t d = static_cast<size_t>(c.n_embd);
    x = dalloc<float>(d);
    xn = dalloc<float>(d);
    y = dalloc<float>(d);
    const size_t k = static_cast<size_t>(c.n_expert_used);
    router = dalloc<float>(c.n_expert);
    ids = dalloc<int>(k);
    wts = dalloc<float>(k);
    g = dalloc<float>(k * c.n_ff_exp);
    u = dalloc<float>(k * c.n_ff_exp);
    ye = dalloc<float>(k * d);
    if (c.n_ff_shexp > 0) {
      sg = dalloc<float>(1);
      gs = dalloc<float>(c.n_ff_shexp);
      us = dalloc<float>(c.n_ff_shexp);
      ys = dalloc<float>(d);
    }
    logits = dalloc<float>(static_cast<size_t>(c.n_vocab));
    check_cuda(cudaDeviceSynchronize(), "allocate");
  }

  void release() {
    if (graph) cudaGraphExecDestroy(graph);
    graph = nullptr;
    for (void* p : allocs) cudaFree(p);
    allocs.clear();
    if (h_io) cudaFreeHost(h_io);
    h_io = nullptr;
    if (stream) cudaStreamDestroy(stream);
    stream = nullptr;
  }

  void attention(const DevLayer& D, DeviceLayerState& L) {
    const DevAttention& w = D.attn;
    const int hd = c.head_dim;
    const int* pos = d_io + 1;
    matvec(w.q, xn, q, stream);
    matvec(w.k, xn, kk, stream);
    matvec(w.v, xn, vv, stream);
    norm_rope_heads(q, q_stride_head(), q, q_stride_head(), 0, c.n_head, hd, w.q_norm, c.rms_eps, c.rope_dims,
                    c.rope_freq_base, pos, stream);
    norm_rope_heads(kk, hd, L.k, hd, kv_width(), c.n_head_kv, hd, w.k_norm, c.rms_eps, c.rope_dims, c.rope_freq_base,
                    pos, stream);
    store_row_at_pos(vv, L.v, kv_width(), pos, stream);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    attention_decode(q, q_stride_head(), L.k, L.v, kv_width(), c.n_head, c.n_head_kv, hd, scale, c.attn_output_gate,
                     pos, max_ctx, scores, o, stream);
    matvec(w.o, o, y, stream);
  }

  void deltanet(const DevLayer& D, DeviceLayerState& L) {
    const DevDeltaNet& w = D.deltanet;
    matvec(w.qkv, xn, qkv, stream);
    matvec(w.gate, xn, z, stream);
    matvec(w.beta, xn, b, stream);
    matvec(w.alpha, xn, alpha, stream);
    conv1d_silu_step(qkv, w.conv, c.ssm_conv_kernel, c.ssm_conv_channels(), L.conv, mixed, stream);
    deltanet_qk_norm(mixed, c.ssm_k_heads, c.ssm_head_k, 1.0f / std::sqrt(static_cast<float>(c.ssm_head_k)), stream);
    deltanet_step_gated(L.ssm, mixed, b, alpha, w.a, w.dt_bias, w.norm, z, c.rms_eps, c.ssm_k_heads, c.ssm_v_heads,
                        c.ssm_head_k, c.ssm_head_v, o2, stream);
    matvec(w.out, o2, y, stream);
  }

  void moe(int il, const DevMoe& w) {
    if (hybrid) return hybrid->enqueue_decode(il, xn, x, stream);  // issue 8: hot/cold experts
    const int k = c.n_expert_used;
    matvec(w.router, xn, router, stream);
    route_topk(router, c.n_expert, k, c.norm_topk, ids, wts, stream);
    matvec_routed(w.gate, ids, k, xn, 0, g, stream);
    matvec_routed(w.up, ids, k, xn, 0, u, stream);
    swiglu(g, u, static_cast<int64_t>(k) * c.n_ff_exp, g, stream);
    matvec_routed(w.down, ids, k, g, c.n_ff_exp, ye, stream);
    if (w.has_shared) {
      matvec(w.shared_gate_inp, xn, sg, stream);
      matvec(w.shared_gate, xn, gs, stream);
      matvec(w.shared_up, xn, us, stream);
      swiglu(gs, us, c.n_ff_shexp, gs, stream);
      matvec(w.shared_down, gs, ys, stream);
    }
    moe_combine_add(x, ye, ids, wts, k, c.n_embd, w.has_shared ? ys : nullptr, sg, stream);
  }

  // Every kernel of one decode step, reading the token and position from d_io.
  void enqueue_step() {
    embed_row(dm.token_embd, d_io, x, stream);
    for (int il = 0; il < c.n_layer; ++il) {
      const DevLayer& D = dm.layers[il];
      rmsnorm_rows(x, D.attn_norm, c.rms_eps, 1, c.n_embd, xn, stream);
      if (D.kind == LayerKind::FullAttention) {
        attention(D, st.layers[il]);
      } else {
        deltanet(D, st.layers[il]);
      }
      add_inplace(x, y, c.n_embd, stream);
      rmsnorm_rows(x, D.ffn_norm, c.rms_eps, 1, c.n_embd, xn, stream);
      moe(il, D.moe);
    }
    rmsnorm_rows(x, dm.output_norm, c.rms_eps, 1, c.n_embd, xn, stream);
    matvec(dm.output, xn, logits, stream);
    argmax(logits, c.n_vocab, d_argmax, stream);
  }

  // Runs one token at position n_past; leaves logits and arg-max on the device (stream not synchronised).
  void step(int32_t token) {
    // The previous step's copy of h_io has completed: every step ends in a stream synchronisation.
    h_io[0] = token;
    h_io[1] = n_past;
    check_cuda(cudaMemcpyAsync(d_io, h_io, 2 * sizeof(int), cudaMemcpyHostToDevice, stream), "copy token");
    if (!opt.use_graph) {
      enqueue_step();
    } else {
      if (!graph) capture();
      check_cuda(cudaGraphLaunch(graph, stream), "cudaGraphLaunch");
    }
    ++n_past;
  }

  void capture() {
    cudaGraph_t g_raw = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      enqueue_step();
    } catch (...) {
      cudaStreamEndCapture(stream, &g_raw);
      if (g_raw) cudaGraphDestroy(g_raw);
      throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &g_raw), "cudaStreamEndCapture");
    const cudaError_t st = cudaGraphInstantiate(&graph, g_raw, 0);
    cudaGraphDestroy(g_raw);
    check_cuda(st, "cudaGraphInstantiate");
  }

  void sync() { check_cuda(cudaStreamSynchronize(stream), "decode step"); }

  void validate(const int32_t* tokens, int n) const {
    if (n <= 0) fail("forward needs at least one token");
    if (n_past + n > max_ctx) fail("prompt of ", n_past + n, " tokens exceeds the context of ", max_ctx);
    for (int t = 0; t < n; ++t)
      if (tokens[t] < 0 || tokens[t] >= c.n_vocab)
        fail("token id ", tokens[t], " at index ", t, " is out of range (vocabulary of ", c.n_vocab, ")");
  }
};

GpuSession::GpuSession(const Model& model, int max_ctx, GpuSessionOptions options)
    : impl_(std::make_unique<Impl>(model, max_ctx, options)) {}

GpuSession::~GpuSession() = default;

void GpuSession::forward(const int32_t* tokens, int n, float* logits_out, bool all_positions) {
  Impl& m = *impl_;
  m.validate(tokens, n);
  const size_t vocab = static_cast<size_t>(m.c.n_vocab);
  for (int t = 0; t < n; ++t) {
    m.step(tokens[t]);
    if (all_positions || t == n - 1) {
      float* dst = logits_out + (all_positions ? static_cast<size_t>(t) * vocab : 0);
      check_cuda(cudaMemcpyAsync(dst, m.logits, vocab * sizeof(float), cudaMemcpyDeviceToHost, m.stream), "copy logits");
    }
    m.sync();
  }
}

int32_t GpuSession::decode_argmax(int32_t token) {
  Impl& m = *impl_;
  m.validate(&token, 1);
  m.step(token);
  check_cuda(cudaMemcpyAsync(m.h_io, m.d_argmax, sizeof(int), cudaMemcpyDeviceToHost, m.stream), "copy argmax");
  m.sync();
  return m.h_io[0];
}

void GpuSession::reset() {
  Impl& m = *impl_;
  m.st.reset(m.stream);
  m.sync();
}

int GpuSession::n_past() const { return impl_->n_past; }
int GpuSession::max_ctx() const { return impl_->max_ctx; }
const Model& GpuSession::model() const { return impl_->model; }
size_t GpuSession::weight_bytes() const { return impl_->dm.bytes(); }
size_t GpuSession::state_bytes() const { return impl_->state_bytes + impl_->st.bytes(); }

std::unique_ptr<GpuSession> make_gpu_session(const Model& model, int max_ctx, GpuSessionOptions options) {
  return std::make_unique<GpuSession>(model, max_ctx, options);
}

std::vector<int32_t> generate_greedy(GpuSession& session, const std::vector<int32_t>& prompt, int n_new) {
  std::vector<int32_t> out;
  if (n_new <= 0) return out;
  if (prompt.empty()) fail("greedy generation needs a prompt of at least one token");
  if (session.n_past() + static_cast<int>(prompt.size()) + n_new - 1 > session.max_ctx())
    fail("prompt of ", prompt.size(), " tokens plus ", n_new, " new ones exceeds the context of ", session.max_ctx());
  // Prefill all but the last prompt token without copying logits; the last one yields the first pick.
  for (size_t i = 0; i + 1 < prompt.size(); ++i) session.decode_argmax(prompt[i]);
  int32_t next = session.decode_argmax(prompt.back());
  for (int i = 0; i < n_new; ++i) {
    out.push_back(next);
    if (i + 1 < n_new) next = session.decode_argmax(next);
  }
  return out;
}

}  // namespace strata::cuda
