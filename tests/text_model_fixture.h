// A small model that takes text, for the generation and `strata run/chat` tests: the qwen3_5_moe HF
// fixture converted to F32 GGUF (vocabulary of 512, no tokenizer in the checkpoint) plus a
// byte-level tokenizer written here: the 256 byte tokens, ChatML control tokens, <think>/</think>,
// the rest normal tokens with text. Its weights are random, so its text is noise, but every token id has text and
// the ChatML markers are real special tokens, which is what the generation plumbing needs.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "strata/base/error.h"
#include "strata/convert/converter.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/text/byte_unicode.h"
#include "strata/text/vocab.h"

namespace strata::testing_fixture {

inline std::string fixture_dir() { return std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/hf/qwen3_5_moe"; }

inline Vocab byte_vocab(int32_t n_vocab) {
  Vocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
    v.token_types.push_back(kTokenNormal);
  }
  auto add = [&](const char* text, TokenType type) {
    v.tokens.push_back(text);
    v.token_types.push_back(type);
    return static_cast<int32_t>(v.tokens.size() - 1);
  };
  v.eos_id = add("<|endoftext|>", kTokenControl);
  add("<|im_start|>", kTokenControl);
  add("<|im_end|>", kTokenControl);
  add("<think>", kTokenUserDefined);
  add("</think>", kTokenUserDefined);
  v.pad_id = v.eos_id;
  v.pre = "qwen2";
  v.chat_template = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}";
  // The remaining ids are normal tokens with text of their own ("<300>"), so that whatever a random
  // model picks prints something (BPE never produces them: no merge leads there).
  for (int32_t id = static_cast<int32_t>(v.tokens.size()); id < n_vocab; ++id) {
    v.tokens.push_back(cat("<", id, ">"));
    v.token_types.push_back(kTokenNormal);
  }
  return v;
}

// Converts the fixture (once per process) and writes `<dir>/<name>-<pid>.gguf` with the tokenizer above.
// The pid keeps the tests of one executable, which ctest runs as parallel processes, off each other's files.
// with_tokenizer = false leaves the converted file as is (no tokenizer.* keys).
inline std::string make_text_model(const std::string& name, bool with_tokenizer = true) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(STRATA_BINARY_DIR) / "test_tmp";
  fs::create_directories(dir);
  const std::string tag = name + "-" + std::to_string(::getpid());
  const std::string plain = (dir / (tag + "_plain.gguf")).string();
  convert::ConvertOptions opt;
  opt.hf_dir = fixture_dir();
  opt.out_path = plain;
  opt.type = "f32";
  convert::convert_hf_to_gguf(opt);
  if (!with_tokenizer) return plain;

  const std::string out = (dir / (tag + ".gguf")).string();
  {
    const GgufFile in = GgufFile::open(plain);
    GgufWriter w;
    for (const auto& [key, value] : in.metadata())
      if (key.rfind("tokenizer.", 0) != 0 && key != "general.alignment") w.set(key, value);
    const GgufTensorInfo& embd = in.tensor("token_embd.weight");
    write_vocab_to_gguf(byte_vocab(static_cast<int32_t>(embd.ne[1])), w);
    for (const GgufTensorInfo& t : in.tensors())
      w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.nbytes);
    w.write(out);
  }
  fs::remove(plain);
  return out;
}

}  // namespace strata::testing_fixture
