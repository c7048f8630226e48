#include "strata/cuda/decode_profile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "strata/cuda/cuda_check.h"

namespace strata::cuda {

DecodeProfile::DecodeProfile() {
  const char* env = std::getenv("STRATA_GPU_PROFILE");
  on = env != nullptr && std::strcmp(env, "1") == 0;
  graph_on = env != nullptr && std::strcmp(env, "graph") == 0;
}

void DecodeProfile::mark_graph(const char* what, cudaStream_t s) {
  if (!graph_on) return;
  on = true;
  mark(what, s);
  on = false;
}

void DecodeProfile::mark(const char* what, cudaStream_t s) {
  if (!on) return;
  if (what == nullptr) {  // a step starts
    used_ = 0;
    step_tag_ = tag;
  }
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    check_cuda(cudaEventCreate(&e), "cudaEventCreate(profile)");
    events_.push_back(e);
    names_.push_back(nullptr);
  }
  check_cuda(cudaEventRecord(events_[used_], s), "cudaEventRecord(profile)");
  names_[used_] = what;
  ++used_;
}

void DecodeProfile::collect() {
  if ((!on && !graph_on) || used_ < 2) return;
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), "cudaEventElapsedTime(profile)");
    Total& t = totals_[step_tag_][names_[i] ? names_[i] : "?"];
    t.ms += ms;
    ++t.calls;
  }
  ++steps_[step_tag_];
  used_ = 0;
}

void DecodeProfile::release() {
  for (const auto& [tg, totals] : totals_) {
    const long steps = steps_[tg];
    if (!(on || graph_on) || steps == 0) continue;
    std::vector<std::pair<std::string, Total>> rows(totals.begin(), totals.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double sum = 0;
    for (const auto& r : rows) sum += r.second.ms;
    std::fprintf(stderr, "[gpu-profile] %s%ld steps, %.1f us per step (%s)\n", tg.c_str(), steps, 1e3 * sum / steps,
                 graph_on ? "CUDA graph, device time of whole steps" : "direct launches, events between operations");
    for (const auto& r : rows)
      std::fprintf(stderr, "[gpu-profile] %s%-28s %9.1f us/step %6.1f%% %6.1f calls/step %7.2f us/call\n", tg.c_str(),
                   r.first.c_str(), 1e3 * r.second.ms / steps, 100.0 * r.second.ms / sum,
                   double(r.second.calls) / steps, 1e3 * r.second.ms / r.second.calls);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  events_.clear();
  names_.clear();
  totals_.clear();
  steps_.clear();
  on = false;
  graph_on = false;
}

}  // namespace strata::cuda
