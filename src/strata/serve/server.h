// `strata serve`: an OpenAI-compatible HTTP server over one model (see docs/API.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "strata/engine/drafter.h"
#include "strata/engine/generate.h"
#include "strata/engine/routing_counts.h"
#include "strata/engine/sequence.h"
#include "strata/serve/expert_stats.h"

namespace strata::serve {

constexpr int64_t kDefaultCacheRamMiB = 2048;

struct ServeOptions {
  std::string model_path;
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port (printed once bound)
  int slots = 1;            // concurrent sequences
  int queue = -1;           // requests that may wait for a slot; < 0: 64 x slots
  int queue_timeout_s = 300;  // how long a request may wait for a slot before 503
  int ctx = 4096;           // tokens per sequence (clamped to the model's training context when it states one)
  int threads = 0;          // CPU threads in all; 0: the thread policy's choice (engine/thread_policy.h)
  bool threads_force = false;  // --threads beyond the usable cores
  std::string api_key;      // "": no key required
  std::string api_key_file; // the CLI reads it into api_key
  // Browser pages of this origin ("*": any) may call the API: CORS headers on every answer and
  // preflight (OPTIONS) answered without a key; "": no CORS headers, browsers keep other origins out.
  std::string cors_origin;
  std::string model_name;   // "": the model file's name without directory and .gguf
  size_t max_body_bytes = 1 << 20;  // any transfer or content encoding, counted as the body arrives
  int timeout_s = 30;       // whole-request deadline (headers and body) and write timeout
  int max_connections = -1;  // connections served at once (< 0: slots + queue + 64); beyond it only /health is answered
  bool parse_special = false;  // special-token text inside chat messages becomes control tokens
  int shutdown_grace_s = 10;  // on SIGINT/SIGTERM, how long running requests may finish before being cancelled
  // --cache-ram: MiB the prompt cache may hold (engine/prompt_cache.h); 0: off; < 0: the default
  // (kDefaultCacheRamMiB on the CPU, off on the GPU, whose sequences cannot save their state).
  int64_t cache_ram_mib = -1;
  // Makes each slot's sequence; empty: the CPU engine. backend names it in the start-up line.
  std::function<std::unique_ptr<Sequence>(const Model&, int ctx)> make_sequence;
  std::string backend = "cpu";
  // --profile: called once with the loaded model (before the slots' sequences are made); returns what
  // each finished request's routing counts are handed to (SchedulerConfig::record_routes). Empty: off.
  std::function<std::function<void(const RoutingCounts&)>(const Model&)> make_route_recorder;
  // --collect-routing: called once with the loaded model; every request's kept tokens are appended to
  // the writer it returns as one stream per request (SchedulerConfig::trace). Empty: off.
  std::function<std::shared_ptr<RoutingTraceWriter>(const Model&)> make_routing_trace;
  // Extra /metrics lines from a slot's sequence after each request (serve --gpu --telemetry: the
  // hybrid counters). Empty: none.
  std::function<std::string(const Sequence&)> sequence_metrics;
  // The web page at / (webui/; --no-webui: off, / is then an unknown route).
  bool webui = true;
  // Where every routed expert lives and the VRAM receipt, for the experts view and /metrics; called
  // once after the slots' sequences are made. Empty or nullopt: the CPU backend (routing only).
  std::function<std::optional<ExpertPlacement>()> expert_placement;
  // serve --spec: makes each slot's drafter for the loaded model (ids from n_allowed on are never
  // drafted); spec: the draft lengths. Every request speculates unless it sends "speculative": false.
  // Empty: no speculation ("speculative": true is then refused).
  std::function<std::unique_ptr<Drafter>(const Model& target, int ctx, int32_t n_allowed)> make_drafter;
  SpeculativeParams spec;
};

// Every serve option checked in one place (throws strata::Error naming the flag).
void check_serve_options(const ServeOptions& options);

// Binds, loads the model (answering /health with 503 until it is ready) and serves until SIGINT or
// SIGTERM. Returns the process exit code: 0 after a graceful shutdown. Throws strata::Error when the
// address cannot be bound or the model does not load.
int run_server(const ServeOptions& options);

}  // namespace strata::serve
