// The prompt cache: states of sequences of one model kept in host memory, so a request whose prompt
// begins with tokens seen before (the next turn of a conversation, the same system prompt, the same
// prompt again) starts from the longest such prefix instead of position 0, whichever sequence ran it.
//
// Recurrent (DeltaNet) state and sliding-window rings cannot be cut back to an earlier position, so
// the cache keeps snapshots at chosen positions: every `block` tokens of a prefill, one token before
// the end of each prompt (an identical prompt still runs its last token for logits) and wherever the
// caller stores (the end of a request). Snapshots form a tree of token spans: each keeps only the
// attention rows of its own span plus the non-truncatable state at its end, so a long conversation
// costs about one copy of its KV cache. Memory is bounded; the least recently used leaves go first.
// Thread-safe: one cache serves all the slots of a server.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "strata/engine/sequence.h"
#include "strata/engine/state_span.h"

namespace strata {

class PromptCache {
 public:
  static constexpr int kDefaultBlock = 256;
  // max_bytes: the most memory the snapshots may take (> 0). block: tokens between the snapshots a
  // prefill stores (> 0).
  explicit PromptCache(size_t max_bytes, int block = kDefaultBlock);
  ~PromptCache();
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  // Length of the longest cached prefix of tokens[0, limit) (0: none).
  int match(const std::vector<int32_t>& tokens, int limit) const;
  // Replaces seq's state by the longest cached prefix of tokens[0, limit) and returns its length;
  // 0 (seq untouched) when none is cached. Fails like Sequence::restore_spans.
  int restore(Sequence& seq, const std::vector<int32_t>& tokens, int limit);
  // Keeps seq's state; seq holds tokens[0, seq.n_past()) (tokens may go on). Does nothing for an empty
  // sequence or a state already kept, and drops the least recently used snapshots to stay in bounds
  // (a snapshot larger than the whole bound is not kept).
  void store(const Sequence& seq, const std::vector<int32_t>& tokens);
  // Runs tokens[seq.n_past(), end) through seq, stopping at each multiple of the block to store a
  // snapshot, then stores the state at `end`. scratch receives the last forward's logits. Stops early
  // (returning false, the sequence at a block boundary) once *cancel is set.
  bool prefill(Sequence& seq, const std::vector<int32_t>& tokens, int end, std::vector<float>& scratch,
               const std::atomic<bool>* cancel = nullptr);

  struct Stats {
    size_t bytes = 0;        // held now
    size_t snapshots = 0;    // held now
    uint64_t evicted = 0;    // snapshots dropped for room since the start
  };
  Stats stats() const;
  size_t max_bytes() const { return max_bytes_; }
  int block() const { return block_; }

 private:
  struct Node;
  // The deepest node whose path spells a prefix of tokens[0, limit) (the root when none).
  const Node* deepest(const std::vector<int32_t>& tokens, int limit) const;
  void evict_locked();

  const size_t max_bytes_;
  const int block_;
  mutable std::mutex mutex_;
  std::unique_ptr<Node> root_;
  size_t bytes_ = 0;
  size_t snapshots_ = 0;
  uint64_t evicted_ = 0;
  uint64_t clock_ = 0;  // last-use stamps
};

}  // namespace strata
