#include "strata/serve/job.h"

namespace strata::serve {

void Job::push_text(std::string_view text) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.append(text);
  }
  cv_.notify_all();
}

void Job::finish(JobOutcome outcome) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    outcome_ = std::move(outcome);
    finished_ = true;
  }
  cv_.notify_all();
}

bool Job::take(std::string& text, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !pending_.empty(); });
  text.append(pending_);
  pending_.clear();
  return finished_;
}

}  // namespace strata::serve
