// One generation request on its way through the scheduler: the prompt and parameters going in, the
// text coming out (handed from the slot's worker thread to the HTTP thread that streams or collects
// it), a cancellation flag either side can set, and the outcome.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "strata/engine/generate.h"
#include "strata/serve/requests.h"

namespace strata::serve {

struct JobOutcome {
  enum class Kind { Finished, Cancelled, Rejected, Failed };
  Kind kind = Kind::Finished;
  StopReason stop_reason = StopReason::MaxTokens;
  int prompt_tokens = 0;      // the whole prompt, cached part included
  int cached_tokens = 0;      // prompt tokens the slot already held (prefix reuse)
  int completion_tokens = 0;  // tokens sampled, an end-of-turn token included
  std::string error;          // Failed / Rejected: why
  std::string stop_string;    // StopString: the stop string that ended it
  // Speculative decoding: the drafter that ran ("" when the request did not speculate), the tokens it
  // drafted and of those the ones verification accepted.
  std::string drafter;
  int drafted_tokens = 0;
  int accepted_tokens = 0;
};

class Job {
 public:
  Job(std::vector<int32_t> prompt, RequestParams params) : prompt_(std::move(prompt)), params_(std::move(params)) {}

  const std::vector<int32_t>& prompt() const { return prompt_; }
  const RequestParams& params() const { return params_; }

  // Worker side.
  void push_text(std::string_view text);
  void finish(JobOutcome outcome);

  // HTTP side: waits up to `timeout` for text or the end. Appends the text produced since the last
  // call to `text`; returns true once the job has finished and all its text was taken.
  bool take(std::string& text, std::chrono::milliseconds timeout);
  // Valid once take() returned true.
  const JobOutcome& outcome() const { return outcome_; }

  void cancel() { cancel_.store(true); }
  bool cancelled() const { return cancel_.load(); }
  const std::atomic<bool>& cancel_flag() const { return cancel_; }

 private:
  const std::vector<int32_t> prompt_;
  const RequestParams params_;
  std::atomic<bool> cancel_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string pending_;
  bool finished_ = false;
  JobOutcome outcome_;
};

}  // namespace strata::serve
