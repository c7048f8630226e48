#include "strata/serve/expert_stats.h"

#include <sstream>
#include <utility>

#include "strata/base/error.h"

namespace strata::serve {

const char* expert_home_name(ExpertHome h) {
  switch (h) {
    case ExpertHome::Gpu: return "gpu";
    case ExpertHome::Cache: return "cache";
    case ExpertHome::Cpu: return "cpu";
    case ExpertHome::None: return "none";
  }
  return "none";
}

void ExpertStats::reset(int n_layer, int n_expert, int n_expert_used) {
  std::lock_guard<std::mutex> lock(mutex_);
  total_.reset(n_layer, n_expert);
  n_expert_used_ = n_expert_used;
  placement_.reset();
  unavailable_.clear();
  picks_ = cold_picks_ = 0;
  history_.clear();
}

void ExpertStats::set_placement(ExpertPlacement placement) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (placement.home.size() != static_cast<size_t>(total_.n_layer))
    fail("expert placement has ", placement.home.size(), " layers, the model ", total_.n_layer);
  for (auto& row : placement.home) {
    if (row.empty()) row.assign(static_cast<size_t>(total_.n_expert), ExpertHome::None);
    if (row.size() != static_cast<size_t>(total_.n_expert))
      fail("expert placement has a layer of ", row.size(), " experts, the model ", total_.n_expert);
  }
  placement_ = std::move(placement);
  cold_picks_ = cold_picks_locked(total_);
}

void ExpertStats::set_unavailable(std::string why) {
  std::lock_guard<std::mutex> lock(mutex_);
  unavailable_ = std::move(why);
}

uint64_t ExpertStats::cold_picks_locked(const RoutingCounts& c) const {
  if (!placement_) return 0;
  uint64_t cold = 0;
  for (int l = 0; l < c.n_layer; ++l)
    for (int e = 0; e < c.n_expert; ++e)
      if (placement_->home[static_cast<size_t>(l)][static_cast<size_t>(e)] == ExpertHome::Cpu) cold += c.at(l, e);
  return cold;
}

void ExpertStats::trim_locked(Clock::time_point now) {
  while (!history_.empty() && now - history_.front().t > std::chrono::seconds(kWindowSeconds)) history_.pop_front();
}

void ExpertStats::add(const RoutingCounts& delta, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (delta.empty() || delta.n_layer != total_.n_layer || delta.n_expert != total_.n_expert) return;
  total_.merge(delta);
  Sample s;
  s.t = now;
  s.tokens = delta.n_tokens;
  for (uint64_t v : delta.counts) s.picks += v;
  s.cold_picks = cold_picks_locked(delta);
  picks_ += s.picks;
  cold_picks_ += s.cold_picks;
  trim_locked(now);
  // Flushes come every fraction of a second while a request runs: samples of one bucket are folded
  // together so the history stays small however long the server runs.
  if (!history_.empty() && now - history_.back().t < std::chrono::seconds(1)) {
    history_.back().tokens += s.tokens;
    history_.back().picks += s.picks;
    history_.back().cold_picks += s.cold_picks;
  } else {
    history_.push_back(s);
  }
}

