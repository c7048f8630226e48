#include "strata/text/utf8.h"

namespace strata::utf8 {

size_t decode(std::string_view s, size_t i, uint32_t* cp) {
  const size_t n = s.size();
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  auto cont = [&](size_t k) { return i + k < n && (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80; };
  auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k]) & 0x3F); };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (!cont(1)) return 0;
    *cp = ((b0 & 0x1Fu) << 6) | byte(1);
    return 2;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    const uint32_t c = ((b0 & 0x0Fu) << 12) | (byte(1) << 6) | byte(2);
    if (c < 0x800 || (c >= 0xD800 && c < 0xE000)) return 0;  // overlong or surrogate
    *cp = c;
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    const uint32_t c = ((b0 & 0x07u) << 18) | (byte(1) << 12) | (byte(2) << 6) | byte(3);
    if (c < 0x10000 || c > 0x10FFFF) return 0;
    *cp = c;
    return 4;
  }
  return 0;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t complete_prefix(std::string_view s) {
  // Only the last (up to 3) bytes can be an unfinished sequence.
  const size_t n = s.size();
  const size_t lo = n > 3 ? n - 3 : 0;
  for (size_t i = n; i > lo; --i) {
    const auto b = static_cast<uint8_t>(s[i - 1]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead byte
    size_t need = 0;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) need = 3;
    else if (b >= 0xF0 && b <= 0xF4) need = 4;
    else return n;  // ASCII or a byte that never starts a sequence: everything is final
    const size_t have = n - (i - 1);
    if (have >= need) return n;
    // The bytes so far must be a valid beginning, else they are invalid and final already.
    for (size_t k = i; k < n; ++k) {
      if ((static_cast<uint8_t>(s[k]) & 0xC0) != 0x80) return n;
    }
    if (have >= 2) {
      const auto b1 = static_cast<uint8_t>(s[i]);
      if (b == 0xE0 && b1 < 0xA0) return n;   // overlong
      if (b == 0xED && b1 >= 0xA0) return n;  // surrogate
      if (b == 0xF0 && b1 < 0x90) return n;   // overlong
      if (b == 0xF4 && b1 >= 0x90) return n;  // above U+10FFFF
    }
    return i - 1;
  }
  return n;
}

}  // namespace strata::utf8
