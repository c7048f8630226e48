#include "strata/spec/dflash_drafter.h"

#include <algorithm>

#include "strata/base/error.h"
#include "strata/engine/sequence.h"
#include "strata/spec/ddtree.h"

namespace strata {

DFlashDrafter::DFlashDrafter(std::shared_ptr<const DFlashModel> model, int32_t n_allowed, int top_k, int max_ctx)
    : model_(std::move(model)), n_allowed_(n_allowed), top_k_(top_k), max_ctx_(max_ctx) {
  const int64_t n_vocab = model_->config().n_vocab;
  if (n_allowed_ <= 0 || n_allowed_ > n_vocab) n_allowed_ = static_cast<int32_t>(n_vocab);
  if (top_k_ < 1) fail("--spec dflash: ", top_k_, " candidates per position (at least 1)");
}

void DFlashDrafter::attach(Sequence& target) {
  if (&target.model() != &model_->target())
    fail("--spec dflash: the drafter belongs to another model than the sequence's");
  record_->layers = model_->config().target_layers;
  try {
    target.set_hidden_record(record_);  // a sequence already holding it keeps it
  } catch (const Error& e) {
    fail("--spec dflash: ", e.what());
  }
  // A GPU session keeps its head, context included, for the next attach; a new head starts empty and
  // propose restarts it at the record's first row (acceptance is all that costs).
  std::string why;
  std::unique_ptr<DFlashHead> near = target.make_dflash_head(*model_, max_ctx_, why);
  place_head<CpuDFlashHead>(head_, std::move(near), why, told_, "--spec dflash: the drafter",
                            [&] { return std::make_unique<CpuDFlashHead>(*model_); });
  target_ = &target;
}

void DFlashDrafter::propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) {
  out.clear();
  if (!target_) fail("--spec dflash: the drafter was not attached to the sequence it drafts for");
  HiddenRecord& r = *record_;
  DFlashHead& head = *head_;
  if (r.restarted || r.begin > head.end()) {
    // A new text, or positions whose taps never came (restored from a prompt cache): the context
    // starts at the record, which costs acceptance only.
    head.restart(r.begin);
    r.restarted = false;
  }
  const int kept = r.end();  // the target's kept positions; history.back() is the token at `kept`
  if (head.end() < kept) head.add_context(r.row(head.end()), kept - head.end());
  r.drop_before(kept);
  if (history.empty() || max_tokens < 1) return;
  const int depth = std::min(model_->config().block - 1, max_tokens);
  head.candidates(history.back(), depth, std::min(top_k_, max_tokens), n_allowed_, positions_);
  build_ddtree(positions_, max_tokens, out);
}

}  // namespace strata
