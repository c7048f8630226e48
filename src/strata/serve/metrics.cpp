#include "strata/serve/metrics.h"

#include <sstream>

namespace strata::serve {

void Metrics::count_request(const std::string& route, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++requests_[{route, status}];
}

void Metrics::add_generation(int prefill_tokens, double prefill_seconds, int cached_tokens, int decode_tokens,
                             int decoded_tokens, double decode_seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  prompt_tokens_ += static_cast<uint64_t>(prefill_tokens);
  cached_tokens_ += static_cast<uint64_t>(cached_tokens);
  completion_tokens_ += static_cast<uint64_t>(decode_tokens);
  decoded_tokens_ += static_cast<uint64_t>(decoded_tokens);
  prefill_seconds_ += prefill_seconds;
  decode_seconds_ += decode_seconds;
  if (prefill_seconds > 0) prefill_rate_ = prefill_tokens / prefill_seconds;
  if (decode_seconds > 0) decode_rate_ = decoded_tokens / decode_seconds;
}

namespace {
void metric(std::ostringstream& o, const char* name, const char* type, const char* help) {
  o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}
}  // namespace

std::string Metrics::render(const SchedulerGauges& g, bool ready) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream o;
  o.precision(10);
  metric(o, "strata_ready", "gauge", "1 when the model is loaded and requests are served, 0 while loading.");
  o << "strata_ready " << (ready ? 1 : 0) << '\n';
  metric(o, "strata_http_requests_total", "counter", "HTTP requests answered, by route and status code.");
  for (const auto& [key, n] : requests_) {
    o << "strata_http_requests_total{route=\"" << key.first << "\",code=\"" << key.second << "\"} " << n << '\n';
  }
  metric(o, "strata_prompt_tokens_total", "counter", "Prompt tokens run through the model (prefill), cached prefixes excluded.");
  o << "strata_prompt_tokens_total " << prompt_tokens_ << '\n';
  metric(o, "strata_prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's previous sequence.");
  o << "strata_prompt_tokens_cached_total " << cached_tokens_ << '\n';
  metric(o, "strata_completion_tokens_total", "counter", "Tokens generated (end-of-turn tokens included).");
  o << "strata_completion_tokens_total " << completion_tokens_ << '\n';
  metric(o, "strata_prefill_seconds_total", "counter", "Time spent in prompt forward passes.");
  o << "strata_prefill_seconds_total " << prefill_seconds_ << '\n';
  metric(o, "strata_decode_seconds_total", "counter", "Time spent generating after the first token.");
  o << "strata_decode_seconds_total " << decode_seconds_ << '\n';
  metric(o, "strata_prefill_tokens_per_second", "gauge", "Prefill speed of the last generation.");
  o << "strata_prefill_tokens_per_second " << prefill_rate_ << '\n';
  metric(o, "strata_decode_tokens_per_second", "gauge", "Decode speed (one sequence) of the last generation.");
  o << "strata_decode_tokens_per_second " << decode_rate_ << '\n';
  metric(o, "strata_requests_cancelled_total", "counter", "Generations stopped early because the client went away.");
  o << "strata_requests_cancelled_total " << cancelled_.load() << '\n';
  metric(o, "strata_requests_rejected_total", "counter", "Requests answered 503 because the queue was full or the server was stopping.");
  o << "strata_requests_rejected_total " << rejected_.load() << '\n';
  metric(o, "strata_queue_depth", "gauge", "Requests waiting for a free slot.");
  o << "strata_queue_depth " << g.queue_depth << '\n';
  metric(o, "strata_queue_limit", "gauge", "Most requests that may wait; beyond it the server answers 503.");
  o << "strata_queue_limit " << g.queue_limit << '\n';
  metric(o, "strata_slots_busy", "gauge", "Sequence slots generating now.");
  o << "strata_slots_busy " << g.slots_busy << '\n';
  metric(o, "strata_slots_total", "gauge", "Sequence slots (concurrent sequences).");
  o << "strata_slots_total " << g.slots_total << '\n';
  metric(o, "strata_vram_bytes", "gauge",
         "Device memory in use per tier. This build has no GPU backend, so no samples are reported.");
  return o.str();
}

}  // namespace strata::serve
