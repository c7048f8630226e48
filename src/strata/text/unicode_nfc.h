// Unicode Normalization Form C, as the Hugging Face `tokenizers` NFC normalizer applies it to text
// before pre-tokenization (Qwen tokenizer.json: "normalizer": {"type": "NFC"}).
// Invalid UTF-8 bytes are kept as they are and block composition across them.
#pragma once

#include <string>
#include <string_view>

namespace strata {

// True when `text` is certainly NFC already (fast check; false means "normalize to find out").
bool nfc_quick_check(std::string_view text);

// Returns the NFC form of `text`. Bytes that are not valid UTF-8 pass through unchanged.
std::string nfc_normalize(std::string_view text);

}  // namespace strata
