// The CUDA kernels of the decode step, as host functions that launch on a stream and take device
// pointers. Each one mirrors a CPU operation of src/strata/cpu/ops.h or a step of the engine's blocks
// (src/strata/engine/*_block.cpp) with the same arithmetic order where it matters (double-accumulated
// norms, the same float expressions), so GPU and CPU agree to float rounding of the sums.
// Every launcher reads positions / token ids / expert ids from device memory, so a decode step built
// from them can be captured once in a CUDA graph and replayed with new inputs.
// Plain C++ header (no CUDA language features): tests and the session include it from .cpp files.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/cuda/decode_lookahead.h"
#include "strata/cpu/ops.h"  // RopeYarn
#include "strata/model/kv_type.h"
#include "strata/quant/types.h"

namespace strata::cuda {

// A weight matrix (or a stack of experts) in device memory: n_rows rows of n_cols elements of `type`,
// row r of expert e at data + e * expert_stride + r * row_bytes (rows packed, no padding).
struct DevMatrix {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  size_t row_bytes = 0;
  size_t expert_stride = 0;  // 0 for a plain matrix
  int n_expert = 1;
};

// Weight types the CUDA matvec and row decoding handle: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K.
bool supported_type(GgmlType type);
// Comma-separated list of those, for error messages.
const char* supported_type_names();

// y[r] = dot(W[r], x) for every row (float32 accumulation).
void matvec(const DevMatrix& w, const float* x, float* y, cudaStream_t s);

// x[0..n_cols) = row *token (device memory) of the table, decoded to float.
void embed_row(const DevMatrix& table, const int* token, float* x, cudaStream_t s);

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] for n_rows rows of width d (mean accumulated in double).
void rmsnorm_rows(const float* x, const float* w, float eps, int n_rows, int d, float* out, cudaStream_t s);
// Two sets of rows in one launch, side by side: out[r * out_stride + i] = rmsnorm(x0 row r) * w0 and
// out[r * out_stride + d + i] = rmsnorm(x1 row r) * w1 (rmsnorm_rows' arithmetic).
void rmsnorm_rows_pair(const float* x0, const float* w0, const float* x1, const float* w1, float eps, int n_rows, int d,
                       float* out, int64_t out_stride, cudaStream_t s);

// x[i] += y[i].
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t s);

// How a router's logits become choice keys and weights (ModelConfig::router). Softmax (the default, and
// a null rule): probabilities, the k largest. Sigmoid: scores sigmoid(softcap * tanh(l / softcap)) (or
// sigmoid(l) when softcap is 0), the k largest of score + bias[e] (bias null: the scores), the weights
// the chosen scores; either way the stored weights are multiplied by scale (expert_weights_scale).
// replay set (bench --routing): the k picks are replay[0..k) (device) instead of the top-k, weighted
// by what the router gives those ids; the rows of a multi-token routing take row t's picks at
// replay + t * replay_stride.
struct RouteRule {
  bool sigmoid = false;
  float softcap = 0.0f;
  const float* bias = nullptr;  // [n_expert] (device): selection only
  float scale = 1.0f;
  const int* replay = nullptr;
  int replay_stride = 0;
};

// Router: softmax over n_expert logits, the k largest (ties: lower id), weights renormalised to sum 1
// when norm_topk. ids[k], weights[k] in descending probability order. n_expert <= 1024.
// counts (device, n_expert entries, may be null): counts[id] += 1 for every chosen expert.
void route_topk(const float* logits, int n_expert, int k, bool norm_topk, int* ids, float* weights, cudaStream_t s,
                unsigned long long* counts = nullptr);

// ---- fused operations of the fast decode step (gpu_session.cpp) --------------------------------------

// A token grid of attn_prep / attention_decode_split (the multi-token decode step): the launch runs n
// tokens, token t at position pos[t] with its rows at q + t * q, kk / vv + t * kv, out + t * out and the
// softplus gate values + t * gate, and (attention) its scratch + t * scratch floats and counters + t *
// counters; each token's blocks compute what a launch of that token alone computes. Default: one token.
struct AttnTokens {
  int n = 1;
  int64_t q = 0, kv = 0, out = 0, gate = 0, scratch = 0;
  int counters = 0;
  // A token tree (the multi-token step's tree verification; all null: the rows are the positions). Token
  // t's key and value go to row *base + t (its position pos[t] is its depth's, for the rotary), and it
  // attends to positions lo .. pos[t] where a position P >= *base is read from row path[t * path_stride +
  // P - *base] (its root path's rows, depth order): the rows of a single step at pos[t], in its order.
  const int* path = nullptr;
  int path_stride = 0;
  const int* base = nullptr;
  // attention_decode_split: the lowest position attended (device; null: 0, or the window's), read before
  // the wait as *pos is, so written before the previous kernel started. A drafter's context that begins
  // past position 0 changes it from call to call without a new launch shape (a graph replays it).
  const int* first = nullptr;
};

