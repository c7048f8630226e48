#include "strata/spec/ngram_drafter.h"

#include <algorithm>

#include "strata/base/error.h"

namespace strata {

void validate_ngram_params(const NgramParams& p) {
  if (p.min_n < 1) fail("--spec-ngram-min must be >= 1, got ", p.min_n);
  if (p.max_n < p.min_n) fail("--spec-ngram-max ", p.max_n, " is below --spec-ngram-min ", p.min_n);
  if (p.max_n > NgramParams::kMaxNgram)
    fail("--spec-ngram-max must be <= ", NgramParams::kMaxNgram, ", got ", p.max_n);
  if (p.branches < 1 || p.branches > NgramParams::kMaxBranches)
    fail("--spec-ngram-branches must be 1..", NgramParams::kMaxBranches, ", got ", p.branches);
}

namespace {

// Up to max_tokens tokens that followed the occurrence of the last n tokens starting at j; past the end
// of the history the continuation copies itself (a repeating pattern goes on repeating).
void continuation(const std::vector<int32_t>& history, int64_t j, int n, int max_tokens, std::vector<int32_t>& out) {
  const int64_t len = static_cast<int64_t>(history.size());
  out.clear();
  for (int64_t p = j + n; static_cast<int>(out.size()) < max_tokens; ++p)
    out.push_back(p < len ? history[static_cast<size_t>(p)] : out[static_cast<size_t>(p - len)]);
}

}  // namespace

NgramDrafter::NgramDrafter(NgramParams params) : params_(params) { validate_ngram_params(params_); }

void NgramDrafter::propose(const std::vector<int32_t>& history, int max_tokens, Draft& out) {
  out.clear();
  const int64_t len = static_cast<int64_t>(history.size());
  std::vector<std::vector<int32_t>> found;  // distinct continuations, best first
  std::vector<int32_t> c;
  for (int n = params_.max_n; n >= params_.min_n && static_cast<int>(found.size()) < params_.branches; --n) {
    if (len <= n) continue;
    const auto suffix = history.end() - n;
    // Most recent first: an occurrence starts at j <= len - n - 1, so a token follows it.
    for (int64_t j = len - n - 1; j >= 0 && static_cast<int>(found.size()) < params_.branches; --j) {
      if (!std::equal(suffix, history.end(), history.begin() + j)) continue;
      continuation(history, j, n, max_tokens, c);
      if (std::find(found.begin(), found.end(), c) == found.end()) found.push_back(c);
    }
  }
  if (found.empty()) return;
  if (found.size() == 1) {  // a chain
    out.tokens = found[0];
    return;
  }
  // A tree: each later continuation may add up to max_tokens / branches nodes, the first takes the rest
  // (it is the longest and most recent match), and continuations sharing a prefix share its nodes. The
  // first continuation's nodes come first among siblings, so verification tries them first.
  const int share = std::max(1, max_tokens / static_cast<int>(found.size()));
  int reserve = 0;
  for (size_t i = 1; i < found.size(); ++i) reserve += std::min(share, static_cast<int>(found[i].size()));
  for (size_t i = 0; i < found.size(); ++i) {
    const int left = max_tokens - static_cast<int>(out.tokens.size());
    int depth_budget = i == 0 ? std::max(1, max_tokens - reserve) : std::min(share, left);
    int parent = -1;
    for (const int32_t t : found[i]) {
      int at = -1;
      for (size_t u = 0; u < out.tokens.size() && at < 0; ++u)
        if (out.parents[u] == parent && out.tokens[u] == t) at = static_cast<int>(u);
      if (at < 0) {
        if (depth_budget == 0 || static_cast<int>(out.tokens.size()) >= max_tokens) break;
        --depth_budget;
        out.tokens.push_back(t);
        out.parents.push_back(parent);
        at = static_cast<int>(out.tokens.size()) - 1;
      }
      parent = at;
    }
  }
}

}  // namespace strata
