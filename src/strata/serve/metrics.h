// Server counters and gauges, rendered in the Prometheus text exposition format (version 0.0.4).
// Thread-safe: request threads and slot workers update it concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace strata::serve {

struct SchedulerGauges {
  int slots_total = 0;
  int slots_busy = 0;
  int queue_depth = 0;
  int queue_limit = 0;
};

class Metrics {
 public:
  // One finished HTTP request, by route ("/v1/chat/completions", or "other") and status code.
  void count_request(const std::string& route, int status);
  // One generation: prompt tokens run (prefill) and tokens sampled (decode), with their times.
  void add_generation(int prefill_tokens, double prefill_seconds, int cached_tokens, int decode_tokens,
                      int decoded_tokens, double decode_seconds);  // decoded: the tokens decode_seconds timed
  void count_cancelled() { cancelled_.fetch_add(1); }
  void count_rejected() { rejected_.fetch_add(1); }

  std::string render(const SchedulerGauges& gauges, bool ready) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0, decoded_tokens_ = 0;
  double prefill_seconds_ = 0, decode_seconds_ = 0;
  double prefill_rate_ = 0, decode_rate_ = 0;  // the last generation's tokens per second
  std::atomic<uint64_t> cancelled_{0}, rejected_{0};
};

}  // namespace strata::serve