// attention inputs: each of the n_head query heads (q, q_head_stride) in place and each of the n_kv key
// heads (kk, packed) into k_cache row *pos get RMSNorm (q_norm / k_norm) then NEOX rotary on the first
// rope_dims dims at position *pos; vv (kv_width floats) is copied into v_cache row *pos. The caches hold
// kv's types (f32: float, f16: __half elements; q8_0 is refused).
// *pos is read before the kernel waits on the previous kernel of the stream (programmatic dependent
// launch): it must have been written before that kernel started (a copy or an earlier step).
// rows > 0: the caches are a sliding layer's ring of that many rows, position p in row p % rows.
// yarn set (factor != 1): YaRN-scaled rotary (cpu/ops.h rope_neox_yarn_inplace's arithmetic).
// tokens: a token grid (AttnTokens), token t's key and value into the row of pos[t].
void attn_prep(float* q, int q_head_stride, const float* kk, const float* vv, void* k_cache, void* v_cache,
               int kv_width, int n_head, int n_kv, int head_dim, const float* q_norm, const float* k_norm, float eps,
               int rope_dims, float freq_base, const int* pos, cudaStream_t s, KvCacheTypes kv = {}, int rows = 0,
               const RopeYarn* yarn = nullptr, const AttnTokens& tokens = {});

// Causal depthwise conv1d step with SiLU over the 2*n_k*dk + n_v*dv channels (out[c] = silu(sum_j
// w[c*K+j] * window_j[c]), the window being state ((K-1) x channels, oldest first) followed by x; the
// state then drops its oldest row and appends x), then the DeltaNet q/k L2 norms (eps 1e-6) of the
// n_k heads of q and k, q times q_scale; one launch. state_out set: the advanced window goes there and
// state is only read.
void conv_qk_norm(const float* x, const float* weight, int K, float* state, float* out, int n_k_heads, int n_v_heads,
                  int dk, int dv, float q_scale, cudaStream_t s, float* state_out = nullptr);

// One gated delta-rule step for every value head h (deltanet_step of cpu/ops.h) followed by the gated
// RMSNorm: beta = sigmoid(b[h]), g = a[h] * softplus(alpha[h] + dt_bias[h]); q/k of key head h % n_k_heads
// (q at mixed, k at mixed + n_k*dk, v at mixed + 2*n_k*dk); state S [n_v x dk x dv];
// out[h*dv + j] = rmsnorm(o)[j] * norm_w[j] * silu(z[h*dv + j]). Each head's state is spread over
// ceil(dv / 32) blocks (32 value columns each, rows over warps); key-head sizes that layout does not
// take (deltanet_step_fuses_qk_norm false) run one thread per value column instead. scratch: deltanet_scratch_doubles(n_v_heads, dv) doubles; counters: n_v_heads
// unsigned ints, zero before the first call (each call leaves them zero). The state S is read before
// the kernel waits on the previous kernel of the stream (programmatic dependent launch): the step that
// last wrote S must have completed (a synchronisation or graph boundary between two steps on one state,
// as every decode step has), not merely have been launched earlier on the stream.
size_t deltanet_scratch_doubles(int n_v_heads, int dv);
// qk_norm: mixed holds the raw conv outputs of q and k; the step applies conv_qk_norm's L2 norms
// (and q_scale) itself, so conv1d can run fused into the input projection (GemvJob::conv_w) with no
// conv_qk_norm launch. Needs deltanet_step_fuses_qk_norm(dk); fails otherwise.
// S_out set: the updated state goes there and S is only read (the decode lookahead's ping-pong state).
// after_previous: launched without programmatic dependence, so it starts once the previous work on the
// stream has completed (S may then be what the previous kernel wrote: the multi-token step's chain).
// tokens.n > 1 (the multi-token step): n consecutive steps in one launch, token t's inputs at mixed + t *
// mixed_stride, b / alpha + t * gate_stride, z / out + t * out_stride; the state after token t goes to
// records + t * record_stride ([n_v x dk x dv] each) for t < n - 1 and the last token's to S_out (or S);
// scratch then holds n times deltanet_scratch_doubles. Each token's arithmetic is a single step's.
// parents (device, may be null: a chain): a token tree, token t running from the state after its parent
// (record parents[t]; -1: the state before the tokens).
struct DeltaNetTokens {
  int n = 1;
  int64_t mixed_stride = 0, gate_stride = 0, out_stride = 0;
  float* records = nullptr;
  int64_t record_stride = 0;
  const int* parents = nullptr;
};
void deltanet_step_fast(float* S, const float* mixed, const float* b, const float* alpha, const float* a,
                        const float* dt_bias, const float* norm_w, const float* z, float eps, int n_k_heads,
                        int n_v_heads, int dk, int dv, double* scratch, unsigned int* counters, float* out,
                        cudaStream_t s, bool qk_norm = false, float q_scale = 1.0f, float* S_out = nullptr,
                        bool after_previous = false, const DeltaNetTokens& tokens = {});
bool deltanet_step_fuses_qk_norm(int dk);

// x[j] += sum over the k slots in ascending expert id of weights[s] * ye[s*d + j]
//         (+ sigmoid(*shared_gate) * ys[j] when ys is not null),
// then, when norm_w is set, xn = rmsnorm(x) * norm_w (the next layer's input norm); one launch.
void moe_combine_add_norm(float* x, const float* ye, const int* ids, const float* weights, int k, int d,
                          const float* ys, const float* shared_gate, const float* norm_w, float eps, float* xn,
                          cudaStream_t s);

