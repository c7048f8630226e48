// A DFlash-style block drafter (issue 22): a few transformer layers that draft a whole block of tokens in
// one forward, conditioned on the target's hidden states (after chosen target layers, HiddenRecord
// taps) of every kept token. Facts from the DFlash paper (Chen, Liang, Liu: "DFlash: Block Diffusion
// for Flash Speculative Decoding"): the taps of several target layers are concatenated and projected
// to one context feature per token, which enters every drafter layer as keys and values; the block
// is the last sampled token followed by mask tokens, attending to the context and, without a causal
// mask, to the whole block; the target's embedding and output matrix are shared.
//
// strata's form, per drafter layer l and for positions p (context rows 0..n-1, the block at n..n+B-1):
//   context:  c_p = rmsnorm(fc [tap_p(L1); ...; tap_p(Lk)]) * hidden_norm
//             K_p = rope(rmsnorm_head(W_k c_p) * k_norm, p),  V_p = W_v c_p
//   block:    x_0 = embed(anchor), x_j = mask (j >= 1)
//             h = rmsnorm(x) * attn_norm;  q_j = rope(rmsnorm_head(W_q h_j) * q_norm, n + j)
//             keys/values: the context's K_p, V_p and the block's own rope(W_k h_j), W_v h_j (all of them)
//             x += W_o attn;  x += W_down(silu(W_gate g) * W_up g),  g = rmsnorm(x) * ffn_norm
//   logits_j = output(rmsnorm(x_j) * output_norm), j = 1..B-1: the token at position n + j.
// Heads use NEOX rotary pairing on their first rope_dims dims; grouped key/value heads as the target's.
// With dflash.context_length W > 0 the block sees only the last W context rows (the drafter was trained
// on contexts no longer than that).
//
// The file is a GGUF of architecture "dflash" (strata's own keys, written by tools/): dflash.embedding_length,
// dflash.block_count, dflash.attention.head_count, dflash.attention.head_count_kv, dflash.attention.key_length,
// dflash.attention.layer_norm_rms_epsilon, dflash.feed_forward_length, dflash.block_size,
// dflash.rope.dimension_count, dflash.rope.freq_base, dflash.vocab_size, dflash.target_layers (int array),
// dflash.context_length (optional, 0: all);
// tensors fc.weight, hidden_norm.weight, mask_embd.weight, output_norm.weight and blk.N.{attn_norm, attn_q,
// attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}.weight.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/cpu/matmul.h"
#include "strata/engine/drafter.h"
#include "strata/engine/model.h"
#include "strata/gguf/gguf.h"

namespace strata {

struct DFlashConfig {
  int n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, block = 0, rope_dims = 0;
  int context = 0;  // the most recent context rows a block sees (0: all of them)
  float rope_freq_base = 10000.0f, rms_eps = 1e-6f;
  int64_t n_vocab = 0;
  std::vector<int> target_layers;  // the target layers whose outputs feed the context, in file order

  // The context rows a block sees of n_ctx: the last `context` of them, or all.
  int seen(int n_ctx) const { return context > 0 && n_ctx > context ? context : n_ctx; }
  // Fails unless 0 <= depth <= block - 1 (the block positions a draft can take) and 1 <= n_allowed <=
  // n_vocab: a DFlashHead::candidates request.
  void check_candidates(int depth, int32_t n_allowed) const;
};

// The one failure of a block position without a finite logit (CPU and GPU heads alike).
[[noreturn]] void fail_no_finite_logit();

struct DFlashLayer {
  std::vector<float> attn_norm, q_norm, k_norm, ffn_norm;
  WeightMatrix wq, wk, wv, wo, gate, up, down;
};

class DFlashModel {
 public:
  // Maps the file and checks it against the target (width, vocabulary, tap layers, shapes); fails naming
  // the file and what does not fit.
  static std::unique_ptr<DFlashModel> load(const std::string& path, const Model& target);

