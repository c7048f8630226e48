#include "strata/gguf/model_summary.h"

#include <map>

#include "strata/base/error.h"

namespace strata {

TensorClass classify_tensor(std::string_view name) {
  TensorClass c;
  constexpr std::string_view kPrefix = "blk.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return c;
  size_t i = kPrefix.size();
  int64_t layer = 0;
  const size_t digits_start = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - digits_start < 9) {
    layer = layer * 10 + (name[i] - '0');
    ++i;
  }
  if (i == digits_start || i >= name.size() || name[i] != '.') return c;
  c.layer = static_cast<int>(layer);
  const std::string_view rest = name.substr(i + 1);
  for (std::string_view stem : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_up_exps"}) {
    if (rest.substr(0, stem.size()) == stem) c.routed_expert = true;
  }
  return c;
}

ModelBytes summarize_bytes(const std::vector<GgufTensorInfo>& tensors) {
  ModelBytes out;
  std::map<int, LayerBytes> layers;
  for (const auto& t : tensors) {
    const TensorClass c = classify_tensor(t.name);
    if (c.layer < 0) {
      out.non_layer_bytes += t.nbytes;
      out.other_bytes += t.nbytes;
      continue;
    }
    LayerBytes& l = layers[c.layer];
    l.layer = c.layer;
    if (!c.routed_expert) {
      l.other_bytes += t.nbytes;
      out.other_bytes += t.nbytes;
      continue;
    }
    // Experts are the outermost dimension, so one expert is nbytes / n_expert of each tensor.
    const int64_t n = t.ne[t.n_dims - 1];
    if (l.n_expert != 0 && l.n_expert != n) {
      fail("tensor '", t.name, "' has ", n, " experts but other expert tensors of layer ", c.layer, " have ",
           l.n_expert);
    }
    l.n_expert = n;
    l.expert_bytes += t.nbytes;
    l.bytes_per_expert += t.nbytes / static_cast<uint64_t>(n);
    out.expert_bytes += t.nbytes;
  }
  for (auto& [k, l] : layers) out.layers.push_back(l);
  return out;
}

}  // namespace strata
