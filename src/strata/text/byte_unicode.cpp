#include "strata/text/byte_unicode.h"

#include <array>

#include "strata/text/utf8.h"

namespace strata {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};  // every stand-in code point is below 512
  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_unicode(uint8_t byte) { return tables().to_cp[byte]; }

std::string bytes_to_byte_level(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) utf8::append(out, tables().to_cp[static_cast<uint8_t>(c)]);
  return out;
}

std::optional<std::string> byte_level_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t len = utf8::decode(text, i, &cp);
    if (len == 0 || cp >= 512 || tables().to_byte[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(tables().to_byte[cp]));
    i += len;
  }
  return out;
}

}  // namespace strata
