#include "strata/spec/mtp_drafter.h"

#include <algorithm>

#include "strata/base/error.h"
#include "strata/engine/sequence.h"
#include "strata/engine/session.h"

namespace strata {

MtpDrafter::MtpDrafter(const Model& target, int max_ctx, int32_t n_allowed)
    : model_(target), state_(target, max_ctx), n_allowed_(n_allowed) {
  const int64_t n_vocab = target.config().n_vocab;
  if (n_allowed_ <= 0 || n_allowed_ > n_vocab) n_allowed_ = static_cast<int32_t>(n_vocab);
}

void MtpDrafter::attach(Sequence& target) {
  if (&target.model() != &model_) fail("--spec mtp: the drafter belongs to another model than the sequence's");
  // A sequence already holding the record keeps it; another one restarts it at its position.
  target.set_hidden_record(record_);
  target_ = &target;
}

void MtpDrafter::propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) {
  out.clear();
  if (!target_) fail("--spec mtp: the drafter was not attached to the sequence it drafts for");
  HiddenRecord& r = *record_;
  if (r.restarted || r.begin > state_.n_past()) {
    // A new text, or positions the head never saw (restored from a prompt cache): their cache rows
    // stay empty, which costs acceptance only.
    state_.state().reset();
    state_.state().n_past = r.begin;
    r.restarted = false;
  }
  const int kept = r.end();  // the target's kept positions; history.back() is the token at `kept`
  const int from = state_.n_past();
  if (history.empty() || from >= kept) return;
  const int n = kept - from;
  const size_t d = static_cast<size_t>(model_.config().n_embd);
  tokens_.resize(static_cast<size_t>(n));
  hidden_.resize(static_cast<size_t>(n) * d);
  for (int t = 0; t < n; ++t) {
    const int p = from + t;
    tokens_[static_cast<size_t>(t)] = p + 1 < kept ? r.tokens[static_cast<size_t>(p + 1 - r.begin)] : history.back();
    std::copy_n(r.row(p), d, hidden_.data() + static_cast<size_t>(t) * d);
  }
  out_.resize(static_cast<size_t>(n) * d);
  logits_.resize(static_cast<size_t>(model_.config().n_vocab));
  mtp_forward(model_, 0, state_, tokens_.data(), hidden_.data(), n, out_.data(), logits_.data());
  // The last row ran the token just sampled, which verification may still reject: it is run again
  // next time, so the cache and the record keep only what precedes it.
  r.drop_before(kept - 1);
  out.tokens.push_back(argmax(logits_.data(), n_allowed_));
  std::vector<float> h(out_.end() - static_cast<std::ptrdiff_t>(d), out_.end()), next(d);
  while (static_cast<int>(out.tokens.size()) < max_tokens && state_.n_past() < state_.max_ctx()) {
    mtp_forward(model_, 0, state_, &out.tokens.back(), h.data(), 1, next.data(), logits_.data());
    out.tokens.push_back(argmax(logits_.data(), n_allowed_));
    h.swap(next);
  }
  state_.truncate(kept - 1);
}

}  // namespace strata
