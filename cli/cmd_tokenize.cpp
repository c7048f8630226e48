// `strata tokenize`: prints the token ids of a text, comma-separated on one line, the way Hugging
// Face `tokenizers` encodes it. The tokenizer comes from a GGUF model (-m) or straight from a Hugging
// Face tokenizer directory (--hf, the same reader the converter uses). --bench times encoding instead.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "cli/generation_cli.h"
#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"

namespace {

struct TokenizeOptions {
  std::string model;
  std::string hf_dir;
  std::string file;
  std::string text;
  bool no_special = false;
  int bench_rounds = 0;
};

void run_tokenize(const TokenizeOptions& o) {
  if (!o.model.empty() && !o.hf_dir.empty()) strata::fail("tokenize: give either -m MODEL.gguf or --hf DIR, not both");
  if (o.file.empty() == o.text.empty()) strata::fail("tokenize: give exactly one of --file TEXT or --text STR");
  const strata::Vocab vocab =
      !o.hf_dir.empty() ? strata::vocab_from_hf_dir(o.hf_dir)
                         : strata::vocab_from_gguf(strata::GgufFile::open(strata::cli::resolve_model_path(o.model)));
  const strata::Tokenizer tok(vocab);
  const std::string text = o.file.empty() ? o.text : strata::cli::read_text_file(o.file, "text file");

  if (o.bench_rounds > 0) {
    // One core, the whole text per round; the word cache starts empty in round 1 (a fresh tokenizer).
    for (int r = 1; r <= o.bench_rounds; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok.encode(text, !o.no_special);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("round %d: %zu bytes -> %zu tokens in %.3f s: %.2f MB/s\n", r, text.size(), ids.size(), s,
                  static_cast<double>(text.size()) / s / 1e6);
    }
    return;
  }

  const auto ids = tok.encode(text, !o.no_special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
}

void setup_tokenize(CLI::App& sub) {
  auto o = std::make_shared<TokenizeOptions>();
  sub.add_option("-m,--model", o->model, "GGUF model whose tokenizer to use (default: the bundled model)");
  sub.add_option("--hf", o->hf_dir, "Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json)");
  sub.add_option("--file", o->file, "text file to tokenize (bytes as they are)");
  sub.add_option("--text", o->text, "text to tokenize");
  sub.add_flag("--no-special", o->no_special, "treat special tokens written in the text as plain text");
  sub.add_option("--bench", o->bench_rounds, "instead of printing ids, time N rounds of encoding (MB/s)");
  sub.callback([o] { run_tokenize(*o); });
}

const bool registered = strata::cli::register_command("tokenize", "Print the token ids of a text", setup_tokenize);

}  // namespace
