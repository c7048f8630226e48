// NFC = canonical decomposition, canonical ordering, canonical composition (Unicode Standard
// Annex #15). Tables come from unicode_nfc_data.cpp; Hangul syllables are handled arithmetically
// (Unicode Standard, section 3.12).
#include "strata/text/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "strata/text/unicode_nfc_data.h"
#include "strata/text/utf8.h"

namespace strata {
namespace {

using namespace nfc_data;

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28;
constexpr uint32_t kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;
// Invalid input bytes travel through the code point buffer as kRawByte + byte: a "starter" that
// nothing composes with, written back as the original byte.
constexpr uint32_t kRawByte = 0x110000;

bool maybe_changes(uint32_t cp) {
  const Range* end = kMaybeChanges + kMaybeChangesCount;
  const Range* it = std::upper_bound(kMaybeChanges, end, cp, [](uint32_t c, const Range& r) { return c < r.lo; });
  return it != kMaybeChanges && cp <= (it - 1)->hi;
}

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CombiningClass* end = kCombiningClass + kCombiningClassCount;
  const CombiningClass* it =
      std::lower_bound(kCombiningClass, end, cp, [](const CombiningClass& e, uint32_t c) { return e.cp < c; });
  return (it != end && it->cp == cp) ? it->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecomposition + kDecompositionCount;
  const Decomposition* it =
      std::lower_bound(kDecomposition, end, cp, [](const Decomposition& e, uint32_t c) { return e.cp < c; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

// The primary composite of (a, b), or 0 when there is none.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const Composition* end = kComposition + kCompositionCount;
  const Composition* it = std::lower_bound(kComposition, end, std::pair<uint32_t, uint32_t>(a, b),
                                           [](const Composition& e, const std::pair<uint32_t, uint32_t>& k) {
                                             return e.first < k.first || (e.first == k.first && e.second < k.second);
                                           });
  return (it != end && it->first == a && it->second == b) ? it->composite : 0;
}

}  // namespace

bool nfc_quick_check(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<uint8_t>(text[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t len = utf8::decode(text, i, &cp);
    if (len == 0) {
      ++i;  // an invalid byte is left alone
      continue;
    }
    if (cp >= 0x300 && maybe_changes(cp)) return false;  // nothing below U+0300 changes or combines
    i += len;
  }
  return true;
}

std::string nfc_normalize(std::string_view text) {
  if (nfc_quick_check(text)) return std::string(text);

  // 1. Canonical decomposition.
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const size_t len = utf8::decode(text, i, &cp);
    if (len == 0) {
      cps.push_back(kRawByte + static_cast<uint8_t>(text[i]));
      ++i;
      continue;
    }
    decompose(cp, cps);
    i += len;
  }
  auto ccc = [](uint32_t cp) -> uint8_t { return cp >= kRawByte ? 0 : combining_class(cp); };

  // 2. Canonical ordering: stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (ccc(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [&](uint32_t a, uint32_t b) { return ccc(a) < ccc(b); });
    i = j;
  }

  // 3. Canonical composition: a character joins the last starter unless blocked by a character
  //    in between whose class is 0 or not lower than its own.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  ptrdiff_t starter = -1;
  uint8_t last_cc = 0;
  for (uint32_t cp : cps) {
    const uint8_t cc = ccc(cp);
    if (starter >= 0 && cp < kRawByte && out[static_cast<size_t>(starter)] < kRawByte) {
      const bool adjacent = static_cast<size_t>(starter) + 1 == out.size();
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        const uint32_t composite = compose_pair(out[static_cast<size_t>(starter)], cp);
        if (composite != 0) {
          out[static_cast<size_t>(starter)] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<ptrdiff_t>(out.size());
    out.push_back(cp);
    last_cc = cc;
  }

  std::string result;
  result.reserve(text.size());
  for (uint32_t cp : out) {
    if (cp >= kRawByte) result.push_back(static_cast<char>(cp - kRawByte));
    else utf8::append(result, cp);
  }
  return result;
}

}  // namespace strata
