// A fixed number of sequence slots, each a worker thread owning one Sequence (CPU Session or GPU session) (its KV cache and
// recurrent state) over the shared read-only Model, and a bounded queue of jobs waiting for a slot.
// A slot keeps the tokens of its last sequence, so a request that extends it (the next turn of a
// chat) only runs the new tokens; with the prompt cache on, a request also starts from the longest
// prefix any slot stored there, when that is longer than what its own slot holds.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/engine/drafter.h"
#include "strata/engine/generate.h"
#include "strata/engine/model.h"
#include "strata/engine/prompt_cache.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/routing_trace.h"
#include "strata/engine/sequence.h"
#include "strata/grammar/token_mask.h"
#include "strata/serve/job.h"
#include "strata/serve/metrics.h"
#include "strata/text/tokenizer.h"

namespace strata::serve {

struct SchedulerConfig {
  int slots = 1;
  int queue_limit = 4;       // jobs that may wait beyond the busy slots
  int ctx = 4096;            // tokens per slot
  int threads_per_slot = 1;  // OpenMP threads each slot's forward passes use
  // --cache-ram: the most bytes the prompt cache shared by the slots may hold (engine/prompt_cache.h);
  // 0 turns it off. Needs sequences that can save their state (refused otherwise).
  size_t cache_bytes = 0;
  int cache_block = PromptCache::kDefaultBlock;  // tokens between a prefill's snapshots
  // Makes each slot's sequence (default: a CPU Session); serve --gpu passes a GPU one.
  std::function<std::unique_ptr<Sequence>(const Model&, int ctx)> make_sequence;
  // --profile: when set, every slot's sequence counts its routes, and after each request the slot
  // hands what that request counted to this function (from its own worker thread: concurrent calls
  // from several slots must be safe) before the client gets the end of its answer.
  std::function<void(const RoutingCounts&)> record_routes;
  // The web page's live routing view: when set, every slot's sequence counts its routes (on a backend
  // that cannot, the constructor calls counting_unavailable instead and nothing is counted), and what
  // was counted reaches this function after each request and about twice a second while one runs,
  // from the slot's worker thread (concurrent calls must be safe).
  std::function<void(const RoutingCounts&)> live_routes;
  std::function<void(const std::string& why)> counting_unavailable;
  // --collect-routing: when set, every request's kept tokens are appended to this trace, the request's
  // number (1, 2, ... in the order requests start running) as its stream.
  std::shared_ptr<RoutingTraceWriter> trace;
  // When set, called with the slot's sequence after each request (in the worker thread, between
  // forwards); the text it returns (Prometheus lines about the backend the slots share, such as the
  // hybrid MoE's counters) replaces the previous one and is shown on /metrics (sequence_metrics()).
  std::function<std::string(const Sequence&)> sequence_metrics;
  // serve --spec: makes each slot's drafter (its own state; called once per slot, after its sequence);
  // every request speculates with it unless it says "speculative": false. spec: draft lengths (its
  // drafter is the slot's). Empty: no speculation.
  std::function<std::unique_ptr<Drafter>(int ctx)> make_drafter;
  SpeculativeParams spec;
};

class Scheduler {
 public:
  Scheduler(const Model& model, const Tokenizer& tokenizer, SchedulerConfig config, Metrics& metrics);
  ~Scheduler();  // cancels what is left and joins the workers
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admission { Accepted, QueueFull, ShuttingDown };
  Admission submit(std::shared_ptr<Job> job);
  // After an accepted submit: waits until the job has left the queue (a slot took it, or it was
  // answered). Returns false when it was still queued at `deadline`: it is then taken out of the
  // queue, unanswered, for the caller to refuse. client_gone (may be empty) is asked now and then;
  // when it says the client left, the job is cancelled and answered.
  bool wait_for_slot(const std::shared_ptr<Job>& job, std::chrono::steady_clock::time_point deadline,
                     const std::function<bool()>& client_gone);

  // Stops taking jobs; queued ones finish as Rejected. Running ones go on.
  void stop_accepting();
  // Asks every running job to stop.
  void cancel_running();
  bool idle() const;
  SchedulerGauges gauges();  // also drops queued jobs whose clients left
  const SchedulerConfig& config() const { return config_; }
  // The latest SchedulerConfig::sequence_metrics text ("" when not set or before the first request).
  std::string sequence_metrics() const;
  const PromptCache* prompt_cache() const { return cache_.get(); }  // null when off

 private:
  struct Slot {
    std::unique_ptr<Sequence> session;
    std::unique_ptr<Drafter> drafter;  // serve --spec; null without
    std::vector<int32_t> held;  // the tokens the session holds
    std::shared_ptr<Job> running;
    RoutingCounts routes;          // counted since the last flush
    RoutingCounts request_routes;  // flushed since the request began (record_routes)
    std::chrono::steady_clock::time_point last_flush{};
  };
  // Moves the session's counts to live_routes; at a request's end also to record_routes.
  void flush_routes(Slot& slot, bool request_end);
  void work(int index);
  void drop_cancelled_locked();
  void run(Slot& slot, Job& job);

  const Model& model_;
  const Tokenizer& tokenizer_;
  // The vocabulary's trie for structured output, built by the first request that needs it.
  std::once_flag trie_once_;
  std::shared_ptr<const grammar::TokenTrie> trie_;
  const SchedulerConfig config_;
  Metrics& metrics_;
  std::unique_ptr<PromptCache> cache_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<Slot> slots_;
  std::string latest_metrics_;  // SchedulerConfig::sequence_metrics after the latest request
  int busy_ = 0;
  bool accepting_ = true;
  bool exiting_ = false;
  std::vector<std::thread> workers_;
  uint32_t trace_streams_ = 0;  // streams handed out (under mutex_)
  bool counting_ = false;       // the slots' sequences count routes
};

}  // namespace strata::serve
