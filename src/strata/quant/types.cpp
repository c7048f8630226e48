#include "strata/quant/types.h"

#include <array>
#include <cctype>

#include "strata/base/error.h"

namespace strata {
namespace {

constexpr std::array<TypeTraits, 16> kTypes = {{
    {GgmlType::F32, "f32", 1, 4, true},
    {GgmlType::F16, "f16", 1, 2, true},
    {GgmlType::Q4_0, "q4_0", 32, 18, true},
    {GgmlType::Q4_1, "q4_1", 32, 20, false},
    {GgmlType::Q5_0, "q5_0", 32, 22, false},
    {GgmlType::Q5_1, "q5_1", 32, 24, false},
    {GgmlType::Q8_0, "q8_0", 32, 34, true},
    {GgmlType::Q2_K, "q2_k", 256, 84, false},
    {GgmlType::Q3_K, "q3_k", 256, 110, false},
    {GgmlType::Q4_K, "q4_k", 256, 144, true},
    {GgmlType::Q5_K, "q5_k", 256, 176, true},
    {GgmlType::Q6_K, "q6_k", 256, 210, true},
    {GgmlType::Q8_K, "q8_k", 256, 292, true},
    {GgmlType::IQ4_NL, "iq4_nl", 32, 18, false},
    {GgmlType::BF16, "bf16", 1, 2, true},
    {GgmlType::MXFP4, "mxfp4", 32, 17, false},
}};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

const TypeTraits* find_type(uint32_t id) {
  for (const auto& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const TypeTraits& type_traits(GgmlType type) {
  const TypeTraits* t = find_type(static_cast<uint32_t>(type));
  if (t == nullptr) fail("internal: no traits for ggml type ", static_cast<uint32_t>(type));
  return *t;
}

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (const auto& t : kTypes) {
    if (iequals(name, t.name)) return t.type;
  }
  return std::nullopt;
}

const char* ggml_type_name(uint32_t id) {
  if (const TypeTraits* t = find_type(id)) return t->name;
  // Ids of the public spec that strata does not implement, named so errors are actionable.
  switch (id) {
    case 4: return "q4_2 (removed)";
    case 5: return "q4_3 (removed)";
    case 9: return "q8_1";
    case 16: return "iq2_xxs";
    case 17: return "iq2_xs";
    case 18: return "iq3_xxs";
    case 19: return "iq1_s";
    case 21: return "iq3_s";
    case 22: return "iq2_s";
    case 23: return "iq4_xs";
    case 24: return "i8";
    case 25: return "i16";
    case 26: return "i32";
    case 27: return "i64";
    case 28: return "f64";
    case 29: return "iq1_m";
    case 34: return "tq1_0";
    case 35: return "tq2_0";
    default: return "unknown";
  }
}

size_t row_bytes(GgmlType type, int64_t n) {
  const TypeTraits& t = type_traits(type);
  if (n < 0 || n % t.block_elems != 0)
    fail("row of ", n, " elements is not a whole number of ", t.name, " blocks (", t.block_elems, ")");
  return static_cast<size_t>(n / t.block_elems) * t.block_bytes;
}

}  // namespace strata
