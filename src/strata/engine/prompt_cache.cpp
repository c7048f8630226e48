#include "strata/engine/prompt_cache.h"

#include <algorithm>

#include "strata/base/error.h"

namespace strata {

struct PromptCache::Node {
  Node* parent = nullptr;
  int begin = 0, end = 0;
  std::vector<int32_t> tokens;             // the span's tokens, positions [begin, end)
  std::shared_ptr<const StateSpan> state;  // null for the root
  size_t bytes = 0;
  uint64_t used = 0;
  std::vector<std::unique_ptr<Node>> children;
};

PromptCache::PromptCache(size_t max_bytes, int block) : max_bytes_(max_bytes), block_(block), root_(std::make_unique<Node>()) {
  if (max_bytes_ == 0) fail("a prompt cache needs a memory bound above 0");
  if (block_ < 1) fail("a prompt cache's block must be at least 1 token, got ", block_);
}

PromptCache::~PromptCache() = default;

const PromptCache::Node* PromptCache::deepest(const std::vector<int32_t>& tokens, int limit) const {
  limit = std::min(limit, static_cast<int>(tokens.size()));
  const Node* best = root_.get();
  std::vector<const Node*> todo = {root_.get()};
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (n->end > best->end) best = n;
    for (const auto& c : n->children)
      if (c->end <= limit && std::equal(c->tokens.begin(), c->tokens.end(), tokens.begin() + c->begin)) todo.push_back(c.get());
  }
  return best;
}

int PromptCache::match(const std::vector<int32_t>& tokens, int limit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return deepest(tokens, limit)->end;
}

int PromptCache::restore(Sequence& seq, const std::vector<int32_t>& tokens, int limit) {
  std::vector<std::shared_ptr<const StateSpan>> chain;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t now = ++clock_;
    for (const Node* n = deepest(tokens, limit); n->parent; n = n->parent) {
      const_cast<Node*>(n)->used = now;
      chain.push_back(n->state);
    }
  }
  if (chain.empty()) return 0;
  // The spans stay alive through their shared pointers even if evicted meanwhile.
  std::reverse(chain.begin(), chain.end());
  std::vector<const StateSpan*> spans;
  for (const auto& s : chain) spans.push_back(s.get());
  seq.restore_spans(spans.data(), static_cast<int>(spans.size()));
  return chain.back()->end;
}

void PromptCache::store(const Sequence& seq, const std::vector<int32_t>& tokens) {
  const int end = seq.n_past();
  if (end <= 0) return;
  if (static_cast<size_t>(end) > tokens.size()) fail("the prompt cache was given fewer tokens than the sequence holds");
  std::lock_guard<std::mutex> lock(mutex_);
  Node* parent = const_cast<Node*>(deepest(tokens, end));
  const uint64_t now = ++clock_;
  for (Node* n = parent; n; n = n->parent) n->used = now;
  if (parent->end == end) return;
  auto state = std::make_shared<StateSpan>();
  seq.save_span(parent->end, *state);
  auto node = std::make_unique<Node>();
  node->parent = parent;
  node->begin = parent->end;
  node->end = end;
  node->tokens.assign(tokens.begin() + parent->end, tokens.begin() + end);
  node->bytes = sizeof(Node) + state->bytes() + node->tokens.size() * sizeof(int32_t);
  node->used = now;
  if (node->bytes > max_bytes_) return;
  node->state = std::move(state);
  bytes_ += node->bytes;
  ++snapshots_;
  parent->children.push_back(std::move(node));
  evict_locked();
}

void PromptCache::evict_locked() {
  while (bytes_ > max_bytes_) {
    // The least recently used leaf (a node with children is needed by their restores).
    Node* victim = nullptr;
    std::vector<Node*> todo = {root_.get()};
    while (!todo.empty()) {
      Node* n = todo.back();
      todo.pop_back();
      if (n->parent && n->children.empty() && (!victim || n->used < victim->used)) victim = n;
      for (auto& c : n->children) todo.push_back(c.get());
    }
    if (!victim) return;
    bytes_ -= victim->bytes;
    --snapshots_;
    ++evicted_;
    auto& siblings = victim->parent->children;
    siblings.erase(std::find_if(siblings.begin(), siblings.end(), [&](const auto& c) { return c.get() == victim; }));
  }
}

bool PromptCache::prefill(Sequence& seq, const std::vector<int32_t>& tokens, int end, std::vector<float>& scratch,
                          const std::atomic<bool>* cancel) {
  if (end > static_cast<int>(tokens.size()) || end < seq.n_past()) fail("prompt cache prefill past the given tokens");
  scratch.resize(static_cast<size_t>(seq.model().config().n_vocab));
  while (seq.n_past() < end) {
    if (cancel && cancel->load()) return false;
    const int at = seq.n_past();
    const int stop = std::min(end, (at / block_ + 1) * block_);
    seq.forward(tokens.data() + at, stop - at, scratch.data(), false);
    store(seq, tokens);
  }
  return true;
}

PromptCache::Stats PromptCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {bytes_, snapshots_, evicted_};
}

}  // namespace strata
