// `strata chat [-m MODEL]`: an interactive conversation. Each line read from stdin is a user turn;
// the whole history is rendered with the model's chat template every turn, and when the rendering
// extends what the session already holds only the new tokens are fed (the KV cache is reused).
// Ctrl-C stops the current reply and returns to the prompt; Ctrl-C twice at the prompt, Ctrl-D
// (end of input) or /exit leaves.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/backend_cli.h"
#include "cli/command.h"
#include "cli/generation_cli.h"
#include "cli/spec_cli.h"
#include "strata/base/error.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/generate.h"
#include "strata/engine/session.h"
#include "strata/text/chat_template.h"

namespace {

struct ChatCliOptions {
  std::string model;
  std::string system;
  bool think = false;
  bool no_think = false;
  bool chatml = false;
  bool no_stats = false;
  int n_predict = 1024;
  int ctx = 0;  // 0: the model's training context, at most 4096
  strata::cli::ThreadOptions threads;
  strata::cli::BackendOptions backend;
  strata::SpecOptions spec;
  strata::SpecChoice spec_choice;
  strata::cli::SamplingOptions sampling;
};

// On a terminal, shows the reasoning inside <think>...</think> dimmed and labelled instead of the raw tags.
// Holds back a tail that may be the start of a tag so a tag split over pieces is still recognised.
class ThinkStyler {
 public:
  explicit ThinkStyler(bool enabled) : enabled_(enabled) {}

  std::string push(std::string_view text) {
    if (!enabled_) return std::string(text);
    pending_.append(text);
    std::string out;
    for (;;) {
      const size_t open = pending_.find(kOpen), close = pending_.find(kClose);
      const size_t at = std::min(open, close);
      if (at == std::string::npos) break;
      out += pending_.substr(0, at);
      const bool is_open = at == open;
      out += is_open ? kThinkStart : kThinkEnd;
      pending_.erase(0, at + (is_open ? kOpen.size() : kClose.size()));
    }
    size_t hold = 0;
    for (std::string_view tag : {kOpen, kClose})
      for (size_t len = std::min(tag.size() - 1, pending_.size()); len > hold; --len)
        if (std::string_view(pending_).substr(pending_.size() - len) == tag.substr(0, len)) {
          hold = len;
          break;
        }
    out += pending_.substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    return out;
  }

  // The rest, and a style reset in case the reply stopped inside the think block.
  std::string finish() {
    std::string out;
    out.swap(pending_);
    if (enabled_) out += "\x1b[0m";
    return out;
  }

