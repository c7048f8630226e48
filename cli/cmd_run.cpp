// `strata run -m MODEL --prompt-tokens 1,2,3 -n N --temp 0 --print-token-ids`: greedy generation from
// a prompt given as token ids, printing the generated ids comma-separated on one stdout line.
// The text-prompt path (tokenizer, sampling) plugs in beside run_token_ids().
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"

namespace {

struct RunOptions {
  std::string model;
  std::string prompt_tokens;
  int n_predict = 16;
  float temp = 0.0f;
  bool print_token_ids = false;
  int ctx = 0;  // 0: prompt + n_predict
  int threads = 0;
};

// Prompt given as token ids: greedy continuation, ids printed on one line.
void run_token_ids(const RunOptions& o) {
  if (o.temp != 0.0f) strata::fail("--temp ", o.temp, ": only greedy decoding (--temp 0) is implemented for --prompt-tokens");
  if (!o.print_token_ids) strata::fail("--prompt-tokens needs --print-token-ids (text output needs the tokenizer)");
  if (o.n_predict < 0) strata::fail("-n must be >= 0, got ", o.n_predict);
  const std::vector<int32_t> prompt = strata::parse_token_list(o.prompt_tokens, "--prompt-tokens");
  strata::set_cpu_threads(o.threads);
  auto model = strata::Model::load(o.model);
  const int needed = static_cast<int>(prompt.size()) + o.n_predict;
  const int ctx = o.ctx > 0 ? o.ctx : needed;
  strata::Session session(*model, ctx);
  const std::vector<int32_t> ids = strata::generate_greedy(session, prompt, o.n_predict);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += strata::cat(i ? "," : "", ids[i]);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void setup_run(CLI::App& sub) {
  auto o = std::make_shared<RunOptions>();
  sub.add_option("-m,--model", o->model, "GGUF model file")->required();
  sub.add_option("--prompt-tokens", o->prompt_tokens, "prompt as comma-separated token ids")->required();
  sub.add_option("-n,--n-predict", o->n_predict, "tokens to generate (default 16)");
  sub.add_option("--temp", o->temp, "sampling temperature (0 = greedy)");
  sub.add_flag("--print-token-ids", o->print_token_ids, "print the generated token ids, comma-separated");
  sub.add_option("--ctx", o->ctx, "context size in tokens (default: prompt + n)");
  sub.add_option("--threads", o->threads, "CPU threads (default: all hardware threads)");
  sub.callback([o] { run_token_ids(*o); });
}

const bool registered = strata::cli::register_command("run", "Generate tokens from a prompt", setup_run);

}  // namespace
