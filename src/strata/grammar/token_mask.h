// Token-level grammar constraint: which vocabulary tokens may come next so that the output stays a
// prefix of something the grammar matches. A trie of the tokens' bytes is walked with the matcher, so
// a prefix the grammar refuses prunes every token starting with it; the allowed set of each matcher
// state is cached (inside a JSON string most steps return to the same state).
//
// Control tokens are never allowed, except the end-of-generation tokens once the output is a whole
// match: the detokenizer drops control tokens' text, so they could not spell any of the grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/grammar/grammar.h"
#include "strata/sample/sampler.h"
#include "strata/text/tokenizer.h"

namespace strata::grammar {

// The tokenizer's non-control tokens by their bytes. Built once per tokenizer, shared by requests.
class TokenTrie {
 public:
  explicit TokenTrie(const Tokenizer& tokenizer);

  struct Edge {
    uint8_t byte;
    uint32_t child;
  };
  struct Node {
    uint32_t first_edge = 0, n_edges = 0;    // into edges()
    uint32_t first_token = 0, n_tokens = 0;  // into tokens(): the ids whose bytes end here
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  int32_t n_vocab() const { return n_vocab_; }
  const std::string& text(int32_t id) const { return texts_[static_cast<size_t>(id)]; }  // "" for control tokens
  size_t max_depth() const { return max_depth_; }

 private:
  std::vector<Node> nodes_;  // nodes_[0] is the root (the empty prefix)
  std::vector<Edge> edges_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> end_ids_;
  std::vector<std::string> texts_;
  int32_t n_vocab_ = 0;
  size_t max_depth_ = 0;
};

class GrammarConstraint : public TokenConstraint {
 public:
  // The grammar must be finished (Grammar::finish) and outlive nothing: it is shared.
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie);

  // -inf on every token not allowed now. Throws strata::Error when no token is (which a grammar
  // over bytes with a byte-level vocabulary does not produce).
  void mask(float* logits, int32_t n_vocab) override;
  // Reads the token's bytes; throws strata::Error when the grammar refuses them.
  void accept(int32_t id) override;

  // The allowed tokens now, one bit per id (the cached set).
  const std::vector<uint64_t>& allowed();
  bool allows(int32_t id) { return (allowed()[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; }
  bool matched() { return matcher_.accepting(); }  // the output so far is a whole match
  bool ended() const { return ended_; }             // an end-of-generation token was accepted

 private:
  void walk(uint32_t node, size_t depth, std::vector<uint64_t>& bits);

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  Matcher matcher_;
  std::vector<MatchState> levels_;  // the matcher state at each trie depth of the walk
  std::unordered_map<std::string, std::vector<uint64_t>> cache_;
  const std::vector<uint64_t>* current_ = nullptr;  // cache entry of the current state
  bool ended_ = false;
};

}  // namespace strata::grammar
