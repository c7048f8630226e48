// `strata synth`: writes a random-weight GGUF model with the real shapes of a preset (synth_presets.h),
// names/metadata as `strata convert` writes them (so strata and llama.cpp load it), quantised with the
// convert type policy, generated on all threads and streamed to disk tensor by tensor (the next
// tensor is generated while the previous one is written). Block-quantised tensors are drawn as blocks
// straight from the RNG (synth_blocks.h: same statistics as the float init, no quantiser search);
// f32/f16/bf16 tensors from synth_row (synth_tensors.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "strata/convert/synth_presets.h"
#include "strata/quant/types.h"

namespace strata::convert {

// Parses --skew: "realistic" -> nullopt (the exponent then comes from the shape:
// realistic_skew_exponent), "uniform" / "none" / "0" -> 0, "zipf:S" with S a finite number in [0, 8]
// -> S. Throws otherwise.
std::optional<double> parse_skew(const std::string& text);

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
  // Router skew (--skew): realistic by default, so a benchmark on a synth file sees static skew close
  // to a real model's; random weights cannot give temporal reuse (bench --routing replays that).
  std::string skew = "realistic";
  uint64_t seed = 42;
  // Keep only the first `layers` layers of the preset (same shapes; qwen35moe keeps the real model's
  // DeltaNet / full-attention pattern of those layers). 0: all of the preset's layers.
  int layers = 0;
  // Multi-token-prediction layers added after the trunk (qwen35moe presets; 0 or 1): random, so a
  // drafter's acceptance means nothing, its cost and correctness do.
  int mtp = 0;
  int threads = 0;  // 0: all cores
  std::string out_path;
  std::function<void(const std::string&)> on_note;
  std::function<void(const SynthProgress&)> on_tensor;
};

struct SynthSummary {
  std::string arch;
  int n_layer = 0;         // layers written
  int preset_n_layer = 0;  // layers of the full preset
  size_t n_tensors = 0;
  size_t tensor_bytes = 0;
  uint64_t n_params = 0;
  std::map<std::string, size_t> tensors_by_type;
};

// The preset's config cut to its first `layers` layers (0: unchanged). Throws when layers is not in
// [0, preset layer count]. The q4_k_m-style type mix is then chosen as for a model of that many layers.
HfConfig synth_config(const SynthPreset& preset, int layers);

SynthSummary synth_model(const SynthOptions& opt);

}  // namespace strata::convert
