#include "strata/moe/expert_cache.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "strata/base/error.h"
#include "strata/moe/placement.h"

namespace strata {

ExpertCachePolicy parse_expert_cache_policy(const std::string& name) {
  if (name == "lru") return ExpertCachePolicy::Lru;
  if (name == "lfu") return ExpertCachePolicy::Lfu;
  fail("--expert-cache-policy '", name, "': expected lru or lfu");
}

const char* expert_cache_policy_name(ExpertCachePolicy p) { return p == ExpertCachePolicy::Lru ? "lru" : "lfu"; }

std::vector<int> expert_cache_slots_per_layer(const std::vector<std::vector<int>>& pinned, int requested) {
  if (requested < 0) fail("--expert-cache must be >= 0, got ", requested);
  std::vector<int> out(pinned.size(), 0);
  for (size_t l = 0; l < pinned.size(); ++l) {
    const int cold = static_cast<int>(std::count(pinned[l].begin(), pinned[l].end(), -1));
    out[l] = std::min(requested, cold);
  }
  return out;
}

ExpertCache::ExpertCache(ExpertCacheConfig config) : cfg_(std::move(config)) {
  const size_t nl = cfg_.pinned.size();
  if (cfg_.expert_bytes.size() != nl)
    fail("expert cache: ", cfg_.expert_bytes.size(), " expert sizes for ", nl, " layers");
  if (!(cfg_.lfu_half_life > 0.0)) fail("expert cache: the LFU half-life must be > 0");
  if (!(cfg_.admit_margin >= 0.0)) fail("expert cache: the admission margin must be >= 0");
  const std::vector<int> n_slots = expert_cache_slots_per_layer(cfg_.pinned, cfg_.slots_per_layer);
  map_ = cfg_.pinned;
  n_pinned_.assign(nl, 0);
  slots_.resize(nl);
  use_.resize(nl);
  for (size_t l = 0; l < nl; ++l) {
    n_pinned_[l] = hot_slot_count(map_[l], l);
    slots_[l].resize(static_cast<size_t>(n_slots[l]));
    use_[l].resize(map_[l].size());
  }
  n_resident_ = n_pinned_;
}

int ExpertCache::total_cache_slots() const {
  int n = 0;
  for (const auto& s : slots_) n += static_cast<int>(s.size());
  return n;
}

double ExpertCache::aged_freq(const Use& u) const {
  return u.freq * std::exp2(-static_cast<double>(now_ - u.aged) / cfg_.lfu_half_life);
}

double ExpertCache::score(const Use& u) const {
  return cfg_.policy == ExpertCachePolicy::Lru ? static_cast<double>(u.last) : aged_freq(u);
}

void ExpertCache::observe(const std::vector<uint64_t>& picks, int n_expert) {
  ++now_;
  for (size_t l = 0; l < map_.size(); ++l) {
    if (slots_[l].empty()) continue;  // nothing to learn where nothing can be cached
    for (size_t e = 0; e < map_[l].size(); ++e) {
      const size_t i = l * static_cast<size_t>(n_expert) + e;
      if (i >= picks.size()) fail("expert cache: ", picks.size(), " pick counts, too few for layer ", l);
      const uint64_t p = picks[i];
      if (p == 0) continue;
      Use& u = use_[l][e];
      u.freq = aged_freq(u) + static_cast<double>(p);
      u.aged = now_;
      u.last = now_;
      if (map_[l][e] < 0) u.missed = now_;
    }
  }
}

void ExpertCache::copy_done(int layer, int slot) {
  if (layer < 0 || layer >= n_layer() || slot < n_pinned_[static_cast<size_t>(layer)] ||
      slot >= n_pinned_[static_cast<size_t>(layer)] + cache_slots(layer))
    fail("expert cache: no cache slot ", slot, " in layer ", layer);
  Slot& s = slots_[static_cast<size_t>(layer)][static_cast<size_t>(slot - n_pinned_[static_cast<size_t>(layer)])];
  if (s.state != SlotState::Loading) fail("expert cache: slot ", slot, " of layer ", layer, " has no copy in flight");
  s.state = SlotState::Loaded;
}

ExpertCache::StepPlan ExpertCache::between_steps(uint64_t budget_bytes) {
  StepPlan plan;
  ++stats_.steps;
  // Copies that arrived since the last call become visible to the next step.
  for (size_t l = 0; l < slots_.size(); ++l) {
    for (size_t i = 0; i < slots_[l].size(); ++i) {
      Slot& s = slots_[l][i];
      if (s.state != SlotState::Loaded) continue;
      s.state = SlotState::Mapped;
      const int slot = n_pinned_[l] + static_cast<int>(i);
      map_[l][static_cast<size_t>(s.expert)] = slot;
      ++n_resident_[l];
      plan.writes.push_back({static_cast<int>(l), s.expert, slot});
    }
  }
  if (budget_bytes == 0) return plan;

  // Recent misses not already on their way, most worth caching first (ties: lower layer, lower id).
  struct Candidate {
    double score;
    int layer, expert;
  };
  std::vector<Candidate> cand;
  for (size_t l = 0; l < slots_.size(); ++l) {
    if (slots_[l].empty() || cfg_.expert_bytes[l] == 0) continue;
    for (size_t e = 0; e < map_[l].size(); ++e) {
      const Use& u = use_[l][e];
      if (map_[l][e] >= 0 || u.missed < 0 || now_ - u.missed > cfg_.candidate_window) continue;
      const bool on_its_way = std::any_of(slots_[l].begin(), slots_[l].end(), [e](const Slot& s) {
        return s.expert == static_cast<int>(e) && (s.state == SlotState::Loading || s.state == SlotState::Loaded);
      });
      if (!on_its_way) cand.push_back({score(u), static_cast<int>(l), static_cast<int>(e)});
    }
  }
  std::sort(cand.begin(), cand.end(), [](const Candidate& a, const Candidate& b) {
    return std::tie(b.score, a.layer, a.expert) < std::tie(a.score, b.layer, b.expert);
  });

  for (const Candidate& c : cand) {
    const size_t l = static_cast<size_t>(c.layer);
    const uint64_t bytes = cfg_.expert_bytes[l];
    if (bytes > budget_bytes) continue;
    // A free slot first; else the resident expert least worth keeping (ties: the lowest slot).
    std::vector<Slot>& row = slots_[l];
    int victim = -1;
    for (size_t i = 0; i < row.size() && victim < 0; ++i)
      if (row[i].state == SlotState::Free) victim = static_cast<int>(i);
    if (victim < 0) {
      double worst = 0.0;
      for (size_t i = 0; i < row.size(); ++i) {
        if (row[i].state != SlotState::Mapped) continue;
        const double s = score(use_[l][static_cast<size_t>(row[i].expert)]);
        if (victim < 0 || s < worst) victim = static_cast<int>(i), worst = s;
      }
      // Admission: the miss must be worth more than what it would displace, so two experts picked in
      // the same step do not evict each other in turn (LRU scores are steps: any later pick wins).
      const double margin = cfg_.policy == ExpertCachePolicy::Lfu ? cfg_.admit_margin : 0.0;
      if (victim < 0 || !(c.score > worst + margin)) continue;
    }
    Slot& s = row[static_cast<size_t>(victim)];
    const int slot = n_pinned_[l] + victim;
    if (s.state == SlotState::Mapped) {
      map_[l][static_cast<size_t>(s.expert)] = -1;
      --n_resident_[l];
      plan.writes.push_back({c.layer, s.expert, -1});
      ++stats_.evictions;
    }
    s.state = SlotState::Loading;
    s.expert = c.expert;
    use(c.layer, c.expert).missed = -1;
    plan.copies.push_back({c.layer, c.expert, slot, bytes});
    ++stats_.copies;
    stats_.bytes += bytes;
    budget_bytes -= bytes;
  }
  return plan;
}

}  // namespace strata
