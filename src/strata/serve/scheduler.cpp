#include "strata/serve/scheduler.h"

#include "strata/engine/session.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <optional>

#include "strata/base/error.h"

namespace strata::serve {
namespace {

// How many leading tokens of `prompt` a slot holding `held` can keep: all of `held` when it is a
// prefix of the prompt and leaves at least one prompt token to run (its logits pick the first
// token), else none (the slot starts over).
size_t reusable_prefix(const std::vector<int32_t>& held, const std::vector<int32_t>& prompt) {
  if (held.empty() || held.size() >= prompt.size()) return 0;
  return std::equal(held.begin(), held.end(), prompt.begin()) ? held.size() : 0;
}

// Penalties look at the tokens passed to generate(), which with a reused prefix is only the new
// part; to keep a seeded request's output independent of what the slot held, such requests start over.
bool uses_penalties(const SamplerParams& s) {
  return s.presence_penalty != 0 || s.frequency_penalty != 0 || s.repetition_penalty != 1;
}

// The outcome of a job that never ran.
JobOutcome unserved(JobOutcome::Kind kind, int prompt_tokens, const char* error) {
  JobOutcome o;
  o.kind = kind;
  o.stop_reason = StopReason::Cancelled;
  o.prompt_tokens = prompt_tokens;
  o.error = error;
  return o;
}

}  // namespace

Scheduler::Scheduler(const Model& model, const Tokenizer& tokenizer, SchedulerConfig config, Metrics& metrics)
    : model_(model), tokenizer_(tokenizer), config_(config), metrics_(metrics) {
  if (config_.slots < 1) fail("--slots must be >= 1, got ", config_.slots);
  if (config_.queue_limit < 0) fail("--queue must be >= 0, got ", config_.queue_limit);
  if (config_.ctx < 2) fail("--ctx must be >= 2, got ", config_.ctx);
  slots_.resize(static_cast<size_t>(config_.slots));
  if (config_.make_drafter) validate_speculative_params(config_.spec);
  for (Slot& s : slots_) {
    s.session = config_.make_sequence ? config_.make_sequence(model_, config_.ctx)
                                      : std::unique_ptr<Sequence>(std::make_unique<Session>(model_, config_.ctx));
    if (config_.make_drafter) s.drafter = config_.make_drafter(config_.ctx);
  }
  if (config_.cache_bytes > 0) {
    if (!slots_.front().session->can_save_state())
      fail("the prompt cache (--cache-ram) needs sequences that can save their state, which this backend's cannot; "
           "pass --cache-ram 0");
    cache_ = std::make_unique<PromptCache>(config_.cache_bytes, config_.cache_block);
  }
  if (config_.record_routes) {
    for (Slot& s : slots_) s.session->set_routing_counts(&s.routes);  // fails on a backend that cannot count
    counting_ = true;
  } else if (config_.live_routes) {
    // Only the page's view wants the counts: a backend that cannot count serves without them.
    try {
      for (Slot& s : slots_) s.session->set_routing_counts(&s.routes);
      counting_ = true;
    } catch (const Error& e) {
      for (Slot& s : slots_) s.session->set_routing_counts(nullptr);
      if (config_.counting_unavailable) config_.counting_unavailable(e.what());
    }
  }
  if (config_.trace)
    for (Slot& s : slots_) s.session->set_routing_trace(config_.trace.get(), 0);  // fails on a backend that cannot record
  for (int i = 0; i < config_.slots; ++i) workers_.emplace_back([this, i] { work(i); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exiting_ = true;
    accepting_ = false;
    for (auto& job : queue_) job->finish(unserved(JobOutcome::Kind::Rejected, 0, "the server is shutting down"));
    queue_.clear();
    for (Slot& s : slots_)
      if (s.running) s.running->cancel();
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void Scheduler::drop_cancelled_locked() {
  // Jobs whose clients left while waiting: answer them now so they neither count against the queue
  // limit nor occupy a slot later.
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->cancelled()) {
      metrics_.count_cancelled();
      (*it)->finish(unserved(JobOutcome::Kind::Cancelled, static_cast<int>((*it)->prompt().size()), ""));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

Scheduler::Admission Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!accepting_) return Admission::ShuttingDown;
    drop_cancelled_locked();
    const int free_slots = config_.slots - busy_;
    if (static_cast<int>(queue_.size()) >= config_.queue_limit + std::max(0, free_slots)) return Admission::QueueFull;
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return Admission::Accepted;
}

bool Scheduler::wait_for_slot(const std::shared_ptr<Job>& job, std::chrono::steady_clock::time_point deadline,
                              const std::function<bool()>& client_gone) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    const auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return true;
    if (client_gone && client_gone()) {
      job->cancel();
      drop_cancelled_locked();
      return true;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      queue_.erase(it);
      return false;
    }
    // Woken when a slot takes a job; the short step is for noticing a vanished client.
    cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(200)));
  }
}

