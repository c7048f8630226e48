// Pre-tokenization: splitting text into the words that BPE then encodes one by one, with the split
// regex of the model family, run by PCRE2 (JIT, Unicode properties).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

// The split regex a pre-tokenizer name (GGUF tokenizer.ggml.pre) stands for; throws strata::Error
// naming the supported ones when `name` is unknown.
const std::string& pre_tokenizer_regex(const std::string& name);

// The pre-tokenizer name whose regex is `regex` (as tokenizer.json spells it), or "" when none.
std::string pre_tokenizer_name_for_regex(const std::string& regex);

class PreTokenizer {
 public:
  explicit PreTokenizer(const std::string& name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text` to `out` (views into `text`), in order, covering every byte: matches
  // of the regex and, between them, any run the regex cannot match (only invalid UTF-8 bytes can
  // be left over), so the words always concatenate back to `text`. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  const std::string& name() const { return name_; }

 private:
  struct Impl;
  std::string name_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
