// ggml tensor element types as GGUF files number them, with their block geometry.
// Ids and block sizes follow the public GGUF specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  BF16 = 30,
  MXFP4 = 39,
};

struct TypeTraits {
  GgmlType type;
  const char* name;      // lower-case name as used on the command line: "q4_k", "bf16", ...
  int64_t block_elems;   // weights per block (1 for F32/F16/BF16)
  size_t block_bytes;    // bytes per block
  bool can_quantize;     // quantize_row() supports this type
};

// Traits for a supported type id, or nullptr when strata does not support the id.
const TypeTraits* find_type(uint32_t id);
// Traits for a supported type (never null).
const TypeTraits& type_traits(GgmlType type);
// Case-insensitive lookup by name ("Q4_K", "q8_0", "bf16"); nullopt when unknown.
std::optional<GgmlType> type_from_name(std::string_view name);
// Name of a ggml type id, also for ids strata does not support (for error messages); "unknown" otherwise.
const char* ggml_type_name(uint32_t id);

// Bytes of a row of n elements. Throws strata::Error when n is not a multiple of the block size.
size_t row_bytes(GgmlType type, int64_t n);

}  // namespace strata
