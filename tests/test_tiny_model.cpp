// The bundled model (models/strata-tiny.gguf, converted from the bf16 checkpoint trained by
// tools/train_tiny/train.py) against the Hugging Face reference recorded at training time
// (tests/fixtures/tiny/greedy_reference.json + reference_logits.bin: transformers, fp32 compute on
// the same bf16 weights). Checks our tokenizer on this vocabulary, logits, and greedy continuations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/gguf.h"
#include "strata/text/tokenizer.h"
#include "strata/text/vocab.h"

namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(STRATA_SOURCE_DIR) / "models" / "strata-tiny.gguf";
const fs::path kFixtures = fs::path(STRATA_SOURCE_DIR) / "tests" / "fixtures" / "tiny";

nlohmann::json load_reference() {
  std::ifstream in(kFixtures / "greedy_reference.json");
  if (!in) throw std::runtime_error("missing " + (kFixtures / "greedy_reference.json").string());
  return nlohmann::json::parse(in);
}

std::vector<float> load_reference_logits() {
  std::ifstream in(kFixtures / "reference_logits.bin", std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("missing reference_logits.bin");
  const auto size = static_cast<size_t>(in.tellg());
  std::vector<float> v(size / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

TEST(TinyModel, TokenizerMatchesHfOnEveryPrompt) {
  const nlohmann::json ref = load_reference();
  const strata::GgufFile file = strata::GgufFile::open(kModel.string());
  const strata::Tokenizer tok(strata::vocab_from_gguf(file));
  ASSERT_EQ(tok.n_vocab(), ref["vocab_size"].get<int>());
  for (const auto& p : ref["prompts"]) {
    const auto expected = p["prompt_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(p["prompt"].get<std::string>()), expected) << p["prompt"];
  }
}

TEST(TinyModel, LogitsMatchHf) {
  const nlohmann::json ref = load_reference();
  const std::vector<float> ref_logits = load_reference_logits();
  auto model = strata::Model::load(kModel.string());
  const int64_t vocab = model->config().n_vocab;
  ASSERT_EQ(vocab, ref["vocab_size"].get<int64_t>());
  for (const auto& p : ref["prompts"]) {
    const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto rows = p["logits_rows"].get<std::vector<size_t>>();
    ASSERT_EQ(rows[1] - rows[0], ids.size());
    ASSERT_LE(rows[1] * static_cast<size_t>(vocab), ref_logits.size());
    strata::Session s(*model, static_cast<int>(ids.size()));
    std::vector<float> ours(ids.size() * static_cast<size_t>(vocab));
    s.forward(ids.data(), static_cast<int>(ids.size()), ours.data(), true);
    // Relative error per position: max|ours - hf| / max|hf|; worst over the prompt.
    double worst = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* a = ours.data() + t * static_cast<size_t>(vocab);
      const float* b = ref_logits.data() + (rows[0] + t) * static_cast<size_t>(vocab);
      double num = 0, den = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        num = std::max(num, double(std::fabs(a[i] - b[i])));
        den = std::max(den, double(std::fabs(b[i])));
      }
      worst = std::max(worst, num / den);
    }
    std::printf("%-40s max relative error %.3g\n", p["prompt"].dump().substr(0, 40).c_str(), worst);
    EXPECT_LE(worst, 1e-4) << p["prompt"];
  }
}

TEST(TinyModel, GreedyContinuationEqualsHf) {
  const nlohmann::json ref = load_reference();
  auto model = strata::Model::load(kModel.string());
  for (const auto& p : ref["prompts"]) {
    const auto ids = p["prompt_ids"].get<std::vector<int32_t>>();
    const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
    strata::Session s(*model, static_cast<int>(ids.size() + expected.size()));
    EXPECT_EQ(strata::generate_greedy(s, ids, static_cast<int>(expected.size())), expected) << p["prompt"];
  }
}

}  // namespace
