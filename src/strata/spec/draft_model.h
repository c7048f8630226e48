// A draft model: a smaller model with the target's vocabulary, run as a Sequence of its own, proposes
// the next tokens greedily (deterministic) or by sampling (reporting the distribution q it drew from, so
// verification stays exact). Its sequence follows the accepted text: drafts it ran stay pending and the
// ones the next history confirms are kept without running them again (Sequence::keep); a history that
// does not extend what it holds starts it over.
#pragma once

#include <memory>

#include "strata/engine/drafter.h"
#include "strata/engine/model.h"
#include "strata/engine/sequence.h"

namespace strata {

// Fails (strata::Error naming both files) unless `draft` can draft for `target`: both with tokenizers
// of the same tokens (ids, texts, types) and end token, or both without tokenizers and with one
// vocabulary size.
void check_draft_vocabulary(const Model& target, const Model& draft);

class DraftModelDrafter final : public Drafter {
 public:
  // sequence: an empty sequence of the draft model (any backend). sampling: how drafts are picked;
  // greedy (temperature <= 0) or sampled with temperature, top-k, top-p and min-p, after the logit bias
  // (the target's bans are the draft's too); penalties are the target's alone (no history here). Ids >= n_allowed are
  // never drafted (the target's tokenizer ends there). owned (optional): the draft Model, kept alive as long as the
  // sequence (shared: several drafters' sequences may run over one loaded draft model). p_min (--draft-p-min, 0..1):
  // the proposal ends at a position where the draft model's most likely token has a probability below p_min (greedy:
  // softmax over the allowed ids; sampling: of the distribution it draws from, decided before the draw), so that it
  // drafts far only where it is sure. The first min_tokens positions (--draft-min) are drafted whatever
  // p_min says: a proposal shorter than --draft-min is dropped for a plain step, and a length that
  // depended on the tokens drawn would bias what sampled verification keeps.
  DraftModelDrafter(std::unique_ptr<Sequence> sequence, const SamplerParams& sampling, int32_t n_allowed,
                    std::shared_ptr<const Model> owned = nullptr, float p_min = 0.0f, int min_tokens = 0);
  ~DraftModelDrafter() override;
  std::string name() const override { return "draft"; }
  void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) override;
  const Sequence& sequence() const { return *sequence_; }

 private:
  void start_over();
  // Appends the next draft from logits to out (and its q when sampling); false, appending nothing, where
  // the draft model is less sure than p_min past the first min_tokens positions.
  bool pick(float* logits, Draft& out);

  std::shared_ptr<const Model> owned_;  // before sequence_: destroyed after it
  std::unique_ptr<Sequence> sequence_;
  Sampler sampler_;
  bool greedy_;
  float p_min_;
  int min_tokens_;
  int32_t n_allowed_;
  int32_t n_vocab_;
  std::vector<int32_t> held_;     // the tokens the sequence holds
  std::vector<int32_t> pending_;  // drafts run after them, still pending
  std::vector<float> logits_;     // after held_'s last token, when logits_valid_
  bool logits_valid_ = false;
  std::vector<float> rows_;
  TokenDistribution greedy_pick_;
  const std::vector<int32_t> no_history_;
};

}  // namespace strata
