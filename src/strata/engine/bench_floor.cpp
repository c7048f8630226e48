#include "strata/engine/bench_floor.h"

#include <cmath>
#include <string>

#include "strata/gguf/gguf.h"
#include "strata/gguf/model_summary.h"
#include "strata/model/config.h"

namespace strata {

double ActiveBytes::prefill(int n_tokens) const {
  const double touched = 1.0 - std::pow(1.0 - expert_fraction, n_tokens);
  return dense + embd_row * n_tokens + output + experts_all * touched;
}

ActiveBytes count_active_bytes(const GgufFile& file, const ModelConfig& config) {
  ActiveBytes b;
  b.expert_fraction = config.n_expert > 0 ? static_cast<double>(config.n_expert_used) / config.n_expert : 0.0;
  bool has_output = false;
  for (const auto& t : file.tensors()) {
    if (classify_tensor(t.name).layer >= config.n_layer) continue;  // MTP blocks: no decode step reads them
    const double bytes = static_cast<double>(t.row_nbytes()) * static_cast<double>(t.n_rows());
    if (t.name == "token_embd.weight") {
      b.embd_row = static_cast<double>(t.row_nbytes());
    } else if (t.name == "output.weight") {
      b.output = bytes;
      has_output = true;
    } else if (t.name.find("_exps.") != std::string::npos) {
      b.experts_all += bytes;
    } else {
      b.dense += bytes;
    }
  }
  if (!has_output) {
    const GgufTensorInfo& e = file.tensor("token_embd.weight");
    b.output = static_cast<double>(e.row_nbytes()) * static_cast<double>(e.n_rows());
  }
  return b;
}

}  // namespace strata