// Laguna's attention output gate: o[h * head_dim + d] *= softplus(gate[h]) (per_head) or
// softplus(gate[h * head_dim + d]), for n_head heads (softplusf's arithmetic).
void attn_gate_mul(float* o, const float* gate, int n_head, int head_dim, bool per_head, cudaStream_t s);

// Strided copies of device memory in one launch (a run of cudaMemcpyAsync calls costs one stream
// operation each): copy i moves rows rows of row_bytes from src (rows src_pitch bytes apart) to dst
// (dst_pitch apart; pitch 0: rows packed). Sizes, pitches and addresses are multiples of 4 bytes; the
// copies must not overlap one another's destinations or read them. One launch per kMaxDeviceCopies.
struct DeviceCopy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t row_bytes = 0;
  size_t rows = 1;
  size_t dst_pitch = 0;
  size_t src_pitch = 0;
};
constexpr int kMaxDeviceCopies = 64;
void copy_batch(const DeviceCopy* copies, int n, cudaStream_t s);
inline void copy_batch(const std::vector<DeviceCopy>& copies, cudaStream_t s) {
  copy_batch(copies.data(), static_cast<int>(copies.size()), s);
}

// argmax over many blocks: the largest logit, the lowest index among equals; NaN and -inf never win (as
// the host's argmax_logit), nor +inf with finite_only (the sampler's maximum); *out = -1 when no element
// qualifies. partial: argmax_wide_blocks(n) entries of scratch; counter: one unsigned int, zero before
// the first call (each call leaves it zero again). rows > 1: rows rows of x, row_stride floats apart,
// each picked into out[r] (partial and counter hold rows times as many entries). publish set: the last block also publishes the pick
// for the decode lookahead (publish_pick_dev of decode_lookahead.cuh: the next step's token and position
// into io, the pick to the host), so a lookahead step ends without a launch of its own.
int argmax_wide_blocks(int64_t n);
void argmax_wide(const float* x, int64_t n, unsigned long long* partial, unsigned int* counter, int* out,
                 cudaStream_t s, bool finite_only = false, const LookaheadLink* publish = nullptr, int* io = nullptr,
                 int rows = 1, int64_t row_stride = 0);

// Per row r of x (rows rows, row_stride floats apart): the k (<= kRowTopkMax) largest of x[0..n) in
// descending order, the lower index among equals, with their softmax probabilities over those n (double
// sums; block_candidates of engine/dflash.h on the host), made non-increasing, into ids / probs
// [rows x k]; NaN counts as -inf and a row's list stops at its first -inf; count[r] = its length, 0 when
// the row has no finite maximum.
constexpr int kRowTopkMax = 32;
void row_topk(const float* x, int rows, int64_t row_stride, int n, int k, int* ids, float* probs, int* count,
              cudaStream_t s);

// What multiplies decode attention's output out[h * head_dim + d]: nothing; sigmoid(q[head_dim + d]) of
// head h's query row (Qwen3.5/3.6: the gate values follow the query values of each head); or softplus of
// a separate gate vector g, one value per head (g[h]) or per element (g[h * head_dim + d]) (Laguna,
// softplusf's arithmetic). Applied where the output is written, so the gate costs no launch.
struct AttnOutGate {
  enum Kind : int { None, SigmoidAfterQuery, SoftplusPerHead, SoftplusPerElement };
  Kind kind = None;
  const float* g = nullptr;  // the softplus kinds' gate values (device)
};

// Decode attention: query head h (at q + h * q_head_stride) against positions 0 .. *pos of KV head
// h / (n_head / n_head_kv) (key p at k_cache + p * kv_stride + g * head_dim, values alike); softmax of
// q.k * scale; out[h * head_dim + d], times the gate. Split over the cache positions (flash-decoding) so long
// contexts use the whole GPU:
// up to attention_splits(max_ctx) blocks per head, merged in a fixed order. scratch: at least
// attention_scratch_floats(n_head, head_dim, max_ctx) floats; counters: n_head unsigned ints, zero before
// the first call (each call leaves them zero). *pos is read before the kernel waits on the previous
// kernel of the stream: it must have been written before that kernel started (a copy or an earlier step).
int attention_splits(int max_ctx);
size_t attention_scratch_floats(int n_head, int head_dim, int max_ctx);
// The caches hold kv's types, as attn_prep writes them. window > 0: only positions *pos - window + 1 ..
// *pos are attended (a sliding layer); rows > 0: position p is cache row p % rows (its ring).
void attention_decode_split(const float* q, int q_head_stride, const void* k_cache, const void* v_cache,
                            int64_t kv_stride, int n_head, int n_head_kv, int head_dim, float scale,
                            AttnOutGate gate, const int* pos, int max_ctx, float* scratch, unsigned int* counters,
                            float* out, cudaStream_t s, KvCacheTypes kv = {}, int window = 0, int rows = 0,
                            const AttnTokens& tokens = {});

}  // namespace strata::cuda
