// Small UTF-8 helpers shared by the tokenizer pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::utf8 {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 when the bytes there are not a
// valid, shortest-form sequence of a Unicode scalar value. Sets *cp when valid.
size_t decode(std::string_view s, size_t i, uint32_t* cp);

// Appends the UTF-8 encoding of a Unicode scalar value.
void append(std::string& out, uint32_t cp);

// Length of the longest prefix of `s` that ends on a complete UTF-8 sequence boundary, treating a
// trailing incomplete (but so far valid) sequence as "not yet complete". Invalid bytes count as
// complete (they will never become valid by appending).
size_t complete_prefix(std::string_view s);

}  // namespace strata::utf8
