#include "strata/engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <utility>

#include "strata/base/error.h"
#include "strata/sample/speculative.h"
#include "strata/text/detokenizer.h"

namespace strata {

namespace {
// STRATA_SPEC_PROFILE=1: wall time of the speculative loop's phases, summed over the process and printed
// on stderr at exit (debug output only).
enum SpecPhase { kPropose, kVerifyForward, kVerifyPick, kKeep, kPlainStep, kSpecPhases };
struct SpecProfile {
  bool on = std::getenv("STRATA_SPEC_PROFILE") != nullptr && std::getenv("STRATA_SPEC_PROFILE")[0] == '1';
  std::mutex mu;  // serve's slots generate on several threads
  double seconds[kSpecPhases] = {};
  long calls[kSpecPhases] = {};
  ~SpecProfile() {
    if (!on) return;
    static const char* names[kSpecPhases] = {"propose", "verify forward", "verify pick", "keep", "plain step"};
    std::fprintf(stderr, "strata spec profile (ms per call):\n");
    for (int i = 0; i < kSpecPhases; ++i)
      if (calls[i] > 0)
        std::fprintf(stderr, "  %-15s %8.4f  (%ld calls)\n", names[i], 1e3 * seconds[i] / static_cast<double>(calls[i]),
                     calls[i]);
  }
  void add(SpecPhase p, std::chrono::steady_clock::time_point since) {
    if (!on) return;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    std::lock_guard<std::mutex> lock(mu);
    seconds[p] += dt;
    ++calls[p];
  }
};
SpecProfile g_spec_profile;
}  // namespace

const char* stop_reason_name(StopReason reason) {
  switch (reason) {
    case StopReason::EndOfGeneration: return "eos";
    case StopReason::MaxTokens: return "length";
    case StopReason::StopString: return "stop";
    case StopReason::ContextFull: return "context";
    case StopReason::Cancelled: return "cancelled";
  }
  return "?";
}

double GenerationStats::prompt_tokens_per_second() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0;
}

double GenerationStats::decode_tokens_per_second() const {
  return decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0;
}

double GenerationStats::acceptance_rate() const {
  return drafted_tokens > 0 ? static_cast<double>(accepted_tokens) / drafted_tokens : 0.0;
}

double GenerationStats::tokens_per_spec_step() const {
  return spec_steps > 0 ? static_cast<double>(accepted_tokens + spec_steps) / spec_steps : 0.0;
}

void validate_speculative_params(const SpeculativeParams& spec) {
  if (spec.draft_max < 1) fail("--draft-max must be >= 1, got ", spec.draft_max);
  if (spec.draft_min < 0) fail("--draft-min must be >= 0, got ", spec.draft_min);
  if (spec.draft_min > spec.draft_max)
    fail("--draft-min ", spec.draft_min, " exceeds --draft-max ", spec.draft_max);
}

// ---- stop strings -----------------------------------------------------------------------------

