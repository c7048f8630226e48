// `strata logits -m MODEL --tokens 1,2,3 --out FILE`: runs the tokens as one prompt and writes the
// logits of every position as little-endian float32, row-major [n_tokens x n_vocab]. Tests compare
// these against reference implementations.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "strata/base/error.h"
#include "cli/generation_cli.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/thread_policy.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"

namespace {

struct LogitsOptions {
  std::string model;
  std::string tokens;
  std::string out;
  strata::cli::ThreadOptions threads;
  strata::cli::BackendOptions backend;
};

void run_logits(const LogitsOptions& o) {
  static_assert(sizeof(float) == 4);
  const std::vector<int32_t> ids = strata::parse_token_list(o.tokens, "--tokens");
  // Weight size left unknown: all cores for any model, as before the policy (the parity tests use this).
  strata::apply_thread_policy({o.threads.threads, o.threads.force, 1, 0});
  auto model = strata::cli::load_model_for_cli(strata::cli::resolve_model_path(o.model));
  const int64_t vocab = model->config().n_vocab;
  auto session = strata::cli::make_sequence(*model, static_cast<int>(ids.size()), o.backend);
  std::vector<float> logits(ids.size() * static_cast<size_t>(vocab));
  session->forward(ids.data(), static_cast<int>(ids.size()), logits.data(), true);

  // The host is little-endian (x86-64 / aarch64), so the floats are written as they lie in memory.
  std::FILE* f = std::fopen(o.out.c_str(), "wb");
  if (!f) strata::fail(o.out, ": cannot open for writing");
  const size_t written = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
  const bool closed = std::fclose(f) == 0;
  if (written != logits.size() || !closed) strata::fail(o.out, ": write failed");
}

void setup_logits(CLI::App& sub) {
  auto o = std::make_shared<LogitsOptions>();
  sub.add_option("-m,--model", o->model, "GGUF model file (default: the bundled model)");
  sub.add_option("--tokens", o->tokens, "comma-separated token ids, run as one prompt")->required();
  sub.add_option("--out", o->out, "output file: float32 logits [n_tokens x n_vocab]")->required();
  strata::cli::add_thread_options(sub, o->threads);
  strata::cli::add_backend_options(sub, o->backend);
  sub.callback([o] { run_logits(*o); });
}

const bool registered =
    strata::cli::register_command("logits", "Write the logits of every position of a token prompt", setup_logits);

}  // namespace
