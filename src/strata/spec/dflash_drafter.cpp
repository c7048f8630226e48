#include "strata/spec/dflash_drafter.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "strata/base/error.h"
#include "strata/engine/sequence.h"
#include "strata/spec/ddtree.h"

namespace strata {
namespace {

// The top k of a row over ids < n (highest logit first, the lower id among equals) with their softmax
// probabilities over those ids; a NaN counts as -inf. Fails when no logit is finite.
PositionCandidates top_candidates(float* logits, int32_t n, int k, std::vector<int32_t>& ids) {
  float mx = -INFINITY;
  for (int32_t i = 0; i < n; ++i) {
    if (std::isnan(logits[i])) logits[i] = -INFINITY;
    mx = std::max(mx, logits[i]);
  }
  if (!std::isfinite(mx)) fail("--spec dflash: the drafter gave no finite logit");
  double z = 0;
  for (int32_t i = 0; i < n; ++i) z += std::exp(static_cast<double>(logits[i]) - mx);
  ids.resize(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  const int take = std::min<int>(k, n);
  std::partial_sort(ids.begin(), ids.begin() + take, ids.end(), [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  PositionCandidates p;
  for (int i = 0; i < take; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    if (!std::isfinite(logits[id])) break;
    p.tokens.push_back(id);
    p.probs.push_back(static_cast<float>(std::exp(static_cast<double>(logits[id]) - mx) / z));
  }
  // Rounding may reorder equal logits' probabilities by an ulp: keep them non-increasing.
  for (size_t i = 1; i < p.probs.size(); ++i) p.probs[i] = std::min(p.probs[i], p.probs[i - 1]);
  return p;
}

}  // namespace

DFlashDrafter::DFlashDrafter(std::shared_ptr<const DFlashModel> model, int32_t n_allowed, int top_k)
    : model_(std::move(model)), n_allowed_(n_allowed), top_k_(top_k), state_(*model_) {
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
  target_ = &target;
}

void DFlashDrafter::propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) {
  out.clear();
  if (!target_) fail("--spec dflash: the drafter was not attached to the sequence it drafts for");
  HiddenRecord& r = *record_;
  if (r.restarted || r.begin > state_.end()) {
    // A new text, or positions whose taps never came (restored from a prompt cache): the context
    // starts at the record, which costs acceptance only.
    state_.restart(r.begin);
    r.restarted = false;
  }
  const int kept = r.end();  // the target's kept positions; history.back() is the token at `kept`
  if (state_.end() < kept) state_.add_context(r.row(state_.end()), kept - state_.end());
  r.drop_before(kept);
  if (history.empty() || max_tokens < 1) return;
  const DFlashConfig& c = model_->config();
  const size_t vocab = static_cast<size_t>(c.n_vocab);
  logits_.resize(static_cast<size_t>(c.block - 1) * vocab);
  state_.draft(history.back(), logits_.data());
  const int depth = std::min(c.block - 1, max_tokens);
  std::vector<PositionCandidates> positions;
  std::vector<int32_t> ids;
  for (int j = 0; j < depth; ++j)
    positions.push_back(
        top_candidates(logits_.data() + static_cast<size_t>(j) * vocab, n_allowed_, std::min(top_k_, max_tokens), ids));
  build_ddtree(positions, max_tokens, out);
}

}  // namespace strata