StopStringFilter::StopStringFilter(std::vector<std::string> stop_strings) {
  for (auto& s : stop_strings)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringFilter::push(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);
  // The earliest complete stop string ends generation; nothing from it on is emitted.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail of pending_ that is a proper prefix of some stop string: only that
  // much could still turn into a match once more text arrives.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, pending_.size());
    for (size_t len = max_len; len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::flush() {
  std::string out;
  out.swap(pending_);
  return stopped_ ? std::string() : out;
}

// ---- token healing ----------------------------------------------------------------------------

std::string heal_prompt_end(const Tokenizer& tokenizer, std::vector<int32_t>& prompt) {
  if (prompt.size() < 2) return "";
  const int32_t last = prompt.back();
  if (last < 0 || last >= tokenizer.n_vocab() || tokenizer.is_special(last)) return "";
  std::string bytes = tokenizer.token_text(last);
  if (bytes.empty()) return "";
  prompt.pop_back();
  return bytes;
}

namespace {

// Masks every token whose bytes do not start with `prefix` (special tokens included: they have no
// bytes to continue the user's text with).
void constrain_to_prefix(const Tokenizer& tokenizer, const std::string& prefix, float* logits, int32_t n_text) {
  bool any = false;
  for (int32_t id = 0; id < n_text; ++id) {
    const std::string& t = tokenizer.token_text(id);
    const bool ok = !tokenizer.is_special(id) && t.size() >= prefix.size() && t.compare(0, prefix.size(), prefix) == 0;
    if (!ok) logits[id] = -std::numeric_limits<float>::infinity();
    any = any || ok;
  }
  if (!any) fail("token healing: no token starts with the prompt's last ", prefix.size(), " bytes");
}

}  // namespace

// ---- speculative verification -----------------------------------------------------------------

namespace {

struct SpecScratch {
  Draft draft;
  std::vector<int32_t> batch;
  std::vector<int> parents;                // batch order: -1 for the current token
  std::vector<std::vector<int>> children;  // batch index -> its children's batch indices, in draft order
  std::vector<int> path;                   // batch indices of the current token and the accepted drafts
  std::vector<int32_t> picks;              // a greedy verification's arg-max per batch row
  std::vector<float> logits;
  TokenDistribution p, residual;
};

// What a drafter returned, checked before it reaches the model.
void check_draft(const Draft& d, int max_tokens, int32_t n_vocab) {
  const size_t n = d.tokens.size();
  if (n > static_cast<size_t>(max_tokens))
    fail("speculative decoding: the drafter proposed ", n, " tokens where at most ", max_tokens, " were asked for");
  if (!d.q.empty() && d.q.size() != n)
    fail("speculative decoding: the drafter gave ", d.q.size(), " distributions for ", n, " tokens");
  for (const int32_t id : d.tokens)
    if (id < 0 || id >= n_vocab) fail("speculative decoding: drafted token ", id, " is outside the vocabulary of ", n_vocab);
  if (d.parents.empty()) return;
  if (d.parents.size() != n) fail("speculative decoding: the drafter gave ", d.parents.size(), " parents for ", n, " tokens");
  if (!d.q.empty()) fail("speculative decoding: a token tree with draft distributions is not verified (trees are deterministic)");
  for (size_t t = 0; t < n; ++t) {
    const int parent = d.parents[t];
    if (parent < -1 || parent >= static_cast<int>(t))
      fail("speculative decoding: drafted token ", t, " has parent ", parent, " (parents come first, -1 for the root's children)");
    for (size_t u = 0; u < t; ++u)
      if (d.parents[u] == parent && d.tokens[u] == d.tokens[t])
        fail("speculative decoding: drafted tokens ", u, " and ", t, " are the same token under one parent");
  }
}

// Runs [current, drafts...] as pending tokens in one forward (a chain, or the drafter's tree) and
// verifies from the current token down: at each node the children are tried in draft order, each
// against the distribution left after the ones before it were rejected (for one-hot drafts the
// residual is p without the rejected token, so the node's outcome is distributed as p whatever the
// number of children), with the accepted drafts before it in the history (penalties see them). `out`
// gets the accepted drafts, then the target's own token: drawn from what is left at the first node where
// no child is kept, or one more from a leaf's row. sc.path ends as the batch indices of the current token
// and the accepted drafts. Every pending token stays pending: the caller keeps the ones it uses.
void verify_drafts(Sequence& session, Sampler& sampler, int32_t current, SpecScratch& sc, int32_t n_text,
                   std::vector<int32_t>& history, std::vector<int32_t>& out) {
  const Draft& d = sc.draft;
  const int k = static_cast<int>(d.tokens.size());
  // A backend verifies a tree in which each token's parent is the token before it (a block drafter's tree
  // of one candidate per position) as a chain (TokenTree::is_chain).
  const bool tree = !d.parents.empty();
  const int32_t n_vocab = static_cast<int32_t>(session.model().config().n_vocab);
  sc.batch.assign(1, current);
  sc.batch.insert(sc.batch.end(), d.tokens.begin(), d.tokens.end());
  sc.children.resize(static_cast<size_t>(k + 1));
  for (auto& c : sc.children) c.clear();
  sc.parents.assign(1, -1);
  for (int t = 0; t < k; ++t) {
    const int parent = tree ? d.parents[static_cast<size_t>(t)] + 1 : t;
    sc.parents.push_back(parent);
    sc.children[static_cast<size_t>(parent)].push_back(t + 1);
  }
  auto t0 = std::chrono::steady_clock::now();
  if (d.q.empty() && sampler.plain_greedy()) {
    // Greedy: from the current token down, the child equal to the node's pick is kept, and where none
    // is, the pick is the target's own token: what the distributions below give (one-hot at the pick,
    // the same after any other token's rejection), without the logits.
    sc.picks.resize(static_cast<size_t>(k + 1));
    session.forward_pending_picks(sc.batch.data(), k + 1, tree ? sc.parents.data() : nullptr, n_text, sc.picks.data());
    g_spec_profile.add(kVerifyForward, t0);
    sc.path.assign(1, 0);
    for (int node = 0;;) {
      const int32_t pick = sc.picks[static_cast<size_t>(node)];
      out.push_back(pick);
      int kept = -1;
      for (const int c : sc.children[static_cast<size_t>(node)])
        if (sc.batch[static_cast<size_t>(c)] == pick) kept = c;  // children are distinct tokens
      if (kept < 0) break;
      sc.path.push_back(kept);
      node = kept;
    }
    return;
  }
  sc.logits.resize(static_cast<size_t>(k + 1) * static_cast<size_t>(n_vocab));
  session.forward_pending(sc.batch.data(), k + 1, tree ? sc.parents.data() : nullptr, sc.logits.data());
  g_spec_profile.add(kVerifyForward, t0);
  t0 = std::chrono::steady_clock::now();
  const size_t history_size = history.size();
  sc.path.assign(1, 0);
  for (int node = 0;;) {
    float* row = sc.logits.data() + static_cast<size_t>(node) * static_cast<size_t>(n_vocab);
    ban_ids_from(row, n_text, n_vocab);
    sampler.distribution(row, n_vocab, history, sc.p);
    const std::vector<int>& kids = sc.children[static_cast<size_t>(node)];
    int kept = -1;
    for (const int c : kids) {
      const TokenDistribution* q = d.q.empty() ? nullptr : &d.q[static_cast<size_t>(c - 1)];
      const int32_t x = sc.batch[static_cast<size_t>(c)];
      if (draft_kept(sampler, sc.p, x, q)) {
        kept = c;
        break;
      }
      residual_distribution(sc.p, x, q, sc.residual);
      std::swap(sc.p, sc.residual);
    }
    if (kept < 0) {  // every child rejected, or a leaf: the target's own token from what is left
      out.push_back(sampler.draw(sc.p));
      break;
    }
    out.push_back(sc.batch[static_cast<size_t>(kept)]);
    history.push_back(sc.batch[static_cast<size_t>(kept)]);
    sc.path.push_back(kept);
    node = kept;
  }
  history.resize(history_size);
  g_spec_profile.add(kVerifyPick, t0);
}

}  // namespace

// ---- the loop ---------------------------------------------------------------------------------

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

GenerationResult generate(Sequence& session, const Tokenizer& tokenizer, Sampler& sampler,
                          const std::vector<int32_t>& prompt, const GenerationParams& params,
                          const PieceCallback& on_piece) {
  const auto start = Clock::now();
  if (params.max_new_tokens < 0) fail("max new tokens must be >= 0, got ", params.max_new_tokens);
  if (prompt.empty()) fail("the prompt is empty: generation needs at least one prompt token");
  const int64_t needed = static_cast<int64_t>(session.n_past()) + static_cast<int64_t>(prompt.size());
  if (needed > session.max_ctx())
    fail("prompt of ", needed, " tokens exceeds the context of ", session.max_ctx());

  GenerationResult r;
  auto cancelled = [&] { return params.cancel != nullptr && params.cancel->load(std::memory_order_relaxed); };
  if (cancelled()) {
    r.stop_reason = StopReason::Cancelled;
    return r;
  }

  const int32_t n_vocab = static_cast<int32_t>(session.model().config().n_vocab);
  // Embedding rows beyond the tokenizer's vocabulary (padding) have no text: never sample them.
  const int32_t n_text = std::min(n_vocab, tokenizer.n_vocab());
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  std::vector<int32_t> history = prompt;
  StreamingDetokenizer detok(tokenizer, params.skip_special);
  StopStringFilter filter(params.stop_strings);
  bool emitting = true;  // false once the callback asked to stop
  size_t healed_to_skip = params.healed_prefix.size();  // prompt bytes the first token repeats
  auto drop_healed = [&](std::string text) {
    const size_t n = std::min(healed_to_skip, text.size());
    healed_to_skip -= n;
    return text.substr(n);
  };
  auto emit = [&](const std::string& text) {
    if (text.empty() || !emitting) return;
    r.text += text;
    if (on_piece && !on_piece(text)) emitting = false;
  };

  Drafter* drafter = params.spec.drafter;
  if (drafter) {
    validate_speculative_params(params.spec);
    if (sampler.constrained()) {
      r.stats.spec_off = "a token constraint (grammar) is set";
      drafter = nullptr;
    } else {
      r.stats.drafter = drafter->name();
    }
  }
  SpecScratch spec;
  std::vector<int32_t> drafter_history;  // preceding tokens + history, when a drafter runs
  if (drafter) {
    drafter->attach(session);
    if (params.spec.preceding) drafter_history = *params.spec.preceding;
    drafter_history.insert(drafter_history.end(), prompt.begin(), prompt.end());
  }

  const auto prefill_start = Clock::now();
  session.forward(prompt.data(), static_cast<int>(prompt.size()), logits.data(), false);
  r.stats.prefill_seconds = seconds_since(prefill_start);
  r.stats.prompt_tokens = static_cast<int>(prompt.size());

  r.stop_reason = StopReason::MaxTokens;
  Clock::time_point decode_start{};
  std::vector<int32_t> step;  // the tokens one pass produced, in order
  while (static_cast<int>(r.tokens.size()) < params.max_new_tokens) {
    bool verified = false;  // step came from a verification: its tokens are pending in the session
    step.clear();
    if (!r.tokens.empty()) {
      if (cancelled()) {
        r.stop_reason = StopReason::Cancelled;
        break;
      }
      if (session.n_past() >= session.max_ctx()) {
        r.stop_reason = StopReason::ContextFull;
        break;
      }
      // Drafts fit where their verification's output still fits: the context after the current token,
      // and the tokens left to generate after the one the pass produces anyway.
      const int room = std::min({params.spec.draft_max, session.max_ctx() - session.n_past() - 1,
                                 params.max_new_tokens - static_cast<int>(r.tokens.size()) - 1});
      if (drafter && room >= std::max(1, params.spec.draft_min)) {
        const auto t0 = Clock::now();
        drafter->propose(drafter_history, room, spec.draft);
        g_spec_profile.add(kPropose, t0);
        check_draft(spec.draft, room, n_vocab);
        if (!spec.draft.tokens.empty() && static_cast<int>(spec.draft.tokens.size()) >= params.spec.draft_min) {
          verify_drafts(session, sampler, r.tokens.back(), spec, n_text, history, step);
          verified = true;
          ++r.stats.spec_steps;
          r.stats.drafted_tokens += static_cast<int>(spec.draft.tokens.size());
          r.stats.accepted_tokens += static_cast<int>(step.size()) - 1;
        }
      }
      // Otherwise decode and pick in one call: a GPU session picks greedy tokens on the device.
      if (!verified) {
        const auto t0 = Clock::now();
        step.push_back(session.decode_and_pick(r.tokens.back(), sampler, history, n_text, logits));
        g_spec_profile.add(kPlainStep, t0);
      }
      ++r.stats.decode_steps;
    } else {
      ban_ids_from(logits.data(), n_text, n_vocab);
      if (!params.healed_prefix.empty()) constrain_to_prefix(tokenizer, params.healed_prefix, logits.data(), n_text);
      step.push_back(sampler.sample(logits.data(), n_vocab, history));
      r.stats.ttft_seconds = seconds_since(start);
      decode_start = Clock::now();
    }

    // The step's tokens in order, as if each came from a pass of its own: the first that ends the
    // generation drops the rest, and the session keeps the current token and the drafts before it.
    const bool first = r.tokens.empty();
    int used = 0;
    bool stop = false;
    try {
      for (const int32_t id : step) {
        ++used;
        r.tokens.push_back(id);
        history.push_back(id);
        if (drafter) drafter_history.push_back(id);
        if (tokenizer.is_end_of_generation(id)) {
          r.stop_reason = StopReason::EndOfGeneration;
          stop = true;
          break;
        }
        emit(filter.push(drop_healed(detok.push(id))));
        if (!emitting) {
          r.stop_reason = StopReason::Cancelled;
          stop = true;
          break;
        }
        if (filter.stopped()) {
          r.stop_reason = StopReason::StopString;
          r.stop_string = filter.matched();
          stop = true;
          break;
        }
      }
    } catch (...) {
      if (verified) session.keep(spec.path.data(), used);
      throw;
    }
    if (verified) {
      const auto t0 = Clock::now();
      session.keep(spec.path.data(), used);
      g_spec_profile.add(kKeep, t0);
    }
    if (!first) {
      r.tokens_in_session += verified ? used : 1;
      r.stats.decode_tokens += used;  // a verified step's tokens after the stop were never produced
    }
    if (stop) break;
  }
  if (!r.tokens.empty()) r.stats.decode_seconds = r.stats.decode_steps > 0 ? seconds_since(decode_start) : 0.0;
  r.stats.generated_tokens = static_cast<int>(r.tokens.size());

  // What the detokenizer and the stop filter still hold is finished text now (an unfinished UTF-8
  // character at the very end is passed through as its raw bytes).
  if (emitting && !filter.stopped()) {
    std::string tail = filter.push(drop_healed(detok.flush()));
    if (filter.stopped()) {
      r.stop_reason = StopReason::StopString;
      r.stop_string = filter.matched();
    } else {
      tail += filter.flush();
    }
    emit(tail);
  }
  return r;
}

}  // namespace strata
