// Byte-level BPE tokenizer (GGUF tokenizer.ggml.model = "gpt2"), encoding and decoding exactly as
// Hugging Face `tokenizers` does for the Qwen family:
//   1. added tokens (control + user-defined) are cut out of the raw text first, leftmost-longest;
//   2. the rest is NFC-normalized and split by the family's pre-tokenizer regex;
//   3. each word's bytes are merged by BPE merge rank (lowest rank first, leftmost on ties).
// encode() never adds BOS/EOS: callers add vocab().bos_id when vocab().add_bos says so.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "strata/text/pretokenizer.h"
#include "strata/text/vocab.h"

namespace strata {

class Tokenizer {
 public:
  // Validates the vocabulary and builds the lookup tables; throws strata::Error on any inconsistency
  // (unknown pre-tokenizer, a merge whose parts or result are not tokens, a missing byte token, ...).
  explicit Tokenizer(Vocab vocab);
  ~Tokenizer();

  // parse_special = true: special (control) tokens written in the text become their ids, as HF does.
  // false: they are encoded as plain text. User-defined added tokens (e.g. <tool_call>, <think>) are
  // recognised either way, as HF recognises non-special added tokens. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

  // Concatenated raw bytes of the tokens (not necessarily valid UTF-8; HF would show U+FFFD where a
  // sequence is broken). skip_special drops control tokens. Throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // Raw bytes of one token: what decode() writes for it ("" for unused padding tokens).
  const std::string& token_text(int32_t id) const;

  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  int32_t eos_id() const { return vocab_.eos_id; }
  int32_t bos_id() const { return vocab_.bos_id; }
  bool is_special(int32_t id) const;  // control token
  // True for tokens that end a turn: eos and the family's end markers (<|im_end|>, <|endoftext|>).
  bool is_end_of_generation(int32_t id) const;
  // The id of the token whose raw text is `piece` (normal or added), if any.
  std::optional<int32_t> find_token(std::string_view piece) const;
  const Vocab& vocab() const { return vocab_; }

 private:
  struct AddedToken {
    std::string text;
    int32_t id;
    bool special;
  };
  struct MergeTarget {
    int32_t rank;
    int32_t merged;
  };

  void check_id(int32_t id) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  const MergeTarget* find_merge(int32_t left, int32_t right) const;

  Vocab vocab_;
  std::vector<std::string> raw_;                          // raw bytes per id
  std::unordered_map<std::string, int32_t> raw_to_id_;    // every token's raw text -> id
  std::array<int32_t, 256> byte_ids_{};                   // single-byte normal token per byte
  std::unordered_map<uint64_t, MergeTarget> merges_;      // (left << 32 | right) -> rank, result
  std::vector<AddedToken> added_;                         // longest first
  std::array<bool, 256> added_first_byte_{};
  std::vector<int32_t> end_ids_;
  std::unique_ptr<PreTokenizer> pre_;

  // Words seen before -> their ids (text repeats words a lot; this is most of encode's speed).
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace strata
