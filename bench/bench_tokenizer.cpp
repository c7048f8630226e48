// Tokenizer encode throughput on one core (target: >= 5 MB/s).
// Run from the repository root (or set STRATA_TOKENIZER_DIR) after scripts/fetch-test-data:
//   build/bench/bench_tokenizer
// Two corpora: the tokenizer fixtures repeated (text with the usual word repetition, the word cache
// helps) and synthetic text of mostly unique random words (cache misses: the BPE worst case).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"

namespace {

std::string dir_or_default(const char* env, const char* def) {
  const char* v = std::getenv(env);
  return v ? v : def;
}

const strata::Tokenizer& tokenizer() {
  static const strata::Tokenizer tok(
      strata::vocab_from_hf_dir(dir_or_default("STRATA_TOKENIZER_DIR", "build-data/qwen3-tokenizer")));
  return tok;
}

std::string fixture_corpus() {
  std::string all;
  for (const auto& e : std::filesystem::directory_iterator("tests/fixtures/tokenizer")) {
    if (e.path().extension() != ".txt") continue;
    std::ifstream in(e.path(), std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    all += ss.str();
  }
  std::string out;
  while (out.size() < (4u << 20)) out += all;
  return out;
}

std::string random_word_corpus() {
  std::mt19937 rng(42);
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  const std::string punct = ".,;:!?()[]{}<>-_=+*/\"'";
  std::string out;
  while (out.size() < (4u << 20)) {
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) out += letters[rng() % letters.size()];
    const unsigned r = rng() % 10;
    if (r == 0) out += punct[rng() % punct.size()];
    if (r == 1) out += std::to_string(rng() % 100000);
    out += (rng() % 12 == 0) ? '\n' : ' ';
  }
  return out;
}

void run(benchmark::State& state, const std::string& text) {
  const auto& tok = tokenizer();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}

void BM_EncodeFixtures(benchmark::State& state) {
  static const std::string text = fixture_corpus();
  run(state, text);
}
void BM_EncodeRandomWords(benchmark::State& state) {
  static const std::string text = random_word_corpus();
  run(state, text);
}

BENCHMARK(BM_EncodeFixtures)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_EncodeRandomWords)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
