// Which GGML type each converted tensor gets for a `--type` request.
//
// Always F32 (whatever --type says): norms, every 1-D tensor, ssm_a, ssm_dt.bias, ssm_conv1d, the
// router ffn_gate_inp, ffn_gate_inp_shexp (llama.cpp's converter and quantizer keep these F32 too), and
// ssm_alpha / ssm_beta (tiny [n_embd x n_v_heads] matrices feeding exp/sigmoid gates: our own choice).
//
// q4_k_m mix (in the spirit of the usual Q4_K_M recipe; our own rule set):
//   output.weight                                    -> Q6_K
//   attn_v, attn_qkv (DeltaNet q|k|v), ffn_down_exps,
//   ffn_down_shexp, in "more bits" layers            -> Q6_K
//   every other matrix (incl. token_embd)            -> Q4_K
//   "more bits" layers: the first and last n_layer/8 layers, and every third layer in between
//   (layer i with i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2).
//
// A matrix whose row length is not a multiple of the chosen type's block size falls back to Q8_0
// when the row length is a multiple of 32, else to F16; the choice carries a note the CLI prints.
#pragma once

#include <cstdint>
#include <string>

#include "strata/convert/tensor_plan.h"
#include "strata/quant/types.h"

namespace strata::convert {

struct TypeRequest {
  std::string name;      // as given: "q4_k_m", "bf16", ...
  GgmlType base = GgmlType::BF16;
  bool q4_k_m_mix = false;
  uint32_t file_type = 0;  // general.file_type (llama file-type enum)
};

// Names accepted by --type, for help and errors.
std::string supported_type_names();
// Parses a --type value; unknown names throw listing supported_type_names().
TypeRequest parse_type_request(const std::string& name);

struct TypeChoice {
  GgmlType type = GgmlType::F32;
  std::string note;  // non-empty when a fallback was taken
};

TypeChoice choose_tensor_type(const PlannedTensor& t, const TypeRequest& req, int n_layer);

}  // namespace strata::convert
