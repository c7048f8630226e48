// Tokenizer tests against Hugging Face `tokenizers` (expected ids in tests/fixtures/tokenizer/*.ids,
// written by tools/make_tokenizer_expected.py) plus properties that need no reference: byte-exact
// decode roundtrip, special-token handling, streaming detokenization.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/text/byte_unicode.h"
#include "strata/text/detokenizer.h"
#include "strata/text/tokenizer.h"
#include "strata/text/unicode_nfc.h"
#include "strata/text/utf8.h"
#include "strata/text/vocab.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

const std::string kTokDir = std::string(STRATA_SOURCE_DIR) + "/build-data/qwen3-tokenizer";
const std::string kFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/tokenizer";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

class Qwen3Tokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kTokDir + "/tokenizer.json")) return;
    tok_ = std::make_unique<Tokenizer>(vocab_from_hf_dir(kTokDir));
  }
  void SetUp() override {
    ASSERT_TRUE(tok_) << "missing " << kTokDir << "/tokenizer.json: run scripts/fetch-test-data";
  }
  static std::unique_ptr<Tokenizer> tok_;
};
std::unique_ptr<Tokenizer> Qwen3Tokenizer::tok_;

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(kFixtures)) {
    if (e.path().extension() == ".txt") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_F(Qwen3Tokenizer, MatchesHuggingFaceOnFixtures) {
  const auto names = fixture_names();
  ASSERT_GE(names.size(), 10u);
  for (const auto& name : names) {
    const std::string ids_path = kFixtures + "/" + name + ".ids";
    ASSERT_TRUE(fs::exists(ids_path)) << ids_path << " is missing: run tools/make_tokenizer_expected.py on the GPU "
                                      << "machine (see its docstring) and commit the .ids files";
    std::string expected = read_file(ids_path);
    while (!expected.empty() && (expected.back() == '\n' || expected.back() == '\r')) expected.pop_back();
    const std::string text = read_file(kFixtures + "/" + name + ".txt");
    EXPECT_EQ(join_ids(tok_->encode(text)), expected) << "fixture " << name;
  }
}

TEST_F(Qwen3Tokenizer, DecodeRoundtripsFixturesByteForByte) {
  for (const auto& name : fixture_names()) {
    const std::string text = read_file(kFixtures + "/" + name + ".txt");
    // normalization.txt is not NFC on purpose: encoding normalizes it first, as HF does.
    const std::string want = name == "normalization" ? read_file(kFixtures + "/normalization.nfc") : text;
    EXPECT_EQ(tok_->decode(tok_->encode(text)), want) << "fixture " << name;
    EXPECT_EQ(tok_->decode(tok_->encode(text, /*parse_special=*/false)), want) << "fixture " << name;
  }
}

TEST(Nfc, MatchesPythonUnicodedata) {
  // normalization.nfc was written by Python's unicodedata.normalize("NFC", ...).
  EXPECT_EQ(nfc_normalize(read_file(kFixtures + "/normalization.txt")), read_file(kFixtures + "/normalization.nfc"));
  EXPECT_FALSE(nfc_quick_check("e\xcc\x81"));  // e + U+0301
  EXPECT_TRUE(nfc_quick_check("plain ASCII and caf\xc3\xa9"));
  EXPECT_EQ(nfc_normalize("e\xcc\x81"), "\xc3\xa9");
  // Invalid bytes pass through and block composition.
  EXPECT_EQ(nfc_normalize("e\xff\xcc\x81"), "e\xff\xcc\x81");
}

TEST_F(Qwen3Tokenizer, SingleTokenWordsMapToTheirVocabularyIds) {
  // Independent lookup: read the vocabulary straight from tokenizer.json.
  const auto tj = nlohmann::json::parse(read_file(kTokDir + "/tokenizer.json"));
  const auto& vocab = tj.at("model").at("vocab");
  for (const char* word : {"hello", "Hello", " world", " the", "\n", "  ", "{", " function", "ing"}) {
    const std::string stored = bytes_to_byte_level(word);
    ASSERT_TRUE(vocab.contains(stored)) << word;
    EXPECT_EQ(tok_->encode(word), std::vector<int32_t>{vocab.at(stored).get<int32_t>()}) << word;
  }
  // Every added token maps to its id, and special ones are control tokens.
  for (const auto& a : tj.at("added_tokens")) {
    const std::string content = a.at("content").get<std::string>();
    const int32_t id = a.at("id").get<int32_t>();
    EXPECT_EQ(tok_->encode(content), std::vector<int32_t>{id}) << content;
    EXPECT_EQ(tok_->is_special(id), a.at("special").get<bool>()) << content;
    EXPECT_EQ(tok_->find_token(content), id);
  }
}

TEST_F(Qwen3Tokenizer, SpecialTokensFollowParseSpecial) {
  const int32_t im_start = *tok_->find_token("<|im_start|>");
  const int32_t tool_call = *tok_->find_token("<tool_call>");
  const std::string text = "<|im_start|>user\n<tool_call>x";
  const auto with = tok_->encode(text, true);
  const auto without = tok_->encode(text, false);
  EXPECT_EQ(with.front(), im_start);
  EXPECT_EQ(std::count(without.begin(), without.end(), im_start), 0);
  // Non-special added tokens are recognised either way (as HF does with encode_special_tokens).
  EXPECT_EQ(std::count(without.begin(), without.end(), tool_call), 1);
  EXPECT_EQ(tok_->decode(without), text);
  // skip_special drops control tokens only.
  EXPECT_EQ(tok_->decode(with, /*skip_special=*/true), "user\n<tool_call>x");
  EXPECT_EQ(tok_->eos_id(), *tok_->find_token("<|im_end|>"));
  EXPECT_TRUE(tok_->is_end_of_generation(*tok_->find_token("<|endoftext|>")));
  EXPECT_FALSE(tok_->is_end_of_generation(tool_call));
}

TEST_F(Qwen3Tokenizer, InvalidUtf8RoundtripsExactly) {
  const std::vector<std::string> cases = {
      "\xff\xfe", "abc\xe4\xbd", "\xc0\xaf overlong", "\xed\xa0\x80 surrogate", "\x80\x80\x80",
      "mixed \xe4\xbd\xa0\xe5\xa5 \xf0\x9f\x8e", std::string("nul\0byte", 8), "e\xcc", "\xf4\x90\x80\x80"};
  for (const auto& s : cases) EXPECT_EQ(tok_->decode(tok_->encode(s)), s) << join_ids(tok_->encode(s));
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 256);
    ASSERT_EQ(tok_->decode(tok_->encode(s)), s) << "trial " << trial;
  }
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    const auto ids = tok_->encode(s);
    ASSERT_EQ(ids.size(), 1u) << b;
    EXPECT_EQ(tok_->token_text(ids[0]), s);
  }
}

