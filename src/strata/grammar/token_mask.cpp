#include "strata/grammar/token_mask.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "strata/base/error.h"

namespace strata::grammar {

namespace {
// Cached allowed-token sets per request (each is n_vocab bits): bounded memory, cleared when full.
constexpr size_t kMaxCachedStates = 512;
}  // namespace

TokenTrie::TokenTrie(const Tokenizer& tokenizer) : n_vocab_(tokenizer.n_vocab()) {
  texts_.resize(static_cast<size_t>(n_vocab_));
  // Build with maps, then lay the nodes out flat (edges of a node contiguous, sorted by byte).
  struct Building {
    std::map<uint8_t, uint32_t> next;
    std::vector<int32_t> ids;
  };
  std::vector<Building> b(1);
  for (int32_t id = 0; id < n_vocab_; ++id) {
    if (tokenizer.is_end_of_generation(id)) end_ids_.push_back(id);
    if (tokenizer.is_special(id)) continue;
    const std::string& text = tokenizer.token_text(id);
    texts_[static_cast<size_t>(id)] = text;
    if (text.empty()) continue;  // unused padding rows
    max_depth_ = std::max(max_depth_, text.size());
    uint32_t at = 0;
    for (unsigned char c : text) {
      auto it = b[at].next.find(c);
      if (it == b[at].next.end()) {
        b.push_back(Building{});
        it = b[at].next.emplace(c, static_cast<uint32_t>(b.size() - 1)).first;
      }
      at = it->second;
    }
    b[at].ids.push_back(id);
  }
  nodes_.resize(b.size());
  for (size_t i = 0; i < b.size(); ++i) {
    Node& n = nodes_[i];
    n.first_edge = static_cast<uint32_t>(edges_.size());
    n.n_edges = static_cast<uint32_t>(b[i].next.size());
    for (const auto& [c, child] : b[i].next) edges_.push_back(Edge{c, child});
    n.first_token = static_cast<uint32_t>(tokens_.size());
    n.n_tokens = static_cast<uint32_t>(b[i].ids.size());
    tokens_.insert(tokens_.end(), b[i].ids.begin(), b[i].ids.end());
  }
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie)
    : grammar_(std::move(grammar)), trie_(std::move(trie)), matcher_(*grammar_) {
  levels_.resize(trie_->max_depth() + 1);
}

void GrammarConstraint::walk(uint32_t node, size_t depth, std::vector<uint64_t>& bits) {
  const TokenTrie::Node& n = trie_->nodes()[node];
  for (uint32_t e = n.first_edge; e < n.first_edge + n.n_edges; ++e) {
    const TokenTrie::Edge& edge = trie_->edges()[e];
    MatchState& next = levels_[depth + 1];
    matcher_.step(levels_[depth], edge.byte, next);
    if (next.dead()) continue;
    const TokenTrie::Node& c = trie_->nodes()[edge.child];
    for (uint32_t t = c.first_token; t < c.first_token + c.n_tokens; ++t) {
      const int32_t id = trie_->tokens()[t];
      bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    }
    if (c.n_edges > 0) walk(edge.child, depth + 1, bits);
  }
}

const std::vector<uint64_t>& GrammarConstraint::allowed() {
  if (current_) return *current_;
  std::string key = matcher_.state().key();
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    if (cache_.size() >= kMaxCachedStates) cache_.clear();
    std::vector<uint64_t> bits((static_cast<size_t>(trie_->n_vocab()) + 63) / 64, 0);
    levels_[0] = matcher_.state();
    walk(0, 0, bits);
    if (matcher_.accepting())
      for (int32_t id : trie_->end_ids()) bits[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
    it = cache_.emplace(std::move(key), std::move(bits)).first;
  }
  current_ = &it->second;
  return *current_;
}

void GrammarConstraint::mask(float* logits, int32_t n_vocab) {
  const std::vector<uint64_t>& bits = allowed();
  const int32_t known = std::min(n_vocab, trie_->n_vocab());
  bool any = false;
  for (int32_t id = 0; id < known; ++id) {
    if ((bits[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1) any = true;
    else logits[id] = -INFINITY;
  }
  for (int32_t id = known; id < n_vocab; ++id) logits[id] = -INFINITY;
  if (!any) fail("structured output: no token can continue the output within the grammar");
}

void GrammarConstraint::accept(int32_t id) {
  if (ended_) fail("structured output: a token after the end of generation");
  if (id < 0 || id >= trie_->n_vocab() || !allows(id)) fail("structured output: token ", id, " is not allowed by the grammar here");
  if (std::find(trie_->end_ids().begin(), trie_->end_ids().end(), id) != trie_->end_ids().end()) {
    ended_ = true;
    return;
  }
  if (!matcher_.advance(trie_->text(id))) fail("structured output: the grammar refuses token ", id);
  current_ = nullptr;
}

}  // namespace strata::grammar