  const DFlashConfig& config() const { return c_; }
  const Model& target() const { return target_; }
  const std::string& path() const { return file_.path(); }

  WeightMatrix fc;
  std::vector<float> hidden_norm, mask, output_norm;
  std::vector<DFlashLayer> layers;

 private:
  DFlashModel(GgufFile file, const Model& target) : file_(std::move(file)), target_(target) {}
  GgufFile file_;
  const Model& target_;
  DFlashConfig c_;
};

// The drafter's context: every drafter layer's keys and values of the context rows (float32), row i
// at position begin() + i.
class DFlashState {
 public:
  explicit DFlashState(const DFlashModel& m);
  const DFlashModel& model() const { return m_; }
  int n_ctx() const { return n_ctx_; }
  int begin() const { return pos0_; }
  int end() const { return pos0_ + n_ctx_; }
  // Forgets every row; the next one sits at position pos.
  void restart(int pos);
  // Forgets rows from n on (n <= n_ctx()).
  void truncate(int n);
  // Appends n context rows at positions end().. from taps ([n x target_layers x n_embd], a
  // HiddenRecord of the model's target_layers).
  void add_context(const float* taps, int n);
  // logits ([block - 1 x n_vocab]) of the block after the context: anchor at position end(), masks
  // after it; row j - 1 scores the token at position end() + j.
  void draft(int32_t anchor, float* logits) const;

 private:
  const DFlashModel& m_;
  int pos0_ = 0, n_ctx_ = 0;
  std::vector<std::vector<float>> k_, v_;  // per layer: [n_ctx x n_head_kv x head_dim]
};

// The drafter's context and block as the DFlash drafter (spec/dflash_drafter.h) drives them, wherever they
// compute: CpuDFlashHead (DFlashState on the CPU) or the GPU's, next to a GPU target
// (Sequence::make_dflash_head). begin / end / restart / add_context as DFlashState's.
class DFlashHead {
 public:
  virtual ~DFlashHead() = default;
  virtual int begin() const = 0;
  virtual int end() const = 0;
  virtual void restart(int pos) = 0;
  virtual void add_context(const float* taps, int n) = 0;
  // The block's logits after the context (DFlashState::draft's: [block - 1 x n_vocab]).
  virtual void logits(int32_t anchor, float* out) = 0;
  // Block positions 1..depth (depth <= block - 1): each one's block_candidates over ids < n_allowed.
  virtual void candidates(int32_t anchor, int depth, int k, int32_t n_allowed,
                          std::vector<PositionCandidates>& out) = 0;
};

// The top k of a row of logits over ids < n (highest first, the lower id among equals) with their softmax
// probabilities over those ids (double sums), made non-increasing where rounding would reorder equal
// logits' by an ulp; a NaN counts as -inf and the list stops at the first -inf. Fails when no logit is
// finite. NaNs in the row are overwritten with -inf.
PositionCandidates block_candidates(float* logits, int32_t n, int k);
// DFlashHead::candidates on the host: block_candidates of rows 0..depth-1 of the block's logits
// ([block - 1 x n_vocab], overwritten where NaN), the request checked first.
void candidates_from_logits(const DFlashConfig& c, float* logits, int depth, int k, int32_t n_allowed,
                            std::vector<PositionCandidates>& out);

class CpuDFlashHead final : public DFlashHead {
 public:
  explicit CpuDFlashHead(const DFlashModel& m) : state_(m) {}
  int begin() const override { return state_.begin(); }
  int end() const override { return state_.end(); }
  void restart(int pos) override { state_.restart(pos); }
  void add_context(const float* taps, int n) override { state_.add_context(taps, n); }
  void logits(int32_t anchor, float* out) override { state_.draft(anchor, out); }
  void candidates(int32_t anchor, int depth, int k, int32_t n_allowed, std::vector<PositionCandidates>& out) override;

 private:
  DFlashState state_;
  std::vector<float> logits_;
};

}  // namespace strata
