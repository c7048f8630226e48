// The vocabulary of a byte-level BPE tokenizer as plain data, read from a GGUF file or from a Hugging
// Face tokenizer directory, and written back to GGUF under the keys GGUF files in the wild use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

class GgufFile;
class GgufWriter;

// tokenizer.ggml.token_type values.
enum TokenType : int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,      // special tokens (HF added tokens with "special": true)
  kTokenUserDefined = 4,  // HF added tokens with "special": false
  kTokenUnused = 5,       // padding rows ("[PAD123]")
  kTokenByte = 6,
};

struct Vocab {
  // Normal tokens in the GPT-2 byte-to-unicode form; control/user-defined tokens as their raw text.
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // one TokenType per token
  std::vector<std::string> merges;   // "left right", by rank (first = highest priority)
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t pad_id = -1;
  std::string pre;            // pre-tokenizer name: "qwen2" or "qwen35"
  std::string chat_template;  // may be empty
  bool add_bos = false;
};

// Reads tokenizer.ggml.* and tokenizer.chat_template. Throws strata::Error naming the file and key
// when the model is not "gpt2" or a key is missing or inconsistent.
Vocab vocab_from_gguf(const GgufFile& file);

// Reads DIR/tokenizer.json (+ DIR/tokenizer_config.json when present, for the chat template, bos/eos
// names and add_bos_token). The pre-tokenizer name is derived from the split regex (qwen2 / qwen35).
Vocab vocab_from_hf_dir(const std::string& dir);

// Appends "[PAD<id>]" tokens of type unused until the vocabulary has `n_vocab` entries (models pad
// their embedding rows beyond the tokenizer's vocabulary). Throws when it already has more.
void pad_vocab(Vocab& vocab, int32_t n_vocab);

// Writes tokenizer.ggml.model = "gpt2", .pre, .tokens, .token_type, .merges, .bos/.eos/.padding
// token ids (when present), .add_bos_token and tokenizer.chat_template (when not empty).
void write_vocab_to_gguf(const Vocab& vocab, GgufWriter& writer);

// Checks internal consistency (sizes match, ids in range); throws strata::Error naming `where`.
void validate_vocab(const Vocab& vocab, const std::string& where);

}  // namespace strata
