#include "strata/convert/type_policy.h"

#include "strata/base/error.h"

namespace strata::convert {

namespace {

struct Named {
  const char* name;
  GgmlType base;
  bool mix;
  uint32_t file_type;  // llama.cpp's LLAMA_FTYPE numbering, as written to general.file_type
};

constexpr Named kRequests[] = {
    {"f32", GgmlType::F32, false, 0},   {"f16", GgmlType::F16, false, 1},    {"bf16", GgmlType::BF16, false, 32},
    {"q8_0", GgmlType::Q8_0, false, 7}, {"q4_0", GgmlType::Q4_0, false, 2},  {"q4_k", GgmlType::Q4_K, false, 14},
    {"q5_k", GgmlType::Q5_K, false, 16}, {"q6_k", GgmlType::Q6_K, false, 18}, {"q4_k_m", GgmlType::Q4_K, true, 15},
};

bool more_bits_layer(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

bool always_f32(const PlannedTensor& t) {
  if (t.ne.size() == 1) return true;
  switch (t.role) {
    case TensorRole::Norm:
    case TensorRole::SsmA:
    case TensorRole::SsmDt:
    case TensorRole::SsmConv:
    case TensorRole::Router:
    case TensorRole::SharedExpertGate:
    case TensorRole::ExpertBias:
    case TensorRole::SsmAlpha:
    case TensorRole::SsmBeta:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string supported_type_names() {
  std::string s;
  for (const auto& r : kRequests) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

TypeRequest parse_type_request(const std::string& name) {
  for (const auto& r : kRequests) {
    if (name == r.name) return TypeRequest{name, r.base, r.mix, r.file_type};
  }
  fail("--type '", name, "' is not supported (supported: ", supported_type_names(), ")");
}

TypeChoice choose_tensor_type(const PlannedTensor& t, const TypeRequest& req, int n_layer) {
  if (always_f32(t)) return {GgmlType::F32, ""};
  GgmlType want = req.base;
  if (req.q4_k_m_mix) {
    const bool more = t.layer >= 0 && more_bits_layer(t.layer, n_layer);
    switch (t.role) {
      case TensorRole::Output: want = GgmlType::Q6_K; break;
      case TensorRole::AttnV:
      case TensorRole::AttnQkv:
      case TensorRole::ExpertsDown:
      case TensorRole::SharedDown:
      case TensorRole::FfnDown:
        want = more ? GgmlType::Q6_K : GgmlType::Q4_K;
        break;
      default: want = GgmlType::Q4_K; break;
    }
  }
  const int64_t block = type_traits(want).block_elems;
  if (t.ne[0] % block == 0) return {want, ""};
  const GgmlType fallback = t.ne[0] % 32 == 0 ? GgmlType::Q8_0 : GgmlType::F16;
  return {fallback, cat(t.name, ": row length ", t.ne[0], " is not a multiple of ", type_traits(want).name,
                        "'s block of ", block, "; using ", type_traits(fallback).name)};
}

}  // namespace strata::convert
