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

// The whole file as bytes; fails "<path>: cannot open <what>".
std::string read_text_file(const std::string& path, const char* what);

// The model path from -m, or the bundled model when -m was not given.
std::string resolve_model_path(const std::string& from_flag);

// Loads the model, failing with one actionable line (file missing, not a GGUF, unsupported
// architecture). A large file's pages are read in up front behind a progress bar, so the wait
// shows as loading rather than as a slow first token.
std::unique_ptr<Model> load_model_for_cli(const std::string& path);

// -t/--threads and --threads-force, as every command that runs the model offers them.
struct ThreadOptions {
  int threads = 0;  // 0: automatic (engine/thread_policy.h)
  bool force = false;
};
void add_thread_options(CLI::App& sub, ThreadOptions& o);

// Sets the engine's CPU threads by the one policy (engine/thread_policy.h) for one sequence of this
// model: one thread for a model under 256 MiB, else the usable cores; --threads above the cores is
// capped with a warning unless forced.
void set_threads_for_model(const ThreadOptions& threads, const Model& model);

// The model's tensor bytes (what the thread policy calls small or large).
uint64_t model_weight_bytes(const Model& model);

// The GGUF's tokenizer; fails saying text needs one when the file has none.
std::unique_ptr<Tokenizer> load_tokenizer_for_cli(const Model& model);

// Ctrl-C: the first SIGINT sets interrupted() (generation stops at the next token); the handler
// does not restart interrupted reads, so a blocked read returns EINTR.
void install_interrupt_handler();
std::atomic<bool>& interrupt_flag();

// "prompt: N tok, X tok/s | decode: M tok, Y tok/s | ttft: Z ms", written to stderr; with speculative
// decoding, then "| spec ngram: A/D drafts accepted (P%), T tok/verify over V verifies" (or why it was off).
void print_stats_line(const GenerationStats& stats);
std::string format_stats_line(const GenerationStats& stats);

}  // namespace strata::cli
