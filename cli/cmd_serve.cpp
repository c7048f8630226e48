// `strata serve [-m MODEL] [--host H] [--port P] [--slots N] [--ctx N] [--api-key K] [--model-name NAME]`:
// an OpenAI-compatible HTTP server (docs/API.md).
#include <memory>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "cli/generation_cli.h"
#include "strata/base/error.h"
#include "strata/serve/server.h"

namespace {

void setup_serve(CLI::App& sub) {
  auto o = std::make_shared<strata::serve::ServeOptions>();
  sub.add_option("-m,--model", o->model_path, "GGUF model file (default: the bundled model)");
  sub.add_option("--host", o->host, "address to listen on (default 127.0.0.1)");
  sub.add_option("--port", o->port, "TCP port (default 8080)");
  sub.add_option("--slots", o->slots, "concurrent sequences (default 1)");
  sub.add_option("--queue", o->queue, "requests that may wait for a slot before 503 (default 4 x slots)");
  sub.add_option("--ctx", o->ctx, "context tokens per sequence (default 4096, at most the model's)");
  sub.add_option("--threads", o->threads, "CPU threads in all, shared among the slots (default: all)");
  sub.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' on every route but /health");
  sub.add_option("--model-name", o->model_name, "model id clients use (default: the file name without .gguf)");
  sub.add_option("--max-body", o->max_body_bytes, "largest request body in bytes (default 1048576)");
  sub.add_option("--timeout", o->timeout_s, "seconds a connection may stall on read or write (default 30)");
  sub.add_option("--shutdown-grace", o->shutdown_grace_s,
                 "seconds running requests may finish after SIGINT/SIGTERM before being cancelled (default 10)");
  auto backend = std::make_shared<strata::cli::BackendOptions>();
  strata::cli::add_backend_options(sub, *backend);
  sub.callback([o, backend] {
    o->model_path = strata::cli::resolve_model_path(o->model_path);
    if (backend->gpu) {
      // Each GPU session uploads its own copy of the weights today, so the GPU serves one slot.
      if (o->slots != 1) strata::fail("serve --gpu runs one slot for now (got --slots ", o->slots, ")");
      o->backend = "gpu";
      o->make_sequence = [backend](const strata::Model& m, int ctx) { return strata::cli::make_sequence(m, ctx, *backend); };
    }
    strata::cli::set_exit_code(strata::serve::run_server(*o));
  });
}

const bool registered = strata::cli::register_command("serve", "Serve the model over an OpenAI-compatible HTTP API", setup_serve);

}  // namespace
