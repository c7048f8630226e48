// What `strata convert` writes: every GGUF tensor with its name, shape (ne, ne[0] contiguous), and
// how each of its rows is made from HF checkpoint rows (which tensor, which row, column order, value
// transform). Names, shapes and transforms follow the GGUF files llama.cpp writes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "strata/convert/hf_config.h"
#include "strata/convert/safetensors.h"

namespace strata::convert {

// Elementwise transform applied after reading (as float32).
enum class ValueOp {
  None,
  PlusOne,  // zero-centred HF RMSNorm weight (applied as 1 + w) -> plain multiplier
  NegExp,   // A_log -> A = -exp(A_log)
};

// What a tensor is, for the type policy.
enum class TensorRole {
  TokenEmbd, Output, Norm,
  AttnQ, AttnK, AttnV, AttnOut,
  AttnQkv, AttnGate, SsmBeta, SsmAlpha, SsmConv, SsmDt, SsmA, SsmOut,
  Router, SharedExpertGate, ExpertBias,
  ExpertsGate, ExpertsUp, ExpertsDown,
  SharedGate, SharedUp, SharedDown,
  AttnOutGate,             // laguna's softplus output gate projection (attn_gate)
  FfnGate, FfnUp, FfnDown, // dense feed-forward layers
  MtpProj,                 // an MTP block's nextn.eh_proj
};

struct RowRef {
  const StTensor* src;
  int64_t row;  // row of src, a row being src->row_length() contiguous elements
};

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> ne;
  TensorRole role = TensorRole::Norm;
  int layer = -1;  // -1 for tensors outside the blocks
  std::function<RowRef(int64_t)> row_source;  // GGUF row (0 .. n_rows()-1) -> source row
  std::vector<int64_t> col_perm;               // empty: identity; else out[c] = src[col_perm[c]]
  ValueOp op = ValueOp::None;

  int64_t n_rows() const;
  // Produces GGUF row `row` as float32 into dst (ne[0] floats).
  void read_row(int64_t row, float* dst, std::vector<float>& scratch) const;
};

struct ConversionPlan {
  std::vector<PlannedTensor> tensors;
  std::vector<std::string> ignored;  // HF tensors deliberately not converted ("name: reason")
};

// Builds the plan and marks every HF tensor it reads or deliberately ignores. Throws when the
// checkpoint's tensors are quantized (fp8 dtypes, GPTQ/AWQ, bitsandbytes or compressed-tensors
// companions such as qweight / scales), when a needed HF tensor is missing or has the wrong shape, and
// when the checkpoint holds tensors the plan neither uses nor knows to ignore (listing them), so no
// weight is dropped silently.
ConversionPlan plan_conversion(const HfConfig& cfg, const HfCheckpoint& ck);

}  // namespace strata::convert
