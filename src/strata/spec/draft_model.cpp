#include "strata/spec/draft_model.h"

#include <algorithm>
#include <cmath>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/text/vocab.h"

namespace strata {

namespace {

bool has_tokenizer(const Model& m) { return m.file().has("tokenizer.ggml.tokens"); }

// softmax(logits)[id] over the finite logits (those not banned).
double softmax_prob(const float* logits, int32_t n, int32_t id) {
  float top = -INFINITY;
  for (int32_t i = 0; i < n; ++i)
    if (std::isfinite(logits[i])) top = std::max(top, logits[i]);
  if (!std::isfinite(logits[id])) return 0.0;
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i)
    if (std::isfinite(logits[i])) sum += std::exp(static_cast<double>(logits[i]) - top);
  return std::exp(static_cast<double>(logits[id]) - top) / sum;
}

}  // namespace

void check_draft_vocabulary(const Model& target, const Model& draft) {
  const std::string& tp = target.file().path();
  const std::string& dp = draft.file().path();
  const int64_t tv = target.config().n_vocab, dv = draft.config().n_vocab;
  const bool tt = has_tokenizer(target), dt = has_tokenizer(draft);
  if (tt != dt)
    fail("draft model ", dp, (dt ? " has a tokenizer and the target " : " has no tokenizer and the target "), tp,
         (dt ? " has none" : " has one"), ": their vocabularies cannot be compared");
  if (!tt) {
    if (tv != dv) fail("draft model ", dp, " has a vocabulary of ", dv, " tokens, the target ", tp, " one of ", tv);
    return;
  }
  const Vocab a = vocab_from_gguf(target.file()), b = vocab_from_gguf(draft.file());
  if (a.tokens.size() != b.tokens.size())
    fail("draft model ", dp, "'s tokenizer has ", b.tokens.size(), " tokens, the target ", tp, "'s ", a.tokens.size(),
         ": a draft model needs the target's vocabulary");
  for (size_t i = 0; i < a.tokens.size(); ++i)
    if (a.tokens[i] != b.tokens[i] || a.token_types[i] != b.token_types[i])
      fail("draft model ", dp, "'s tokenizer differs from the target ", tp, "'s at token ", i,
           ": a draft model needs the target's vocabulary");
  if (a.eos_id != b.eos_id)
    fail("draft model ", dp, " ends text with token ", b.eos_id, ", the target ", tp, " with ", a.eos_id);
  if (static_cast<int64_t>(b.tokens.size()) > dv)
    fail("draft model ", dp, " has ", dv, " embedding rows for a tokenizer of ", b.tokens.size(), " tokens");
}

DraftModelDrafter::DraftModelDrafter(std::unique_ptr<Sequence> sequence, const SamplerParams& sampling,
                                     int32_t n_allowed, std::shared_ptr<const Model> owned, float p_min, int min_tokens)
    : owned_(std::move(owned)),
      sequence_(std::move(sequence)),
      sampler_(sampling),
      greedy_(sampling.temperature <= 0),
      p_min_(p_min),
      min_tokens_(min_tokens) {
  if (!sequence_) fail("draft model: no sequence");
  if (!(p_min >= 0.0f && p_min <= 1.0f)) fail("draft model: --draft-p-min must be within 0..1, got ", p_min);
  n_vocab_ = static_cast<int32_t>(sequence_->model().config().n_vocab);
  n_allowed_ = std::min(n_allowed, n_vocab_);
  if (n_allowed_ < 1) fail("draft model: no token id may be drafted (n_allowed ", n_allowed, ")");
  if (sequence_->n_past() != 0) fail("draft model: the sequence must start empty");
  logits_.resize(static_cast<size_t>(n_vocab_));
}

DraftModelDrafter::~DraftModelDrafter() = default;

void DraftModelDrafter::start_over() {
  if (sequence_->has_pending()) sequence_->keep(nullptr, 0);
  sequence_->reset();
  held_.clear();
  pending_.clear();
  logits_valid_ = false;
}

bool DraftModelDrafter::pick(float* logits, Draft& out) {
  ban_ids_from(logits, n_allowed_, n_vocab_);
  const bool may_stop = p_min_ > 0.0f && static_cast<int>(out.tokens.size()) >= min_tokens_;
  if (greedy_) {
    sampler_.distribution(logits, n_vocab_, no_history_, greedy_pick_);
    const int32_t id = greedy_pick_.ids[0];
    if (may_stop && softmax_prob(logits, n_vocab_, id) < p_min_) return false;
    out.tokens.push_back(id);
    return true;
  }
  TokenDistribution q;
  sampler_.distribution(logits, n_vocab_, no_history_, q);
  // Decided before the draw, from q alone: a drawn token is still distributed as q, so verification
  // against q stays exact.
  if (may_stop) {
    double top = 0.0;
    for (const double w : q.weights) top = std::max(top, w);
    if (q.total <= 0.0 || top / q.total < p_min_) return false;
  }
  out.tokens.push_back(sampler_.draw(q));
  out.q.push_back(std::move(q));
  return true;
}

void DraftModelDrafter::propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) {
  out.clear();
  if (history.empty() || max_tokens < 1) return;
  const size_t common =
      static_cast<size_t>(std::mismatch(held_.begin(), held_.end(), history.begin(), history.end()).first - held_.begin());
  if (common < held_.size()) {
    start_over();
  } else if (!pending_.empty()) {
    // The drafts the history confirms are kept as run; at least the last history token is run again
    // below, for the logits after it.
    size_t m = 0;
    while (m < pending_.size() && held_.size() + m + 1 < history.size() && pending_[m] == history[held_.size() + m]) ++m;
    sequence_->keep_first(static_cast<int>(m));
    held_.insert(held_.end(), pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(m));
    pending_.clear();
    logits_valid_ = false;
  }
  if (history.size() > static_cast<size_t>(sequence_->max_ctx())) return;  // the draft's context is full
  if (held_.size() < history.size()) {
    const int n = static_cast<int>(history.size() - held_.size());
    sequence_->forward(history.data() + held_.size(), n, logits_.data(), false);
    held_ = history;
    logits_valid_ = true;
  }
  if (!logits_valid_) return;  // nothing new since the drafts were dropped: no logits to draft from

  // Each further draft runs the ones before it as pending tokens (a pending chain cannot be extended),
  // so k drafts cost 1 + 2 + ... + (k - 1) draft-token rows; the last run stays pending for the next call.
  const int room = sequence_->max_ctx() - static_cast<int>(history.size());
  const int k = std::min(max_tokens, room + 1);
  std::vector<float> row(logits_);
  if (!pick(row.data(), out)) return;
  for (int t = 1; t < k; ++t) {
    if (sequence_->has_pending()) sequence_->keep(nullptr, 0);
    rows_.resize(static_cast<size_t>(t) * static_cast<size_t>(n_vocab_));
    sequence_->forward_pending(out.tokens.data(), t, nullptr, rows_.data());
    pending_.assign(out.tokens.begin(), out.tokens.end());
    float* last = rows_.data() + static_cast<size_t>(t - 1) * static_cast<size_t>(n_vocab_);
    if (!pick(last, out)) return;
  }
}

}  // namespace strata
