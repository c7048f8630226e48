#include "cli/generation_cli.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "strata/base/default_model.h"
#include "strata/base/error.h"
#include "strata/base/progress.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/thread_policy.h"
#include "strata/text/vocab.h"

namespace strata::cli {

SamplerParams SamplingOptions::to_params() const {
  SamplerParams p;
  p.temperature = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repetition_penalty = repeat_penalty;
  p.presence_penalty = presence_penalty;
  p.frequency_penalty = frequency_penalty;
  if (seed >= 0) p.seed = static_cast<uint64_t>(seed);
  validate_sampler_params(p);
  return p;
}

void add_sampling_options(CLI::App& sub, SamplingOptions& o) {
  sub.add_option("--temp", o.temp, "sampling temperature; 0 = greedy (default 0.7)");
  sub.add_option("--top-k", o.top_k, "keep the k most likely tokens; 0 = off (default 0)");
  sub.add_option("--top-p", o.top_p, "nucleus sampling mass; 1 = off (default 0.9)");
  sub.add_option("--min-p", o.min_p, "drop tokens below min-p x p(best); 0 = off (default 0)");
  sub.add_option("--repeat-penalty", o.repeat_penalty, "repetition penalty; 1 = off (default 1)");
  sub.add_option("--presence-penalty", o.presence_penalty, "presence penalty (default 0)");
  sub.add_option("--frequency-penalty", o.frequency_penalty, "frequency penalty (default 0)");
  sub.add_option("-s,--seed", o.seed, "random seed for a reproducible run (default: random)");
}

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open ", what);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string resolve_model_path(const std::string& from_flag) {
  if (!from_flag.empty()) return from_flag;
#ifdef STRATA_SOURCE_DIR
  return find_default_model(bundled_model_candidates(STRATA_SOURCE_DIR));
#else
  return find_default_model(bundled_model_candidates(""));
#endif
}

namespace {

// Files smaller than this load in well under a second; touching them only costs time.
constexpr uint64_t kPrefaultThreshold = 512ull << 20;

// Reads one byte per page of every tensor so the kernel brings the weights in now.
void prefault_weights(const GgufFile& file) {
  uint64_t total = 0;
  for (const GgufTensorInfo& t : file.tensors()) total += t.nbytes;
  if (total < kPrefaultThreshold) return;
  ProgressBar bar("loading model", total);
  constexpr size_t kPage = 4096;
  uint64_t done = 0;
  volatile uint8_t sink = 0;
  for (const GgufTensorInfo& t : file.tensors()) {
    for (size_t off = 0; off < t.nbytes; off += kPage) {
      sink = sink ^ t.data[off];
      if ((off & ((64u << 20) - 1)) == 0) bar.update(done + off);
    }
    done += t.nbytes;
    bar.update(done);
  }
  bar.finish();
}

}  // namespace

std::unique_ptr<Model> load_model_for_cli(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("model file not found: ", path);
  auto model = Model::load(path);
  prefault_weights(model->file());
  return model;
}

void add_thread_options(CLI::App& sub, ThreadOptions& o) {
  sub.add_option("-t,--threads", o.threads,
                 "CPU threads (default: 1 for a model under 256 MiB, else the usable cores; capped at the cores)");
  sub.add_flag("--threads-force", o.force, "use --threads as given even beyond the usable cores");
}

uint64_t model_weight_bytes(const Model& model) {
  uint64_t bytes = 0;
  for (const GgufTensorInfo& t : model.file().tensors()) bytes += t.nbytes;
  return bytes;
}

void set_threads_for_model(const ThreadOptions& threads, const Model& model) {
  ThreadRequest r;
  r.threads = threads.threads;
  r.force = threads.force;
  r.weight_bytes = model_weight_bytes(model);
  apply_thread_policy(r);
}

std::unique_ptr<Tokenizer> load_tokenizer_for_cli(const Model& model) {
  if (!model.file().has("tokenizer.ggml.model") || !model.file().has("tokenizer.ggml.tokens"))
    fail(model.file().path(),
         ": the file has no tokenizer (tokenizer.ggml.* keys), so it cannot take a text prompt; "
         "pass token ids with --prompt-tokens, or convert the model with its tokenizer files");
  return std::make_unique<Tokenizer>(vocab_from_gguf(model.file()));
}

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }
}  // namespace

std::atomic<bool>& interrupt_flag() { return g_interrupted; }

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read blocked at the chat prompt returns EINTR
  sigaction(SIGINT, &sa, nullptr);
}

std::string format_stats_line(const GenerationStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "prompt: %d tok, %.1f tok/s | decode: %d tok, %.1f tok/s | ttft: %.0f ms",
                s.prompt_tokens, s.prompt_tokens_per_second(), s.generated_tokens, s.decode_tokens_per_second(),
                s.ttft_seconds * 1000.0);
  std::string line = buf;
  if (!s.spec_off.empty()) {
    line += " | spec: off (" + s.spec_off + ")";
  } else if (!s.drafter.empty()) {
    std::snprintf(buf, sizeof buf, " | spec %s: %d/%d drafts accepted (%.0f%%), %.2f tok/verify over %d verifies",
                  s.drafter.c_str(), s.accepted_tokens, s.drafted_tokens, 100.0 * s.acceptance_rate(),
                  s.tokens_per_spec_step(), s.spec_steps);
    line += buf;
  }
  return line;
}

void print_stats_line(const GenerationStats& stats) {
  std::fprintf(stderr, "%s\n", format_stats_line(stats).c_str());
  std::fflush(stderr);
}

}  // namespace strata::cli
