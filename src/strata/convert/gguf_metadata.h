// The model metadata keys `strata convert` writes (names and value types as llama.cpp reads them).
#pragma once

#include <cstdint>
#include <string>

#include "strata/convert/hf_config.h"

namespace strata {
class GgufWriter;
}

namespace strata::convert {

void write_model_metadata(const HfConfig& cfg, const std::string& model_name, uint32_t file_type, GgufWriter& w);

}  // namespace strata::convert
