// Converting rows between float32 and the block formats of types.h.
#pragma once

#include <cstdint>

#include "strata/quant/types.h"

namespace strata {

// Decodes n elements (a whole number of blocks) of `type` at src into dst. Every type in types.h.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Encodes n floats (a whole number of blocks) into `type` at dst (row_bytes(type, n) bytes).
// Supported where TypeTraits::can_quantize; others throw strata::Error naming the type.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace strata
