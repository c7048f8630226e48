// `strata serve [-m MODEL] [--host H] [--port P] [--slots N] [--ctx N] [--api-key K|--api-key-file F] [-a NAME]`:
// an OpenAI-compatible HTTP server (docs/API.md). With --gpu the backend options of backend_cli.h
// apply (VRAM budget, hybrid experts); --profile keeps a routing profile updated after each request.
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "cli/generation_cli.h"
#include "cli/spec_cli.h"
#include "strata/base/error.h"
#include "strata/serve/server.h"

namespace {

// The key is the file's first line without its line ending; an empty key would turn authentication
// off without saying so, so it is refused.
std::string read_api_key_file(const std::string& path) {
  std::string key = strata::cli::read_text_file(path, "API key file");
  key = key.substr(0, key.find('\n'));
  if (!key.empty() && key.back() == '\r') key.pop_back();
  if (key.empty()) strata::fail(path, ": the API key file's first line is empty");
  return key;
}

// The GPU plan's placement as the experts view shows it: hot experts on the GPU, the others on the CPU;
// nothing on the CPU backend, where every expert is in host memory and the view shows routing only.
std::optional<strata::serve::ExpertPlacement> expert_placement(const strata::BackendPlan& plan) {
  if (!plan.gpu) return std::nullopt;
  using strata::serve::ExpertHome;
  const strata::ExpertPlan& p = plan.gpu_plan.plan;
  strata::serve::ExpertPlacement out;
  out.receipt = plan.gpu_plan.text;
  for (const std::vector<int>& row : p.slot_of) {
    std::vector<ExpertHome> homes;
    for (int slot : row) homes.push_back(slot >= 0 ? ExpertHome::Gpu : ExpertHome::Cpu);
    out.home.push_back(std::move(homes));
  }
  return out;
}

void setup_serve(CLI::App& sub) {
  auto o = std::make_shared<strata::serve::ServeOptions>();
  sub.add_option("-m,--model", o->model_path, "GGUF model file (default: the bundled model)");
  sub.add_option("--host", o->host, "address to listen on (default 127.0.0.1)");
  sub.add_option("--port", o->port, "TCP port, 0..65535; 0 picks a free one and prints it (default 8080)");
  sub.add_option("--slots,--parallel", o->slots, "concurrent sequences (default 1)");
  sub.add_option("--queue", o->queue, "requests that may wait for a slot (default 64 x slots)");
  sub.add_option("--queue-timeout", o->queue_timeout_s,
                 "seconds a request may wait for a slot before it gets 503 (default 300)");
  sub.add_option("-c,--ctx,--ctx-size", o->ctx, "context tokens per sequence (default 4096, at most the model's)");
  sub.add_option("-t,--threads", o->threads,
                 "CPU threads in all, shared among the slots (default: 1 per slot for a model under 256 MiB, else "
                 "the usable cores; capped at the cores)");
  sub.add_flag("--threads-force", o->threads_force, "use --threads as given even beyond the usable cores");
  sub.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on every route but /health");
  sub.add_option("--api-key-file", o->api_key_file,
                 "read the API key from the first line of FILE (keeps it out of the process list)");
  sub.add_option("-a,--alias,--model-name", o->model_name, "model id clients use (default: the file name without .gguf)");
  sub.add_option("--cors", o->cors_origin,
                 "let web pages of ORIGIN (scheme://host[:port], or *) call the API: CORS headers, preflight answered");
  sub.add_option("--max-body", o->max_body_bytes, "largest request body in bytes, any transfer encoding (default 1048576)");
  sub.add_option("--timeout", o->timeout_s,
                 "seconds a client has to send a whole request (headers and body), and the most a write may stall "
                 "(default 30)");
  sub.add_option("--max-connections", o->max_connections,
                 "connections served at once; beyond it only /health is answered, the rest get 503 (default: slots + queue + 64)");
  sub.add_flag("--parse-special", o->parse_special,
               "read special-token text inside chat messages as control tokens (default: as plain text, so a client "
               "cannot forge turns)");
  sub.add_option("--cache-ram", o->cache_ram_mib,
                 "MiB of memory the prompt cache may hold (snapshots of prompts' state, shared by the slots, least "
                 "recently used dropped first); 0 turns it off (default 2048 on the CPU; not available with --gpu)");
  sub.add_option("--shutdown-grace", o->shutdown_grace_s,
                 "seconds running requests may finish after SIGINT/SIGTERM before being cancelled (default 10)");
  sub.add_flag_function("--no-webui", [o](int64_t n) { o->webui = n == 0; },
                        "do not serve the web page at / (chat and experts view); the API is unchanged");
  auto backend = std::make_shared<strata::cli::BackendOptions>();
  strata::cli::add_backend_options(sub, *backend);
  strata::cli::add_collect_routing_option(sub, *backend);
  auto spec = std::make_shared<strata::SpecOptions>();
  strata::cli::add_spec_options(sub, *spec);
  sub.callback([o, backend, spec] {
    strata::cli::check_backend_options(*backend);
    const strata::SpecChoice spec_choice = strata::check_spec_options(*spec);
    if (backend->gpu) o->backend = "gpu";
    if (!o->api_key_file.empty()) {
      if (!o->api_key.empty()) strata::fail("give either --api-key or --api-key-file, not both");
      o->api_key = read_api_key_file(o->api_key_file);
    }
    strata::serve::check_serve_options(*o);
    // --collect-routing: one trace for the process, each request its own stream.
    if (!backend->collect_routing.empty())
      o->make_routing_trace = [backend](const strata::Model& m) {
        std::shared_ptr<strata::RoutingTraceWriter> trace = strata::cli::open_routing_trace(m, *backend);
        std::fprintf(stderr, "strata serve: routing trace %s, one stream per request\n", trace->path().c_str());
        return trace;
      };
    // --telemetry (needs --gpu): the hybrid counters on /metrics, refreshed after each request.
    if (backend->telemetry) o->sequence_metrics = strata::cli::telemetry_metrics;
    o->model_path = strata::cli::resolve_model_path(o->model_path);
    // --profile: one store for all slots (ProfileStore is thread-safe), opened once the model is
    // loaded; it also gives the GPU placement its hotness.
    auto profile = std::make_shared<std::unique_ptr<strata::ProfileStore>>();
    if (!backend->profile.empty()) {
      o->make_route_recorder = [profile, backend](const strata::Model& m) {
        *profile = strata::cli::open_profile(m, *backend);
        strata::ProfileStore* store = profile->get();
        const strata::RoutingCounts so_far = store->snapshot();
        std::fprintf(stderr, "strata serve: routing profile %s (%s, %llu tokens so far), updated after each request\n",
                     store->path().c_str(), store->loaded_existing() ? "loaded" : "new",
                     static_cast<unsigned long long>(so_far.n_tokens));
        return std::function<void(const strata::RoutingCounts&)>(
            [store](const strata::RoutingCounts& counts) { store->add_and_save(counts); });
      };
    }
    {
      // Every slot's sequence comes from one plan (cache types, and with --gpu one receipt, placement and
      // GpuModel shared by the slots).
      auto factory = std::make_shared<std::unique_ptr<strata::cli::SequenceFactory>>();
      const int slots = o->slots;
      // The scheduler makes its slots one after another on one thread: the first call plans.
      o->make_sequence = [backend, profile, factory, slots](const strata::Model& m, int ctx) {
        if (!*factory)
          *factory = std::make_unique<strata::cli::SequenceFactory>(m, ctx, slots, *backend, profile->get());
        return (*factory)->make();
      };
      // The experts view marks each expert by where the plan put it.
      o->expert_placement = [factory]() -> std::optional<strata::serve::ExpertPlacement> {
        if (!*factory) return std::nullopt;
        return expert_placement((*factory)->plan());
      };
    }
    if (spec_choice.kind != strata::SpecKind::None) {
      // One drafter per slot; a draft model is loaded once (by the first slot) and shared. A slot's
      // drafter serves requests of any sampling, so a draft model drafts greedily (verification keeps
      // sampled output's distribution either way).
      auto drafters = std::make_shared<std::unique_ptr<strata::DrafterFactory>>();
      o->spec = spec_choice.params;
      const bool draft_gpu = strata::cli::draft_on_gpu(spec_choice, *spec, *backend);
      const int slots = o->slots;
      o->make_drafter = [drafters, spec_choice, spec, backend, draft_gpu, slots](const strata::Model& target, int ctx,
                                                                                int32_t n_allowed) {
        if (!*drafters) {
          *drafters = std::make_unique<strata::DrafterFactory>(
              spec_choice, *spec, target,
              draft_gpu ? strata::cli::draft_sequence_maker(*backend, slots) : strata::DraftSequenceMaker{});
          std::fprintf(
              stderr, "strata serve: speculative decoding with %s, up to %d drafts per step\n",
              spec_choice.kind == strata::SpecKind::Ngram ? "n-gram lookup"
              : spec_choice.kind == strata::SpecKind::Mtp ? "the model's MTP layer (head where slots run)"
              : spec_choice.kind == strata::SpecKind::DFlash
                  ? ("DFlash drafter " + strata::drafter_file(spec_choice, target) + " (cpu)").c_str()
                  : ("draft model " + strata::drafter_file(spec_choice, target) + (draft_gpu ? " (cuda)" : " (cpu)"))
                        .c_str(),
              spec_choice.params.draft_max);
        }
        strata::SamplerParams greedy;
        greedy.temperature = 0;
        return (*drafters)->make(ctx, greedy, n_allowed);
      };
    }
    strata::cli::set_exit_code(strata::serve::run_server(*o));
  });
}

const bool registered = strata::cli::register_command("serve", "Serve the model over an OpenAI-compatible HTTP API", setup_serve);

}  // namespace
