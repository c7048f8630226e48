#include "strata/spec/mtp_drafter.h"

#include <algorithm>

#include "strata/base/error.h"
#include "strata/engine/sequence.h"
#include "strata/engine/session.h"

namespace strata {

MtpDrafter::MtpDrafter(const Model& target, int max_ctx, int32_t n_allowed)
    : model_(target), max_ctx_(max_ctx), n_allowed_(n_allowed) {
  mtp_cache_config(target);  // fails naming the model when it has no MTP layer; the head comes at attach
  const int64_t n_vocab = target.config().n_vocab;
  if (n_allowed_ <= 0 || n_allowed_ > n_vocab) n_allowed_ = static_cast<int32_t>(n_vocab);
}

void MtpDrafter::attach(Sequence& target) {
  if (&target.model() != &model_) fail("--spec mtp: the drafter belongs to another model than the sequence's");
  // A sequence already holding the record keeps it; another one restarts it at its position.
  target.set_hidden_record(record_);
  // A GPU session's head state is the session's, so a new head on it carries on.
  std::string why;
  std::unique_ptr<MtpHead> near = target.make_mtp_head(max_ctx_, why);
  place_head<CpuMtpHead>(head_, std::move(near), why, told_, "--spec mtp: the MTP head",
                         [&] { return std::make_unique<CpuMtpHead>(model_, max_ctx_); });
  target_ = &target;
}

void MtpDrafter::propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) {
  out.clear();
  if (!target_) fail("--spec mtp: the drafter was not attached to the sequence it drafts for");
  HiddenRecord& r = *record_;
  MtpHead& head = *head_;
  if (r.restarted || r.begin > head.n_past()) {
    // A new text, or positions the head never saw (restored from a prompt cache): their cache rows
    // stay empty, which costs acceptance only.
    head.restart(r.begin);
    r.restarted = false;
  }
  const int kept = r.end();  // the target's kept positions; history.back() is the token at `kept`
  const int from = head.n_past();
  if (history.empty() || from >= kept) return;
  const int n = kept - from;
  tokens_.resize(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) {
    const int p = from + t;
    tokens_[static_cast<size_t>(t)] = p + 1 < kept ? r.tokens[static_cast<size_t>(p + 1 - r.begin)] : history.back();
  }
  const int more = std::max(0, std::min(max_tokens - 1, head.max_ctx() - kept));
  // The record's rows of positions from..kept-1 lie one after another (from >= r.begin: restarted above).
  head.draft(tokens_.data(), r.row(from), n, more, n_allowed_, out.tokens);
  // The last row ran the token just sampled, which verification may still reject: it is run again
  // next time, so the cache and the record keep only what precedes it.
  r.drop_before(kept - 1);
  head.truncate(kept - 1);
}

}  // namespace strata
