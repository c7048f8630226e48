// `strata synth`: writes a random-weight GGUF model with the real shapes of a preset (synth_presets.h),
// names/metadata as `strata convert` writes them (so strata and llama.cpp load it), quantised with the
// convert type policy, generated and quantised on all threads and streamed to disk tensor by tensor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "strata/quant/types.h"

namespace strata::convert {

// Parses --skew: "none" / "0" -> 0, "zipf:S" with S a finite number in [0, 8] -> S. Throws otherwise.
double parse_skew(const std::string& text);

struct SynthProgress {
  size_t index = 0, total = 0;  // 1-based
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type = GgmlType::F32;
  size_t nbytes = 0;
  size_t bytes_done = 0, bytes_total = 0;  // tensor data so far / in all
  double seconds = 0;
};

struct SynthOptions {
  std::string preset;
  std::string quant = "q4_k_m";  // any name convert's --type accepts
  std::string skew = "none";
  uint64_t seed = 42;
  int threads = 0;  // 0: all cores
  std::string out_path;
  std::function<void(const std::string&)> on_note;
  std::function<void(const SynthProgress&)> on_tensor;
};

struct SynthSummary {
  std::string arch;
  size_t n_tensors = 0;
  size_t tensor_bytes = 0;
  uint64_t n_params = 0;
  std::map<std::string, size_t> tensors_by_type;
};

SynthSummary synth_model(const SynthOptions& opt);

}  // namespace strata::convert