void Scheduler::stop_accepting() {
  std::lock_guard<std::mutex> lock(mutex_);
  accepting_ = false;
  for (auto& job : queue_) job->finish(unserved(JobOutcome::Kind::Rejected, 0, "the server is shutting down"));
  queue_.clear();
}

void Scheduler::cancel_running() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Slot& s : slots_)
    if (s.running) s.running->cancel();
}

bool Scheduler::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_ == 0 && queue_.empty();
}

SchedulerGauges Scheduler::gauges() {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_cancelled_locked();
  return {config_.slots, busy_, static_cast<int>(queue_.size()), config_.queue_limit};
}

void Scheduler::work(int index) {
  // Each slot's forward passes use their share of the cores (omp_set_num_threads is per thread).
  omp_set_num_threads(std::max(1, config_.threads_per_slot));
  Slot& slot = slots_[static_cast<size_t>(index)];
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Take the oldest job, unless another idle slot holds a longer prefix of it: then leave it to
      // that slot (it is woken too), so the next turn of a chat lands where its cache is.
      cv_.wait(lock, [&] {
        if (exiting_) return true;
        if (queue_.empty()) return false;
        const auto& prompt = queue_.front()->prompt();
        const size_t mine = reusable_prefix(slot.held, prompt);
        for (const Slot& other : slots_) {
          if (&other == &slot || other.running) continue;
          const size_t theirs = reusable_prefix(other.held, prompt);
          if (theirs > mine || (theirs == mine && &other < &slot && theirs > 0)) return false;
        }
        return true;
      });
      if (exiting_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      slot.running = job;
      ++busy_;
    }
    cv_.notify_all();  // the next queued job may now suit another idle slot
    run(slot, *job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot.running.reset();
      --busy_;
    }
    cv_.notify_all();
  }
}

