// The building blocks both forward passes are made of. Each works on a batch of n tokens stored
// row-major ([n x width]); n == 1 is decode (matvec), n > 1 prefill (matmul over the batch), and both
// paths perform the same arithmetic per token so prefill and decode give the same logits.
#pragma once

#include <cstdint>

#include "strata/cpu/matmul.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/sequence_state.h"
#include "strata/model/config.h"
#include "strata/model/weights.h"

namespace strata {

// Y[n x w.n_rows] = X[n x w.n_cols] W^T: matvec for one token, matmul for a batch.
void project(const WeightMatrix& w, const float* X, int n, float* Y);

// X[t] = row tokens[t] of the embedding table, decoded from its stored type. Fails on ids out of range.
void embed_tokens(const WeightMatrix& embd, const int32_t* tokens, int n, float* X);

// out[t] = rmsnorm(X[t]) * w for n rows of width d.
void rmsnorm_rows(const float* X, const float* w, float eps, int n, int d, float* out);

// Full attention over the layer's KV cache for tokens at positions n_past .. n_past+n-1: projections,
// per-head q/k RMSNorm, NEOX rotary on the first rope_dims dims, causal GQA softmax attention,
// optional sigmoid output gate (qwen35moe), output projection. Writes the new keys/values to the cache.
void attention_block(const ModelConfig& c, const AttentionWeights& w, LayerState& s, int n_past,
                     const float* xn, int n, float* out);

// Gated DeltaNet (qwen35moe linear attention) for n consecutive tokens, advancing the conv window and
// recurrent state token by token.
void deltanet_block(const ModelConfig& c, const DeltaNetWeights& w, LayerState& s, const float* xn,
                    int n, float* out);

// Mixture of experts: softmax router, top-k (renormalised when c.norm_topk), SwiGLU experts run once per
// batch on the tokens that chose them, plus the sigmoid-gated shared expert when present.
// counts (optional): one pick per (token, chosen expert) is added to row `layer`.
void moe_block(const ModelConfig& c, const MoeWeights& w, const float* xn, int n, float* out,
               RoutingCounts* counts = nullptr, int layer = 0);

// Final norm and output projection; logits for every row of X ([n x n_vocab]) or for the last only.
void output_logits(const ModelConfig& c, const ModelWeights& w, const float* X, int n, bool all_positions,
                   float* logits);

}  // namespace strata