TEST_F(Qwen3Tokenizer, StreamingDetokenizerNeverSplitsACharacter) {
  const std::string text = read_file(kFixtures + "/emoji.txt") + read_file(kFixtures + "/cjk.txt") + "\xff tail";
  const auto ids = tok_->encode(text);
  StreamingDetokenizer detok(*tok_);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    // Every chunk ends on a character boundary (no unfinished UTF-8 sequence at its end).
    EXPECT_EQ(utf8::complete_prefix(piece), piece.size());
    all += piece;
  }
  all += detok.flush();
  EXPECT_EQ(all, text);

  // A 4-byte emoji fed as its single-byte tokens comes out only when complete.
  const std::string emoji = "\xf0\x9f\x8e\x89";
  StreamingDetokenizer d2(*tok_);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d2.push(tok_->encode(emoji.substr(i, 1))[0]), "");
  }
  EXPECT_EQ(d2.pending_bytes(), 3u);
  EXPECT_EQ(d2.push(tok_->encode(emoji.substr(3, 1))[0]), emoji);
  // An unfinished character at the end comes out of flush().
  EXPECT_EQ(d2.push(tok_->encode(emoji.substr(0, 1))[0]), "");
  EXPECT_EQ(d2.flush(), emoji.substr(0, 1));
}

