// The learning part of hybrid mode's VRAM expert cache (issue 20): beyond the pinned hot experts that
// the placement gives each layer, a few cache slots per layer that hold recently or frequently picked
// cold experts. This class is the host-side state machine only: which expert each cache slot holds,
// which copies to start and which slot-map entries to write. The GPU side (cuda/hybrid_moe.cpp) feeds it
// the picks it observed, tells it when copies finished, and applies what between_steps() returns.
//
// The protocol keeps a decode step's view of the slot map fixed:
//   - between two steps, between_steps() returns the slot-map writes (mappings of finished copies, and
//     the unmapping of each slot a new copy is about to overwrite) and the copies to start; the caller
//     writes the map in stream order before the next step and starts the copies only after that;
//   - a slot is mapped only after copy_done() said its bytes arrived, and only in a later between_steps();
//   - a slot being filled is never chosen as a victim, so one copy per slot is in flight at most.
// Pure C++ over plain numbers (tests/test_expert_cache.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

enum class ExpertCachePolicy {
  Lru,  // evicts the expert picked longest ago; admits a miss when the victim was picked earlier
  Lfu,  // evicts the smallest aged pick count (halved every lfu_half_life steps); admits a miss only
        // when its aged count beats the victim's by admit_margin
};

// "lru" / "lfu"; fails naming the flag and the choices.
ExpertCachePolicy parse_expert_cache_policy(const std::string& name);
const char* expert_cache_policy_name(ExpertCachePolicy p);

// Cache slots each layer gets for `requested` slots per layer: min(requested, the layer's cold experts);
// 0 for a layer without routed experts (an empty pinned row). pinned: [layer][expert] -> pinned slot or
// -1 (the placement's slot map).
std::vector<int> expert_cache_slots_per_layer(const std::vector<std::vector<int>>& pinned, int requested);

struct ExpertCacheConfig {
  std::vector<std::vector<int>> pinned;  // [layer][expert] -> pinned slot 0..n_pinned-1, or -1 (cold)
  int slots_per_layer = 0;               // requested; capped per layer (expert_cache_slots_per_layer)
  ExpertCachePolicy policy = ExpertCachePolicy::Lfu;
  std::vector<uint64_t> expert_bytes;    // [layer]: bytes one expert's copy moves (0 for a dense layer)
  double lfu_half_life = 16.0;           // steps (observe() calls) over which an LFU count halves
  // A miss becomes a candidate for admission while its last pick is at most this many steps old.
  int candidate_window = 8;
  // A miss displaces a resident expert only when its score beats the victim's by this much (LFU: aged
  // picks), so near-ties do not trade places every step: each copy moves an expert's bytes through
  // host memory and PCIe, and one extra expected pick barely repays that. Two picks: measured against
  // one and three under both bench routings (docs/PERF.md).
  double admit_margin = 2.0;
};

class ExpertCache {
 public:
  // An entry of the device slot map: layer's expert now reads `slot` (-1: computed on the CPU).
  struct SlotWrite {
    int layer, expert, slot;
  };
  // Bytes of `expert` to copy into cache slot `slot` of `layer`.
  struct Copy {
    int layer, expert, slot;
    uint64_t bytes;
  };
  struct StepPlan {
    std::vector<SlotWrite> writes;  // apply before the next step, in this order
    std::vector<Copy> copies;       // start once the writes are ordered after the last step
  };
  struct Stats {
    uint64_t copies = 0, bytes = 0, evictions = 0, steps = 0;
  };

  // Fails on an inconsistent config (pinned slots not 0..n-1 in ascending id, a bytes row of another
  // length, a negative slot count).
  explicit ExpertCache(ExpertCacheConfig config);

  int n_layer() const { return static_cast<int>(map_.size()); }
  int cache_slots(int layer) const { return static_cast<int>(slots_[static_cast<size_t>(layer)].size()); }
  int total_cache_slots() const;
  // The first cache slot of a layer (its pinned count): cache slots are n_pinned .. n_pinned+slots-1.
  int pinned(int layer) const { return n_pinned_[static_cast<size_t>(layer)]; }
  // The slot map as the next step reads it (pinned + mapped cache slots), and its resident count.
  const std::vector<int>& slot_map(int layer) const { return map_[static_cast<size_t>(layer)]; }
  int resident(int layer) const { return n_resident_[static_cast<size_t>(layer)]; }
  const Stats& stats() const { return stats_; }
  ExpertCachePolicy policy() const { return cfg_.policy; }

  // One step's picks: [n_layer x n_expert] (row length of the widest layer) picks per expert since the
  // last call; advances the cache's clock by one step.
  void observe(const std::vector<uint64_t>& picks, int n_expert);
  // The copy into (layer, slot) finished; the expert is mapped at the next between_steps().
  void copy_done(int layer, int slot);
  // Between two steps: see the header comment. budget_bytes bounds the bytes of the copies started
  // (0: none); the writes of finished copies are returned regardless.
  StepPlan between_steps(uint64_t budget_bytes);

 private:
  enum class SlotState { Free, Loading, Loaded, Mapped };
  struct Slot {
    SlotState state = SlotState::Free;
    int expert = -1;
  };
  struct Use {
    int64_t last = -1;     // step of the last pick (-1: never)
    double freq = 0.0;     // LFU count, aged to step `aged`
    int64_t aged = 0;
    int64_t missed = -1;   // step of the last pick while not resident (-1: none)
  };
  double score(const Use& u) const;  // higher: more worth keeping
  double aged_freq(const Use& u) const;
  Use& use(int layer, int expert) { return use_[static_cast<size_t>(layer)][static_cast<size_t>(expert)]; }

  ExpertCacheConfig cfg_;
  std::vector<std::vector<int>> map_;
  std::vector<int> n_pinned_, n_resident_;
  std::vector<std::vector<Slot>> slots_;
  std::vector<std::vector<Use>> use_;
  int64_t now_ = 0;
  Stats stats_;
};

}  // namespace strata