 private:
  static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
  static constexpr const char* kThinkStart = "\x1b[2m[thinking]";
  static constexpr const char* kThinkEnd = "[/thinking]\x1b[0m";
  bool enabled_;
  std::string pending_;
};

// Turn markers on a terminal: the user's prompt and the line that opens each reply. Off a terminal
// stdout carries the replies alone, one after another, for scripts.
constexpr const char* kUserMarker = "\x1b[1;32m>\x1b[0m ";
constexpr const char* kAssistantMarker = "\x1b[1;36massistant:\x1b[0m\n";

enum class ReadResult { Line, Interrupted, End };

// Reads one line from stdin without its newline. A SIGINT while waiting returns Interrupted.
ReadResult read_line(std::string& line) {
  char* buf = nullptr;
  size_t cap = 0;
  errno = 0;
  const ssize_t n = ::getline(&buf, &cap, stdin);
  ReadResult result = ReadResult::Line;
  if (n < 0) {
    const bool interrupted = errno == EINTR || strata::cli::interrupt_flag().load();
    std::clearerr(stdin);
    result = interrupted ? ReadResult::Interrupted : ReadResult::End;
  } else {
    line.assign(buf, static_cast<size_t>(n));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  }
  std::free(buf);
  return result;
}

void print_err(const std::string& text) {
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

void run_chat(const ChatCliOptions& o) {
  if (o.think && o.no_think) strata::fail("--think and --no-think exclude each other");
  if (o.n_predict <= 0) strata::fail("-n must be > 0, got ", o.n_predict);
  if (o.ctx < 0) strata::fail("--ctx must be > 0, got ", o.ctx);
  strata::Sampler sampler(o.sampling.to_params());
  auto model = strata::cli::load_model_for_cli(strata::cli::resolve_model_path(o.model));
  strata::cli::set_threads_for_model(o.threads, *model);
  auto tokenizer = strata::cli::load_tokenizer_for_cli(*model);
  const std::string& tmpl = tokenizer->vocab().chat_template;
  if (tmpl.empty() && !o.chatml)
    strata::fail(model->file().path(), ": the file has no chat template (tokenizer.chat_template); pass --chatml to use ChatML");
  try {
    strata::detect_chat_family(tmpl, o.chatml);
  } catch (const strata::Error& e) {
    strata::fail(e.what(), " (pass --chatml to use ChatML anyway)");
  }

  const int train_ctx = model->config().n_ctx_train > 0 ? model->config().n_ctx_train : 4096;
  const int ctx = o.ctx > 0 ? o.ctx : std::min(train_ctx, 4096);
  auto profile = strata::cli::open_profile(*model, o.backend);
  auto session_ptr = strata::cli::make_sequence(*model, ctx, o.backend, profile.get());
  strata::Sequence& session = *session_ptr;
  const int32_t n_text = static_cast<int32_t>(std::min<int64_t>(model->config().n_vocab, tokenizer->n_vocab()));
  const auto drafter = strata::cli::make_cli_drafter(o.spec_choice, o.spec, *model, ctx, sampler.params(), n_text,
                                                     o.backend);
  strata::cli::ProfileRecorder recorder(profile.get(), session);  // --profile: saved after every reply

  strata::ChatOptions render_options;
  if (o.think) render_options.enable_thinking = true;
  if (o.no_think) render_options.enable_thinking = false;

  const bool tty_in = ::isatty(STDIN_FILENO) == 1;
  const bool tty_out = ::isatty(STDOUT_FILENO) == 1;
  std::vector<strata::ChatMessage> history;
  if (!o.system.empty()) history.push_back({"system", o.system, {}, "", "", std::nullopt});
  const size_t base_history = history.size();
  std::vector<int32_t> in_session;  // the tokens the session holds, to find the reusable prefix

  strata::cli::install_interrupt_handler();
  std::atomic<bool>& interrupted = strata::cli::interrupt_flag();
  if (tty_in) print_err("strata chat: type a message; /reset clears the conversation, /exit or Ctrl-D leaves");
  int interrupts_at_prompt = 0;
  for (;;) {
    if (tty_in) {
      std::fputs(tty_out ? kUserMarker : "> ", stdout);
      std::fflush(stdout);
    }
    std::string line;
    const ReadResult rr = read_line(line);
    if (rr == ReadResult::End) {
      if (tty_in) std::fputc('\n', stdout);
      break;
    }
    if (rr == ReadResult::Interrupted) {
      interrupted.store(false);
      if (++interrupts_at_prompt >= 2) {
        std::fputc('\n', stdout);
        break;
      }
      std::fputc('\n', stdout);
      print_err("(press Ctrl-C again, type /exit or Ctrl-D to leave)");
      continue;
    }
    interrupts_at_prompt = 0;
    if (line.empty()) continue;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history.resize(base_history);
      session.reset();
      in_session.clear();
      print_err("(conversation cleared)");
      continue;
    }
    if (line[0] == '/') {
      print_err(strata::cat("unknown command ", line, " (commands: /reset, /exit)"));
      continue;
    }

    history.push_back({"user", line, {}, "", "", std::nullopt});
    std::vector<int32_t> ids;
    if (tokenizer->vocab().add_bos && tokenizer->bos_id() >= 0) ids.push_back(tokenizer->bos_id());
    const std::vector<int32_t> body = tokenizer->encode(strata::render_chat(history, nullptr, render_options));
    ids.insert(ids.end(), body.begin(), body.end());
    if (static_cast<int>(ids.size()) >= ctx) {
      history.pop_back();
      print_err(strata::cat("strata: error: prompt of ", ids.size(), " tokens exceeds the context of ", ctx,
                            "; /reset the conversation or pass a larger --ctx"));
      continue;
    }
    // Reuse the session when the new rendering starts with everything it holds.
    const bool extends = in_session.size() < ids.size() && std::equal(in_session.begin(), in_session.end(), ids.begin());
    if (!extends) {
      session.reset();
      in_session.clear();
    }
    const std::vector<int32_t> fresh(ids.begin() + static_cast<std::ptrdiff_t>(in_session.size()), ids.end());

    interrupted.store(false);
    strata::GenerationParams params;
    params.max_new_tokens = o.n_predict;
    params.cancel = &interrupted;
    params.spec = o.spec_choice.params;
    params.spec.drafter = drafter.get();
    params.spec.preceding = &in_session;
    ThinkStyler styler(tty_out);
    // On a terminal each reply gets its own labelled block, so turns stay apart when scrolling back.
    if (tty_out) std::fputs(kAssistantMarker, stdout);
    const strata::GenerationResult r =
        strata::generate(session, *tokenizer, sampler, fresh, params, [&](std::string_view piece) {
          const std::string shown = styler.push(piece);
          std::fwrite(shown.data(), 1, shown.size(), stdout);
          std::fflush(stdout);
          return true;
        });
    const std::string rest = styler.finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputs(tty_out ? "\n\n" : "\n", stdout);
    std::fflush(stdout);
    if (r.stats.prompt_tokens > 0) in_session.insert(in_session.end(), fresh.begin(), fresh.end());
    in_session.insert(in_session.end(), r.tokens.begin(), r.tokens.begin() + r.tokens_in_session);

    const strata::AssistantOutput parsed = strata::parse_assistant_output(r.text);
    strata::ChatMessage reply{"assistant", parsed.content, {}, "", "", std::nullopt};
    if (!parsed.reasoning_content.empty()) reply.reasoning_content = parsed.reasoning_content;
    history.push_back(reply);

    if (r.stop_reason == strata::StopReason::Cancelled) {
      interrupted.store(false);
      print_err("(reply interrupted)");
    } else if (r.stop_reason == strata::StopReason::ContextFull) {
      print_err(strata::cat("(the context of ", ctx, " tokens is full: /reset the conversation or pass a larger --ctx)"));
    }
    if (!o.no_stats) strata::cli::print_stats_line(r.stats);
    recorder.save();
  }
  strata::cli::print_telemetry(session, o.backend, stderr);
}

void setup_chat(CLI::App& sub) {
  auto o = std::make_shared<ChatCliOptions>();
  sub.add_option("-m,--model", o->model, "GGUF model file (default: the bundled model)");
  sub.add_option("--system", o->system, "system prompt");
  sub.add_flag("--think", o->think, "ask the model to reason before answering");
  sub.add_flag("--no-think", o->no_think, "ask the model to answer directly (empty think block)");
  sub.add_flag("--chatml", o->chatml, "use ChatML even when the GGUF's chat template is not recognised");
  sub.add_flag("--no-stats", o->no_stats, "do not print a speed line after each reply");
  sub.add_option("-n,--n-predict", o->n_predict, "most tokens per reply (default 1024)");
  sub.add_option("-c,--ctx,--ctx-size", o->ctx, "context size in tokens (default: the model's, at most 4096)");
  strata::cli::add_thread_options(sub, o->threads);
  strata::cli::add_sampling_options(sub, o->sampling);
  strata::cli::add_backend_options(sub, o->backend);
  strata::cli::add_spec_options(sub, o->spec);
  sub.callback([o] {
    strata::cli::check_backend_options(o->backend);
    o->spec_choice = strata::check_spec_options(o->spec);
    run_chat(*o);
  });
}

const bool registered = strata::cli::register_command("chat", "Chat with a model interactively", setup_chat);

}  // namespace
