// What `strata run` and `strata chat` share: the model/sampling options, loading a model with a
// progress bar, the tokenizer, Ctrl-C handling and the closing stats line.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "strata/engine/generate.h"
#include "strata/engine/model.h"
#include "strata/sample/sampler.h"
#include "strata/text/tokenizer.h"

namespace strata::cli {

struct SamplingOptions {
  float temp = 0.7f;
  int top_k = 0;
  float top_p = 0.9f;
  float min_p = 0.0f;
  float repeat_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int64_t seed = -1;  // < 0: random

  SamplerParams to_params() const;  // validated (throws naming the bad flag's value)
};

// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --presence-penalty, --frequency-penalty, --seed.
void add_sampling_options(CLI::App& sub, SamplingOptions& o);

// The model path from -m, or the bundled model when -m was not given.
std::string resolve_model_path(const std::string& from_flag);

// Loads the model, failing with one actionable line (file missing, not a GGUF, unsupported
// architecture). A large file's pages are read in up front behind a progress bar, so the wait
// shows as loading rather than as a slow first token.
std::unique_ptr<Model> load_model_for_cli(const std::string& path);

// Sets the engine's CPU threads: the --threads value when given (> 0); otherwise one thread for a
// model whose weights are under 256 MiB (its matrices are too small to split: the threads' sync
// costs more than they save, and far more when the cores are shared), else one per hardware thread.
void set_threads_for_model(int threads_flag, const Model& model);

// The GGUF's tokenizer; fails saying text needs one when the file has none.
std::unique_ptr<Tokenizer> load_tokenizer_for_cli(const Model& model);

// Ctrl-C: the first SIGINT sets interrupted() (generation stops at the next token); the handler
// does not restart interrupted reads, so a blocked read returns EINTR.
void install_interrupt_handler();
std::atomic<bool>& interrupt_flag();

// "prompt: N tok, X tok/s | decode: M tok, Y tok/s | ttft: Z ms", written to stderr.
void print_stats_line(const GenerationStats& stats);
std::string format_stats_line(const GenerationStats& stats);

}  // namespace strata::cli