TEST(Utf8, CompletePrefix) {
  EXPECT_EQ(utf8::complete_prefix("abc"), 3u);
  EXPECT_EQ(utf8::complete_prefix("ab\xe4\xbd"), 2u);
  EXPECT_EQ(utf8::complete_prefix("ab\xe4\xbd\xa0"), 5u);
  EXPECT_EQ(utf8::complete_prefix("\xf0\x9f\x8e"), 0u);
  EXPECT_EQ(utf8::complete_prefix("a\xff"), 2u);          // never valid: emitted
  EXPECT_EQ(utf8::complete_prefix("a\xe0\x80"), 3u);      // overlong start: emitted
  EXPECT_EQ(utf8::complete_prefix("a\xed\xa0"), 3u);      // surrogate start: emitted
}

TEST_F(Qwen3Tokenizer, VocabRoundtripsThroughGguf) {
  Vocab v = tok_->vocab();
  pad_vocab(v, 151936);
  EXPECT_EQ(v.tokens.size(), 151936u);
  EXPECT_EQ(v.token_types.back(), kTokenUnused);
  const std::string path = std::string(STRATA_BINARY_DIR) + "/test_tokenizer_vocab.gguf";
  {
    GgufWriter w;
    write_vocab_to_gguf(v, w);
    w.write(path);
  }
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  const Vocab back = vocab_from_gguf(f);
  EXPECT_EQ(back.tokens, v.tokens);
  EXPECT_EQ(back.token_types, v.token_types);
  EXPECT_EQ(back.merges, v.merges);
  EXPECT_EQ(back.eos_id, v.eos_id);
  EXPECT_EQ(back.pad_id, v.pad_id);
  EXPECT_EQ(back.bos_id, v.bos_id);
  EXPECT_EQ(back.pre, "qwen2");
  EXPECT_EQ(back.chat_template, v.chat_template);
  EXPECT_EQ(back.add_bos, v.add_bos);
  // A tokenizer from the GGUF encodes like the one from tokenizer.json; padding decodes to nothing.
  const Tokenizer from_gguf(back);
  const std::string text = read_file(kFixtures + "/code.txt") + "<|im_end|>";
  EXPECT_EQ(from_gguf.encode(text), tok_->encode(text));
  EXPECT_EQ(from_gguf.decode({151935}), "");
  std::remove(path.c_str());
}

TEST(TokenizerErrors, UnsupportedInputsFailLoudly) {
  Vocab v;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
  v.token_types.assign(256, kTokenNormal);
  v.pre = "llama3";
  try {
    Tokenizer t(v);
    FAIL() << "unknown pre-tokenizer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama3"), std::string::npos) << e.what();
  }
  v.pre = "qwen35";
  v.merges = {"a zz"};
  EXPECT_THROW(Tokenizer{v}, Error);
  v.merges = {};
  const Tokenizer t(v);  // bytes only: every byte is its own token
  EXPECT_EQ(t.encode("ab"), (std::vector<int32_t>{t.find_token("a").value(), t.find_token("b").value()}));
  EXPECT_THROW(t.decode({256}), Error);
  EXPECT_THROW(t.decode({-1}), Error);
}

TEST(TokenizerQwen35, CombiningMarksStayWithLetters) {
  // With only byte tokens, the ids show nothing of the split; check the pre-tokenizer directly.
  std::vector<std::string_view> q2, q35;
  const std::string text = "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87";  // नमस्ते
  PreTokenizer("qwen2").split(text, q2);
  PreTokenizer("qwen35").split(text, q35);
  EXPECT_EQ(q35.size(), 1u);  // letters and marks in one word
  EXPECT_GT(q2.size(), 1u);   // qwen2 splits at the vowel signs (\p{M} is not \p{L})
}

TEST_F(Qwen3Tokenizer, CliPrintsTheSameIds) {
  const std::string txt = kFixtures + "/specials.txt";
  const std::string cmd = std::string(STRATA_CLI) + " tokenize --hf " + kTokDir + " --file " + txt;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << cmd;
  EXPECT_EQ(out, read_file(kFixtures + "/specials.ids"));
  const std::string text = read_file(txt);
  EXPECT_EQ(out, join_ids(tok_->encode(text)) + "\n");
}
