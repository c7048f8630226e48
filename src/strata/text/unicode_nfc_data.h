// Unicode Character Database tables for NFC (generated into unicode_nfc_data.cpp by
// tools/gen_unicode_nfc.py). Every table is sorted by its first field.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::nfc_data {

struct CombiningClass { uint32_t cp; uint8_t ccc; };
struct Decomposition { uint32_t cp, first, second; };  // second == 0: singleton decomposition
struct Composition { uint32_t first, second, composite; };
struct Range { uint32_t lo, hi; };  // inclusive

extern const char* const kUnicodeVersion;
extern const CombiningClass kCombiningClass[];
extern const size_t kCombiningClassCount;
extern const Decomposition kDecomposition[];
extern const size_t kDecompositionCount;
extern const Composition kComposition[];
extern const size_t kCompositionCount;
// Code points that may change under NFC or combine with a neighbour (NFC quick check "no"/"maybe",
// non-zero combining class).
extern const Range kMaybeChanges[];
extern const size_t kMaybeChangesCount;

}  // namespace strata::nfc_data
