// Drafting with a DFlash block drafter (engine/dflash.h): the target's kept tokens' taps (the outputs of
// the drafter's target layers) come from the sequence it drafts for (Sequence::set_hidden_record with
// layers, hooked in by attach) and extend the drafter's context; each propose then drafts one block
// after the token just sampled, takes each block position's top-k (softmax over ids < n_allowed) and
// builds the DDTree of the best paths under the node budget (spec/ddtree.h), verified in one forward.
// The drafter's forward runs where the sequence computes when it can (Sequence::make_dflash_head: the
// GPU next to a GPU target), on the CPU otherwise.
// Drafts are deterministic (q empty), so verification keeps the output exactly the target's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "strata/engine/dflash.h"
#include "strata/engine/drafter.h"
#include "strata/engine/hidden_record.h"

namespace strata {

class DFlashDrafter final : public Drafter {
 public:
  // n_allowed: ids from here on are never drafted; top_k >= 1 candidates per block position; positions
  // below max_ctx.
  DFlashDrafter(std::shared_ptr<const DFlashModel> model, int32_t n_allowed, int top_k, int max_ctx);
  std::string name() const override { return "dflash"; }
  // Fails (naming the flag) when the sequence cannot give the taps.
  void attach(Sequence& target) override;
  // At most max_tokens nodes, no deeper than block - 1.
  void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) override;
  // Where the drafter's context lives (after attach: the sequence's head or the CPU's).
  DFlashHead& head() { return *head_; }

 private:
  std::shared_ptr<const DFlashModel> model_;
  int32_t n_allowed_;
  int top_k_;
  int max_ctx_;
  std::unique_ptr<DFlashHead> head_;
  std::string told_;  // the last reason printed for drafting on the CPU
  Sequence* target_ = nullptr;
  std::shared_ptr<HiddenRecord> record_ = std::make_shared<HiddenRecord>();
  std::vector<PositionCandidates> positions_;
};

}  // namespace strata
