// Batched matrix-vector products of the decode step: one launch computes several "jobs" (a matrix, or
// a routed expert picked on the GPU, times a vector), so the projections that read the same input
// (DeltaNet qkv/z/beta/alpha, attention q/k/v, router + shared expert) and all the routed experts of a
// layer cost one kernel each. Weights are read with coalesced 16-byte loads where the block layout
// allows it; the input vector is staged in shared memory once per block and the grid loops over row
// tiles, so even the 248k-row lm_head reads x from L2 only a few hundred times.
// Arithmetic (GemvMath): for K-quant weights (Q4_K/Q5_K/Q6_K) by default the CPU engine's int8 path:
// the input is quantised per 32 values exactly as quantize_activations_i8 does (cpu_kernels.h) and
// the codes are dotted in integers (dp4a), so GPU and CPU see the same rounded activations and agree
// to float rounding of the per-block sums. Every other type, and K-quants under GemvMath::Float, are
// dotted in float32 with the decoded weights (the CPU scalar path's function).
// Plain C++ header: tests and the session include it from .cpp files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "strata/cuda/kernels.h"

namespace strata::cuda {

enum class GemvMode : int {
  Store = 0,       // y[r] = W[r] . x
  Accumulate = 1,  // y[r] += W[r] . x (a residual add fused into the projection)
  SwigluPair = 2,  // y[r] = silu(W[r] . x) * (W2[r] . x) (expert gate and up rows in one pass)
};

// One matrix (or routed expert) times one vector.
struct GemvJob {
  const DevMatrix* w = nullptr;   // the matrix, or the expert stack when ids is set
  const DevMatrix* w2 = nullptr;  // SwigluPair: the up matrix/stack (same rows, cols, stack shape)
  const float* x = nullptr;       // w->n_cols floats (device)
  float* y = nullptr;             // w->n_rows floats (device)
  GemvMode mode = GemvMode::Store;
  // Routed: expert e = ids[slot] (device); its row block is slot_of_expert[e] (device; nullptr = e
  // itself). A slot of -1 means the expert is not resident in this stack: y gets zeros (it contributes
  // nothing to the layer's output).
  const int* ids = nullptr;
  int slot = 0;
  const int* slot_of_expert = nullptr;
  // norm_w set: the input is rmsnorm(x) * norm_w (mean of squares in double, rmsnorm_rows' arithmetic),
  // computed by every block as it stages x, so no separate norm pass (or launch epilogue) is needed.
  const float* norm_w = nullptr;
  float norm_eps = 0.0f;
  // conv_w set (Store mode only): row r is a channel of a causal depthwise conv1d with SiLU (the
  // DeltaNet input conv, conv_qk_norm's conv arithmetic): y[r] = silu(sum_j conv_w[r*K+j] * window_j[r])
  // over the window conv_state rows (K-1 of conv_channels floats, oldest first) then W[r].x; the state
  // drops its oldest row and appends W[r].x. Saves the conv launch. conv_state_out set: the advanced
  // state goes there and conv_state is only read (the decode lookahead's ping-pong state).
  const float* conv_w = nullptr;
  float* conv_state = nullptr;
  float* conv_state_out = nullptr;
  int conv_k = 0;
  int conv_channels = 0;
  // A token-grid launch (gemv_batch with n_tokens > 1) runs the job once per token t: the input at
  // x + t * x_token_stride, the output at y + t * y_token_stride, a routed job's ids at
  // ids + t * ids_token_stride. Ignored by single-token launches.
  int64_t x_token_stride = 0;
  int64_t y_token_stride = 0;
  int64_t ids_token_stride = 0;
};

constexpr int kMaxGemvJobs = 12;
// The most tokens one token-grid launch (gemv_batch, gemv_down_sum) takes.
constexpr int kMaxGemvTokens = 32;

// How K-quant weights meet the input vector (see the top of this file). Int8 is the default and what
// the CPU engine does at its SIMD levels; Float is the full-precision form (tests compare kernels with
// float64 references through it; `--numerics exact` selects it). Process-wide; set it before launches
// are enqueued or captured.
enum class GemvMath { Int8, Float };
void set_gemv_math(GemvMath m);
GemvMath gemv_math();

// An RMSNorm run after every job of the launch has finished (by the last block to finish, so it costs
// no launch): out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for i < n, mean accumulated in double
// (rmsnorm_rows' arithmetic). x is typically a job's Accumulate output (the residual stream).
// counter: one device unsigned int, zero before the first use (each launch leaves it zero).
struct GemvNorm {
  const float* x = nullptr;
  const float* w = nullptr;
  float* out = nullptr;
  float eps = 0.0f;
  int n = 0;
  unsigned int* counter = nullptr;
};

// The router's softmax + top-k (route_topk of kernels.h, same arithmetic and tie rule) run by the last
// block to finish, on logits a job of the launch wrote. counts may be null; counter as in GemvNorm.
struct GemvRoute {
  const float* logits = nullptr;
  int n_expert = 0;  // <= 1024
  int k = 0;         // <= 64
  bool norm_topk = false;
  int* ids = nullptr;
  float* weights = nullptr;
  unsigned long long* counts = nullptr;
  unsigned int* counter = nullptr;
  RouteRule rule;  // softmax by default
  // route_in of a token-grid launch: token t routes from logits + t * logits_token_stride and writes
  // ids / weights at + t * k (counts are shared: every token's picks are counted).
  int64_t logits_token_stride = 0;
};

// The MoE combine (moe_combine_add_norm of kernels.h, the same arithmetic) run by the last block to
// finish, on the expert outputs ye / ys the launch's jobs wrote: x += combine, xn = rmsnorm(x) * norm_w.
struct GemvCombine {
  float* x = nullptr;
  const float* ye = nullptr;  // [k x d]
  const int* ids = nullptr;
  const float* weights = nullptr;
  int k = 0;  // <= 64
  int d = 0;
  const float* ys = nullptr;  // shared expert output, or null
  const float* shared_gate = nullptr;
  const float* norm_w = nullptr;  // null: no norm
  float eps = 0.0f;
  float* xn = nullptr;
  unsigned int* counter = nullptr;
};

// The most tokens one token-shared block takes: a verification of nine tokens (eight drafts) in one pass.
constexpr int kGemvSharedTokens = 10;

// Runs n_jobs (<= kMaxGemvJobs) products in one launch. Inputs may differ per job; every x must hold
// at most max_gemv_cols() floats. Fails (strata::Error) on an unsupported weight type. At most one of
// norm / route / combine (the epilogue) may be given.
// route_in (counter unused): the router's softmax + top-k computed by every block of this launch from
// route_in->logits (written by an earlier launch) before its routed jobs run; those jobs must have
// ids == route_in->ids and take the expert ids from the block's own result. The first block writes
// ids, weights and counts (route_topk's outputs) for later launches. Saves the router launch's
// single-block epilogue and one kernel boundary on the way to the experts.
// n_tokens > 1 (<= kMaxGemvTokens): a token grid, the launch repeated for every token t with the jobs'
// token strides (GemvJob, GemvRoute::logits_token_stride); each token's blocks tile and compute exactly
// as the single-token launch of the same jobs does, so token t's outputs are bitwise those of a
// single-token launch on token t's rows. No epilogue or conv job then; replayed picks of route_in are token
// t's at rule.replay + t * rule.replay_stride (a stride of 0 is refused). A token grid
// whose jobs are all unrouted K-quant rows under GemvMath::Int8, reading enough bytes
// (set_gemv_tokens_min_bytes), runs token-shared: each block stages up to kGemvSharedTokens tokens' inputs
// and reads each weight once for all of them (same results, bit for bit).
// spare_blocks: block slots of one wave the launch leaves free (its grid at most the resident capacity
// less that), so a small launch on another stream finds room beside it; the tiles and results are the same.
void gemv_batch(const GemvJob* jobs, int n_jobs, cudaStream_t s, const GemvNorm* norm = nullptr,
                const GemvRoute* route = nullptr, const GemvCombine* combine = nullptr,
                const GemvRoute* route_in = nullptr, int n_tokens = 1, int spare_blocks = 0);
int64_t max_gemv_cols();
// The device's SM count (cached).
int sm_count();
// Resident blocks per SM of `kernel` at this block size and dynamic shared memory, asked of the runtime
// once per (kernel, threads, smem) and remembered: launches that size their grid by it ask every time.
int resident_blocks(const void* kernel, int threads, size_t smem);
// Blocks per token of a token-grid launch whose single-token launch takes `blocks` blocks: at most
// `resident` blocks in all, about one wave, so that each block stages its token's input once rather than
// once per wave. Only for launches whose blocks stride over the rows and stage every input alike whatever
// tiles they ran before, so the block count changes no result.
int token_grid_blocks(int blocks, int resident, int n_tokens);
// A token grid goes token-shared only when its jobs read at least this many weight bytes: a token-shared
// block stages its tokens one after another before its first row, which costs more than the grid's
// re-reads of a small launch's rows (L2 catches part of them); lm_head-sized launches gain
// (docs/PERF.md). Process-wide; tests lower it to reach the token-shared kernel with small matrices.
constexpr size_t kGemvTokensMinBytes = size_t{64} << 20;
void set_gemv_tokens_min_bytes(size_t bytes);
// The tokens per block of gemv_batch's token-shared launch for these jobs (route_in: whether the launch
// routes), or 0 when it takes the token grid.
int gemv_tokens_per_block(const GemvJob* jobs, int n_jobs, int n_tokens, bool route_in = false);

// The MoE down projection and the combine in one launch, with no per-expert outputs and no last-block
// step: output row r (one warp) is
//   x[r] += sum_j weights[j] * (down[ids[j]] row r . g[j*ff ..]) + sigmoid(*shared_gate) * (shared row r . gs)
// over the k picked experts (and the shared expert when shared is set), every expert's input staged in
// each block (int8 form for K-quants under GemvMath::Int8, as gemv_batch). The same sum as the down jobs
// plus GemvCombine, up to the order of the float additions. Inside the decode graph the combine's
// last-block step (fences, counter, one block reading k + 1 outputs) sat on every layer's critical path.
struct GemvDownSum {
  const DevMatrix* down = nullptr;  // routed stack: n_rows = d, n_cols = ff
  const int* ids = nullptr;         // k expert ids (device)
  // Expert e's block in the stack is slot_of_expert[e] (device; nullptr: e itself); a pick of slot -1
  // (not resident: the hybrid MoE adds its rows from the CPU) takes no part.
  const int* slot_of_expert = nullptr;
  const float* weights = nullptr;   // k routing weights (device)
  int k = 0;
  const float* g = nullptr;          // k x ff inputs (device)
  const DevMatrix* shared = nullptr;  // the shared expert's down (n_rows = d), or null
  const float* gs = nullptr;          // its input
  const float* shared_gate = nullptr;  // its gate logit (device, one float); null: ungated (weight 1)
  float* x = nullptr;                  // d floats, accumulated into
  // A token grid (n_tokens > 1, <= kMaxGemvTokens; a slot map applies to each token's picks): token t reads ids /
  // weights at + t * k, g at + t * g_token_stride, gs / shared_gate at + t * gs_token_stride / + t, and accumulates
  // into x + t * x_token_stride; each token's rows are the single-token launch's arithmetic.
  int n_tokens = 1;
  int64_t g_token_stride = 0;
  int64_t gs_token_stride = 0;
  int64_t x_token_stride = 0;
};
// Whether gemv_down_sum takes this shape (ff a multiple of 64, k + 1 <= 64, every input within max_gemv_cols
// in total, supported types; with K-quant rows the total a multiple of 256, and with a slot map ff and the
// shared width multiples of 128); the session falls back to gemv_batch + GemvCombine otherwise.
bool gemv_down_sum_fits(const GemvDownSum& a);
void gemv_down_sum(const GemvDownSum& a, cudaStream_t s);

// The DeltaNet input conv of n_tokens tokens in order, for a multi-token step whose input projection
// ran without the fused conv: per channel, GemvJob::conv_w's arithmetic (the same device function),
// token t's projection x + t * channels becoming out + t * channels. The window after token t is
// written to records + t * (K-1) * channels (a sequence state's conv step records), and state (the
// window before token 0) ends as the window after the last token. parents (device, may be null: a
// chain): a token tree, token t's window continuing its parent's record (-1: state).
void conv_silu_tokens(const float* x, int n_tokens, const float* conv_w, int K, int channels, float* state,
                      float* records, float* out, cudaStream_t s, const int* parents = nullptr);

// Local memory (stack frame and register spills) per thread of the matvec kernel as built for this GPU
// (the larger of its single-token and token-grid forms).
// The GPU tests require 0: a stack frame from a called routing function in the tile loop once slowed the
// decode (docs/PERF.md), and nothing else would show it.
size_t gemv_local_bytes();

}  // namespace strata::cuda
