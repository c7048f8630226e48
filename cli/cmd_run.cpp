// `strata run [-m MODEL] "prompt"`: streams a raw completion of the prompt (or, with --chat, the
// reply to it as one user turn) to stdout, then a stats line to stderr. Ctrl-C stops at the next
// token, still prints the stats, and exits 130.
//
// `strata run -m MODEL --prompt-tokens 1,2,3 -n N --temp 0 --print-token-ids`: greedy generation from
// a prompt given as token ids, printing the generated ids comma-separated on one stdout line (the
// engine tests drive the model through this path; it needs no tokenizer).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "cli/generation_cli.h"
#include "cli/spec_cli.h"
#include "strata/base/error.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/generate.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/engine/thread_policy.h"
#include "strata/text/chat_template.h"

namespace {

struct RunOptions {
  std::string model;
  std::string prompt;  // "-": read from stdin
  std::string prompt_file;
  std::string prompt_tokens;
  int n_predict = 128;
  strata::cli::SamplingOptions sampling;
  bool temp_given = false;
  bool print_token_ids = false;
  bool chat = false;
  bool chatml = false;
  bool no_stats = false;
  bool no_token_healing = false;
  bool no_conversation = false;
  int ctx = 0;  // 0: prompt + n_predict
  strata::cli::ThreadOptions threads;
  strata::cli::BackendOptions backend;
  strata::SpecOptions spec;
  strata::SpecChoice spec_choice;
};

// Prompt given as token ids: greedy continuation, ids printed on one line.
void run_token_ids(const RunOptions& o) {
  // --temp defaults to 0 here: this path is greedy only.
  const float temp = o.temp_given ? o.sampling.temp : 0.0f;
  if (temp != 0.0f) strata::fail("--temp ", temp, ": only greedy decoding (--temp 0) is implemented for --prompt-tokens");
  if (!o.print_token_ids) strata::fail("--prompt-tokens needs --print-token-ids (text output needs the tokenizer)");
  if (o.spec_choice.kind != strata::SpecKind::None)
    strata::fail("--spec needs a text prompt (--prompt-tokens runs the plain greedy loop)");
  if (o.n_predict < 0) strata::fail("-n must be >= 0, got ", o.n_predict);
  const std::vector<int32_t> prompt = strata::parse_token_list(o.prompt_tokens, "--prompt-tokens");
  // Weight size left unknown: this path keeps all cores for any model (the engine tests drive it).
  strata::apply_thread_policy({o.threads.threads, o.threads.force, 1, 0});
  auto model = strata::cli::load_model_for_cli(strata::cli::resolve_model_path(o.model));
  const int needed = static_cast<int>(prompt.size()) + o.n_predict;
  const int ctx = o.ctx > 0 ? o.ctx : needed;
  auto profile = strata::cli::open_profile(*model, o.backend);
  const auto trace = strata::cli::open_routing_trace(*model, o.backend);
  auto session = strata::cli::make_sequence(*model, ctx, o.backend, profile.get());
  session->set_routing_trace(trace.get(), 0);
  strata::cli::ProfileRecorder recorder(profile.get(), *session);
  const std::vector<int32_t> ids = strata::generate_greedy(*session, prompt, o.n_predict);
  recorder.save();
  strata::cli::print_telemetry(*session, o.backend, stderr);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += strata::cat(i ? "," : "", ids[i]);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string read_all_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// Prompt given as text: tokenize, stream the decoded continuation, report speed.
void run_text(const RunOptions& o) {
  if (o.n_predict < 0) strata::fail("-n must be >= 0, got ", o.n_predict);
  if (o.ctx < 0) strata::fail("--ctx must be > 0, got ", o.ctx);
  const std::string prompt = o.prompt == "-" ? read_all_stdin() : o.prompt;
  if (prompt.empty()) strata::fail("no prompt: pass one, e.g. strata run \"def fibonacci(n):\" (or - to read stdin)");
  strata::Sampler sampler(o.sampling.to_params());
  auto model = strata::cli::load_model_for_cli(strata::cli::resolve_model_path(o.model));
  strata::cli::set_threads_for_model(o.threads, *model);
  auto tokenizer = strata::cli::load_tokenizer_for_cli(*model);

  std::string text = prompt;
  if (o.chat) {
    strata::detect_chat_family(tokenizer->vocab().chat_template, o.chatml);
    text = strata::render_chat({strata::ChatMessage{"user", prompt, {}, "", "", std::nullopt}}, nullptr, {});
  }
  std::vector<int32_t> ids;
  if (tokenizer->vocab().add_bos && tokenizer->bos_id() >= 0) ids.push_back(tokenizer->bos_id());
  const std::vector<int32_t> body = tokenizer->encode(text);
  ids.insert(ids.end(), body.begin(), body.end());

  const int n_prompt = static_cast<int>(ids.size());
  const int ctx = o.ctx > 0 ? o.ctx : n_prompt + std::max(o.n_predict, 1);
  if (n_prompt > ctx)
    strata::fail("prompt of ", n_prompt, " tokens exceeds the context of ", ctx, "; pass a larger --ctx");
  auto profile = strata::cli::open_profile(*model, o.backend);
  const auto trace = strata::cli::open_routing_trace(*model, o.backend);
  auto session = strata::cli::make_sequence(*model, ctx, o.backend, profile.get());
  session->set_routing_trace(trace.get(), 0);
  strata::cli::ProfileRecorder recorder(profile.get(), *session);

  const int32_t n_text = static_cast<int32_t>(std::min<int64_t>(model->config().n_vocab, tokenizer->n_vocab()));
  const auto drafter = strata::cli::make_cli_drafter(o.spec_choice, o.spec, *model, ctx, sampler.params(), n_text,
                                                     o.backend);

  strata::cli::install_interrupt_handler();
  strata::GenerationParams params;
  params.spec = o.spec_choice.params;
  params.spec.drafter = drafter.get();
  // Raw completions end wherever the user stopped typing: heal the last token (see generate.h).
  if (!o.chat && !o.no_token_healing) params.healed_prefix = strata::heal_prompt_end(*tokenizer, ids);
  params.max_new_tokens = o.n_predict;
  params.cancel = &strata::cli::interrupt_flag();
  const strata::GenerationResult r =
      strata::generate(*session, *tokenizer, sampler, ids, params, [](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        return true;
      });
  // End the line so the stats (stderr) and the shell prompt start on their own.
  if (r.text.empty() || r.text.back() != '\n') std::fputc('\n', stdout);
  std::fflush(stdout);
  if (r.stop_reason == strata::StopReason::ContextFull)
    std::fprintf(stderr, "strata: stopped: the context of %d tokens is full; pass a larger --ctx\n", ctx);
  if (!o.no_stats) strata::cli::print_stats_line(r.stats);
  recorder.save();  // --profile: what this run routed, interrupted or not
  strata::cli::print_telemetry(*session, o.backend, stderr);
  if (r.stop_reason == strata::StopReason::Cancelled) strata::cli::set_exit_code(130);
}

void setup_run(CLI::App& sub) {
  auto o = std::make_shared<RunOptions>();
  sub.add_option("prompt", o->prompt, "prompt text (raw completion); - reads it from stdin");
  sub.add_option("-p,--prompt", o->prompt, "the prompt text, as a flag (llama.cpp's spelling)");
  sub.add_option("-f,--file", o->prompt_file, "read the prompt from a file");
  sub.add_option("-m,--model", o->model, "GGUF model file (default: the bundled model)");
  sub.add_option("--prompt-tokens", o->prompt_tokens, "prompt as comma-separated token ids (with --print-token-ids)");
  sub.add_option("-n,--n-predict", o->n_predict, "tokens to generate at most (default 128)");
  strata::cli::add_sampling_options(sub, o->sampling);
  sub.add_flag("--print-token-ids", o->print_token_ids, "print the generated token ids, comma-separated");
  sub.add_flag("--chat", o->chat, "wrap the prompt in the model's chat template as one user turn");
  sub.add_flag("--chatml", o->chatml, "with --chat: use ChatML even when the GGUF's template is not recognised");
  sub.add_flag("--no-stats", o->no_stats, "do not print the speed line on stderr");
  sub.add_flag("--no-token-healing", o->no_token_healing,
               "feed the prompt's last token as is (default: re-choose it, so a prompt ending mid-merge continues naturally)");
  sub.add_option("-c,--ctx,--ctx-size", o->ctx, "context size in tokens (default: prompt + n)");
  strata::cli::add_thread_options(sub, o->threads);
  sub.add_flag("--no-conversation", o->no_conversation, "-no-cnv: accepted for llama.cpp habits (run is never interactive)");
  strata::cli::add_backend_options(sub, o->backend);
  strata::cli::add_collect_routing_option(sub, o->backend);
  strata::cli::add_spec_options(sub, o->spec);
  sub.callback([o, &sub] {
    strata::cli::check_backend_options(o->backend);
    o->spec_choice = strata::check_spec_options(o->spec);
    o->temp_given = sub.get_option("--temp")->count() > 0;
    if (sub.get_option("prompt")->count() > 0 && sub.get_option("--prompt")->count() > 0)
      strata::fail("give the prompt once: as an argument or with -p/--prompt, not both");
    if (!o->prompt_file.empty()) {
      if (!o->prompt.empty()) strata::fail("give either a prompt or -f/--file, not both");
      o->prompt = strata::cli::read_text_file(o->prompt_file, "-f/--file");
      if (o->prompt.empty()) strata::fail(o->prompt_file, ": the prompt file is empty");
    }
    if (!o->prompt_tokens.empty()) {
      if (!o->prompt.empty()) strata::fail("give either a text prompt or --prompt-tokens, not both");
      run_token_ids(*o);
    } else {
      run_text(*o);
    }
  });
}

const bool registered = strata::cli::register_command("run", "Generate text from a prompt", setup_run);

}  // namespace
