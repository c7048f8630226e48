// The building blocks both forward passes are made of. Each works on a batch of n tokens stored
// row-major ([n x width]); n == 1 is decode (matvec), n > 1 prefill (matmul over the batch), and both
// paths perform the same arithmetic per token so prefill and decode give the same logits.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "strata/cpu/matmul.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/sequence_state.h"
#include "strata/engine/token_tree.h"
#include "strata/model/config.h"
#include "strata/model/weights.h"

namespace strata {

// Y[n x w.n_rows] = X[n x w.n_cols] W^T: matvec for one token, matmul for a batch.
void project(const WeightMatrix& w, const float* X, int n, float* Y);
// Y_i = W_i X for m matrices on the same n rows of X: one token's products as one parallel region
// (matvec_many), more tokens through project; the same results either way.
void project_many(const WeightMatrix* const* ws, float* const* ys, int m, const float* X, int n);

// One token's mixer as one parallel region instead of a region per product: ys[i] = ws[i] xn for the
// m input products, then mid() (called by every thread of the team, so its omp loops share the
// team's threads), then out = w_out o. The rows are matvec's, so the results are those of
// project_many, mid and project run one after the other.
void project_around(const WeightMatrix* const* ws, float* const* ys, int m, const float* xn,
                    const std::function<void()>& mid, const WeightMatrix& w_out, const float* o, float* out);

// X[t] = row tokens[t] of the embedding table, decoded from its stored type. Fails on ids out of range.
void embed_tokens(const WeightMatrix& embd, const int32_t* tokens, int n, float* X);

// out[t] = rmsnorm(X[t]) * w for n rows of width d.
void rmsnorm_rows(const float* X, const float* w, float eps, int n, int d, float* out);

// Attention (full or sliding-window, as l.mixer says) over the layer's KV cache for n tokens after
// n_past kept ones: projections, per-head q/k RMSNorm, NEOX rotary on the first l.rope_dims dims, causal
// GQA softmax attention (a sliding layer: over the last l.window positions), optional output gate
// (qwen35moe sigmoid in attn_q, laguna softplus of attn_gate), output projection. Token t's key/value
// go to cache row n_past + t. tree: nullptr or a chain for consecutive positions; otherwise token t
// sits at n_past + depth(t) and attends to the kept rows and its ancestors (token_tree.h).
void attention_block(const ModelConfig& c, const LayerSpec& l, const AttentionWeights& w, LayerState& s, int n_past,
                     const TokenTree* tree, const float* xn, int n, float* out);
// After a pending forward: moves the kept path's key/value rows to n_past + 0 .. m - 1.
void attention_keep(const ModelConfig& c, LayerState& s, int n_past, const int* path, int m);

// Gated DeltaNet (qwen35moe linear attention) for n tokens, advancing the conv window and recurrent
// state token by token. pending (nullptr: the tokens are kept as they run): the tokens' tree; the state
// before them and their inputs are kept for deltanet_keep, and each token runs from its parent's state.
void deltanet_block(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const TokenTree* pending,
                    const float* xn, int n, float* out);
// After a pending forward: leaves the state of the root path path[0..m) (the state before the forward
// when m == 0), replaying the stored inputs where the state does not hold that path already.
void deltanet_keep(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const int* path, int m);

// Mixture of experts: the router (c.router: softmax, or sigmoid with soft-capping and selection bias),
// top-k (renormalised when c.norm_topk), SwiGLU experts run once per batch on the tokens that chose
// them, their sum times c.expert_weights_scale, plus the shared expert (sigmoid-gated or not) when
// present. picks (optional): receives the chosen expert ids, [n x k] (the forward counts routes from them).
// forced (optional, [n x k]): replayed picks (bench --routing) that replace the router's top-k for the
// rows whose first entry is >= 0; their weights are the router's probabilities of those ids
// (renormalised over them when c.norm_topk).
void moe_block(const ModelConfig& c, const MoeWeights& w, const float* xn, int n, float* out,
               std::vector<int>* picks = nullptr, const int* forced = nullptr);

// A dense SwiGLU feed-forward: out = down(silu(gate xn) * up xn) for n rows.
void dense_ffn_block(const DenseFfnWeights& w, const float* xn, int n, float* out);

// Final norm and output projection; logits for every row of X ([n x n_vocab]) or for the last only.
void output_logits(const ModelConfig& c, const ModelWeights& w, const float* X, int n, bool all_positions,
                   float* logits);

}  // namespace strata
