// Model shapes `strata synth` can generate: the published configs of real checkpoints plus small
// presets for tests. Each preset is an HfConfig, so synth writes metadata through the same code as
// `strata convert` (gguf_metadata.h) and the files carry exactly the keys a converted file carries.
#pragma once

#include <string>
#include <vector>

#include "strata/convert/hf_config.h"

namespace strata::convert {

struct SynthPreset {
  std::string name;    // as given to --preset
  std::string source;  // where the shape comes from (a Hugging Face repo id, or "test preset")
  HfConfig config;
};

const std::vector<SynthPreset>& synth_presets();
// Throws strata::Error listing the preset names when `name` is unknown.
const SynthPreset& find_synth_preset(const std::string& name);
// "a, b, c", for help and errors.
std::string synth_preset_names();

}  // namespace strata::convert
