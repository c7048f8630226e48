// Quantisers of the K-quant super-block formats (256 weights per block), used by quantize_row.
#pragma once

#include <cstdint>

namespace strata::quant_detail {

void quantize_q4_k(const float* x, uint8_t* dst, int64_t nb);
void quantize_q5_k(const float* x, uint8_t* dst, int64_t nb);
void quantize_q6_k(const float* x, uint8_t* dst, int64_t nb);
void quantize_q8_k(const float* x, uint8_t* dst, int64_t nb);

}  // namespace strata::quant_detail
