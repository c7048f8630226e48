// The multi-token-prediction head on the CPU (ModelConfig::n_mtp, ModelWeights::mtp). Its row at
// position p takes the target's final hidden state h_p (after the output norm, as llama.cpp and vLLM
// feed Qwen3.5's head) and the embedding of the token at p + 1, and predicts the token at p + 2:
//   x = eh_proj [enorm(embed(token)); hnorm(h)];  x += attn(rmsnorm(x));  x += moe(rmsnorm(x))
//   out = shared_head_norm(x);  logits = output(out)
// Its attention layer has a KV cache of its own (MtpState). Chaining feeds `out` back as the next
// row's hidden state.
#pragma once

#include <cstdint>
#include <vector>

#include "strata/engine/model.h"
#include "strata/engine/sequence_state.h"

namespace strata {

// The config of a one-layer model whose layer is the MTP layer: what the head's cache is shaped by.
// Fails naming the model when it has no MTP layer.
ModelConfig mtp_cache_config(const Model& model);

// The head's cache: one attention layer of the model's MTP layer spec, sized to max_ctx positions.
class MtpState {
 public:
  // Fails naming the model when it has no MTP layer.
  MtpState(const Model& model, int max_ctx);
  // Positions whose cache rows hold the head's keys and values (the next row's position).
  int n_past() const { return state_.n_past; }
  int max_ctx() const { return state_.max_ctx; }
  // Rows from `pos` on are forgotten (later rows overwrite them); pos <= n_past().
  void truncate(int pos);
  SequenceState& state() { return state_; }

 private:
  SequenceState state_;
};

// Runs n rows of MTP block j at positions s.n_past() ... + n - 1: tokens[t] the token after row t's
// position, hidden[t] ([n x n_embd]) the hidden state at it. Writes out ([n x n_embd], the normed
// outputs that chain) and, when logits is set, the last row's logits ([n_vocab]). Advances n_past by n.
void mtp_forward(const Model& model, int j, MtpState& s, const int32_t* tokens, const float* hidden, int n, float* out,
                 float* logits);

// The head as the MTP drafter drives it, wherever it computes: CpuMtpHead (MtpState + mtp_forward) or
// the GPU's, next to a GPU target (Sequence::make_mtp_head). Block 0, arg-max picks.
class MtpHead {
 public:
  virtual ~MtpHead() = default;
  virtual int n_past() const = 0;
  virtual int max_ctx() const = 0;
  // Forgets every row; the next row runs at position pos (the cache rows before it are not cleared).
  virtual void restart(int pos) = 0;
  // As MtpState::truncate.
  virtual void truncate(int pos) = 0;
  // Runs n rows as mtp_forward, then `count` more, each fed the previous row's pick and output; appends
  // the picks of the n-th row and of each chained row (1 + count; arg-max over ids < n_allowed, lowest
  // id among equals) to picks.
  virtual void draft(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
                     std::vector<int32_t>& picks) = 0;
};

class CpuMtpHead final : public MtpHead {
 public:
  CpuMtpHead(const Model& model, int max_ctx);
  int n_past() const override { return state_.n_past(); }
  int max_ctx() const override { return state_.max_ctx(); }
  void restart(int pos) override;
  void truncate(int pos) override { state_.truncate(pos); }
  void draft(const int32_t* tokens, const float* hidden, int n, int count, int32_t n_allowed,
             std::vector<int32_t>& picks) override;

 private:
  const Model& model_;
  MtpState state_;
  std::vector<float> out_, next_, logits_;
};

}  // namespace strata