void Scheduler::run(Slot& slot, Job& job) {
  JobOutcome out;
  out.prompt_tokens = static_cast<int>(job.prompt().size());
  if (job.cancelled()) {
    out.kind = JobOutcome::Kind::Cancelled;
    out.stop_reason = StopReason::Cancelled;
    metrics_.count_cancelled();
    job.finish(out);
    return;
  }
  const RequestParams& p = job.params();
  Sequence& session = *slot.session;
  const std::vector<int32_t>& prompt = job.prompt();
  const int n = static_cast<int>(prompt.size());
  // Penalties look at the tokens passed to generate(): such requests run their whole prompt.
  const bool penalties = uses_penalties(p.sampler);
  size_t reuse = penalties ? 0 : reusable_prefix(slot.held, prompt);
  if (static_cast<size_t>(session.n_past()) != slot.held.size()) reuse = 0;
  if (config_.trace) {
    uint32_t stream = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stream = ++trace_streams_;
    }
    session.set_routing_trace(config_.trace.get(), stream);
  }
  try {
    // The longest start: what the slot holds, or a snapshot in the prompt cache (from any slot) when
    // longer; the prompt's last token always runs, for the first token's logits.
    if (cache_ && !penalties && cache_->match(prompt, n - 1) > static_cast<int>(reuse)) {
      session.reset();
      slot.held.clear();
      reuse = static_cast<size_t>(cache_->restore(session, prompt, n - 1));
    } else if (reuse == 0) {
      session.reset();
      slot.held.clear();
    }
    out.cached_tokens = static_cast<int>(reuse);
    // With the cache on, the prompt but its last token runs here, leaving snapshots on the way.
    int prefilled = 0;
    double prefill_seconds = 0;
    std::vector<int32_t> suffix(prompt.begin() + static_cast<std::ptrdiff_t>(reuse), prompt.end());
    if (cache_ && !penalties) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<float> scratch;
      const bool whole = cache_->prefill(session, prompt, n - 1, scratch, &job.cancel_flag());
      prefilled = session.n_past() - static_cast<int>(reuse);
      prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      suffix.assign(prompt.begin() + session.n_past(), prompt.end());
      if (!whole) {  // the client left during the prompt: the slot keeps what did run
        slot.held.assign(prompt.begin(), prompt.begin() + session.n_past());
        out.kind = JobOutcome::Kind::Cancelled;
        out.stop_reason = StopReason::Cancelled;
        metrics_.count_cancelled();
        metrics_.add_generation(prefilled, prefill_seconds, out.cached_tokens, 0, 0, 0);
        flush_routes(slot, true);
        job.finish(std::move(out));
        return;
      }
    }
    Sampler sampler(p.sampler);
    std::optional<grammar::GrammarConstraint> constraint;
    if (p.grammar) {
      std::call_once(trie_once_, [&] { trie_ = std::make_shared<const grammar::TokenTrie>(tokenizer_); });
      constraint.emplace(p.grammar, trie_);
      sampler.set_constraint(&*constraint);
    }
    GenerationParams gp;
    gp.max_new_tokens = p.max_tokens ? *p.max_tokens : std::numeric_limits<int>::max();
    gp.stop_strings = p.stop;
    gp.cancel = &job.cancel_flag();
    gp.skip_special = true;
    // The drafter sees what the session holds before the suffix too (a chat's earlier turns): a
    // lookup finds more there, and a draft model's sequence follows the same text.
    const std::vector<int32_t> preceding(prompt.begin(), prompt.end() - static_cast<std::ptrdiff_t>(suffix.size()));
    if (slot.drafter && p.speculative.value_or(true)) {
      gp.spec = config_.spec;
      gp.spec.drafter = slot.drafter.get();
      gp.spec.preceding = &preceding;
    }
    const GenerationResult r = generate(session, tokenizer_, sampler, suffix, gp, [&](std::string_view piece) {
      job.push_text(piece);
      flush_routes(slot, false);
      return !job.cancelled();
    });
    slot.held = prompt;
    slot.held.insert(slot.held.end(), r.tokens.begin(), r.tokens.begin() + r.tokens_in_session);
    // The end of the request too: the next turn of this conversation may land on another slot.
    if (cache_) cache_->store(session, slot.held);
    out.stop_reason = r.stop_reason;
    out.stop_string = r.stop_string;
    out.completion_tokens = static_cast<int>(r.tokens.size());
    out.drafter = r.stats.drafter;
    out.drafted_tokens = r.stats.drafted_tokens;
    out.accepted_tokens = r.stats.accepted_tokens;
    out.kind = r.stop_reason == StopReason::Cancelled ? JobOutcome::Kind::Cancelled : JobOutcome::Kind::Finished;
    if (out.kind == JobOutcome::Kind::Cancelled) metrics_.count_cancelled();
    metrics_.add_generation(r.stats.prompt_tokens + prefilled, r.stats.prefill_seconds + prefill_seconds,
                            out.cached_tokens, out.completion_tokens,
                            r.stats.decode_tokens, r.stats.decode_seconds);
  } catch (const std::exception& e) {
    // The session may be half-updated: start the slot over.
    session.reset();
    slot.held.clear();
    out.kind = JobOutcome::Kind::Failed;
    out.error = e.what();
  }
  flush_routes(slot, true);
  if (config_.sequence_metrics) {
    std::string text;
    try {
      text = config_.sequence_metrics(session);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "strata serve: sequence metrics: %s\n", e.what());
    }
    std::lock_guard<std::mutex> lock(mutex_);
    latest_metrics_ = std::move(text);
  }
  job.finish(std::move(out));
}

std::string Scheduler::sequence_metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return latest_metrics_;
}

void Scheduler::flush_routes(Slot& slot, bool request_end) {
  if (!counting_) return;
  // While a request runs the page's view is refreshed a few times a second, not after every token.
  constexpr auto kLiveInterval = std::chrono::milliseconds(500);
  const auto now = std::chrono::steady_clock::now();
  if (!request_end && (!config_.live_routes || now - slot.last_flush < kLiveInterval)) return;
  slot.last_flush = now;
  try {
    slot.session->flush_routing_counts();
    if (config_.live_routes) config_.live_routes(slot.routes);
    if (config_.record_routes) {
      slot.request_routes.merge(slot.routes);
      if (request_end) config_.record_routes(slot.request_routes);
    }
  } catch (const std::exception& e) {
    // The answer is fine; the counts are not: say so on the console without failing the request.
    std::fprintf(stderr, "strata serve: routing counts: %s\n", e.what());
  }
  slot.routes.reset(slot.routes.n_layer, slot.routes.n_expert);
  if (request_end) slot.request_routes.reset(slot.routes.n_layer, slot.routes.n_expert);
}

}  // namespace strata::serve
