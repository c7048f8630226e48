// The GPT-2 byte-to-unicode table of byte-level BPE: every byte is shown as one printable code point
// (printable Latin-1 bytes as themselves, the other 68 bytes as U+0100 onwards, in byte order).
// Vocabularies (tokenizer.json, GGUF tokenizer.ggml.tokens) store normal tokens in this form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

// The code point that stands for `byte`.
uint32_t byte_to_unicode(uint8_t byte);

// Maps raw bytes to their byte-level form (UTF-8 of the stand-in code points).
std::string bytes_to_byte_level(std::string_view raw);

// Maps a byte-level string back to raw bytes; nullopt when it holds a code point that stands for no byte.
std::optional<std::string> byte_level_to_bytes(std::string_view text);

}  // namespace strata