OrderedJson ExpertStats::json(const std::string& backend, Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mutex_);
  OrderedJson j;
  j["backend"] = backend;
  j["n_layer"] = total_.n_layer;
  j["n_expert"] = total_.n_expert;
  j["n_expert_used"] = n_expert_used_;
  j["counting"] = unavailable_.empty();
  if (!unavailable_.empty()) j["counting_error"] = unavailable_;
  j["tokens"] = total_.n_tokens;
  OrderedJson counts = OrderedJson::array();
  for (int l = 0; l < total_.n_layer; ++l) {
    OrderedJson row = OrderedJson::array();
    for (int e = 0; e < total_.n_expert; ++e) row.push_back(total_.at(l, e));
    counts.push_back(std::move(row));
  }
  j["counts"] = std::move(counts);
  if (placement_) {
    OrderedJson rows = OrderedJson::array();
    uint64_t placed[4] = {0, 0, 0, 0};
    for (const auto& row : placement_->home) {
      OrderedJson r = OrderedJson::array();
      for (ExpertHome h : row) {
        r.push_back(h == ExpertHome::None ? OrderedJson(nullptr) : OrderedJson(expert_home_name(h)));
        ++placed[static_cast<int>(h)];
      }
      rows.push_back(std::move(r));
    }
    j["placement"] = std::move(rows);
    j["placed"] = {{"gpu", placed[static_cast<int>(ExpertHome::Gpu)]},
                   {"cache", placed[static_cast<int>(ExpertHome::Cache)]},
                   {"cpu", placed[static_cast<int>(ExpertHome::Cpu)]}};
    j["receipt"] = placement_->receipt;
    j["cold_hit_rate"] = picks_ > 0 ? static_cast<double>(cold_picks_) / static_cast<double>(picks_) : 0.0;
  } else {
    j["placement"] = nullptr;
    j["placed"] = nullptr;
    j["receipt"] = nullptr;
    j["cold_hit_rate"] = nullptr;
  }
  // The last minutes in fixed buckets, oldest first: tokens through the model per second and the
  // share of picks that went to the CPU.
  const int n_buckets = kWindowSeconds / kBucketSeconds;
  std::vector<Sample> buckets(static_cast<size_t>(n_buckets));
  for (const Sample& s : history_) {
    const auto age = std::chrono::duration_cast<std::chrono::seconds>(now - s.t).count();
    if (age < 0 || age >= kWindowSeconds) continue;
    Sample& b = buckets[static_cast<size_t>(n_buckets - 1 - age / kBucketSeconds)];
    b.tokens += s.tokens;
    b.picks += s.picks;
    b.cold_picks += s.cold_picks;
  }
  OrderedJson h;
  h["bucket_seconds"] = kBucketSeconds;
  OrderedJson tps = OrderedJson::array(), cold = OrderedJson::array();
  for (const Sample& b : buckets) {
    tps.push_back(static_cast<double>(b.tokens) / kBucketSeconds);
    if (placement_ && b.picks > 0)
      cold.push_back(static_cast<double>(b.cold_picks) / static_cast<double>(b.picks));
    else
      cold.push_back(nullptr);
  }
  h["tokens_per_second"] = std::move(tps);
  h["cold_hit_rate"] = std::move(cold);
  j["history"] = std::move(h);
  return j;
}

std::string ExpertStats::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream o;
  o << "# HELP strata_experts_placed Routed experts by where they live: gpu (resident), cache (VRAM pool of "
       "experts fetched on demand), cpu (computed on the CPU). No samples on the CPU backend.\n"
       "# TYPE strata_experts_placed gauge\n";
  if (placement_) {
    uint64_t placed[4] = {0, 0, 0, 0};
    for (const auto& row : placement_->home)
      for (ExpertHome h : row) ++placed[static_cast<int>(h)];
    for (ExpertHome h : {ExpertHome::Gpu, ExpertHome::Cache, ExpertHome::Cpu})
      o << "strata_experts_placed{where=\"" << expert_home_name(h) << "\"} " << placed[static_cast<int>(h)] << '\n';
  }
  o << "# HELP strata_expert_picks_total Routed expert picks counted since the server started.\n"
       "# TYPE strata_expert_picks_total counter\nstrata_expert_picks_total "
    << picks_ << '\n';
  o << "# HELP strata_expert_cold_hit_rate Share of routed expert picks since the server started that were "
       "computed on the CPU (0 on the CPU backend, where no expert is tiered).\n"
       "# TYPE strata_expert_cold_hit_rate gauge\nstrata_expert_cold_hit_rate "
    << (picks_ > 0 ? static_cast<double>(cold_picks_) / static_cast<double>(picks_) : 0.0) << '\n';
  return o.str();
}

}  // namespace strata::serve
