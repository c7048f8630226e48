// Drafting with the target's own multi-token-prediction head (engine/mtp.h): the target's kept tokens'
// final hidden states come from the sequence it drafts for (Sequence::set_hidden_record, hooked in by
// attach); each propose first runs the head over the positions kept since the last call (its cache
// follows the accepted tokens only), the last of them with the token just sampled, which gives the
// first draft; each further draft chains the head on its own output. Drafts are the head's arg-max
// (q one-hot), so verification keeps the output exactly the target's under any sampling. The head
// computes where the target does (Sequence::make_mtp_head: a GPU session's on the GPU), else on the CPU.
#pragma once

#include <memory>
#include <string>

#include "strata/engine/drafter.h"
#include "strata/engine/hidden_record.h"
#include "strata/engine/model.h"
#include "strata/engine/mtp.h"

namespace strata {

class MtpDrafter final : public Drafter {
 public:
  // Fails naming the model when it has no MTP layer. n_allowed: ids from here on are never drafted.
  MtpDrafter(const Model& target, int max_ctx, int32_t n_allowed);
  std::string name() const override { return "mtp"; }
  void attach(Sequence& target) override;
  void propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) override;

 private:
  const Model& model_;
  int max_ctx_;
  std::unique_ptr<MtpHead> head_;  // made by attach: the target's, or on the CPU
  int32_t n_allowed_;
  Sequence* target_ = nullptr;
  std::string told_;  // the last reason given for a CPU head next to a target that computes elsewhere
  std::shared_ptr<HiddenRecord> record_ = std::make_shared<HiddenRecord>();
  std::vector<int32_t> tokens_;
};

}  // namespace strata
