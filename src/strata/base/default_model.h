// Where the bundled model lives when a command is run without -m: the candidates the caller passes
// (next to the installed executable, then the source tree). The base library knows no build paths, so
// the CLI passes them in. Any other model is given with -m.
#pragma once

#include <string>
#include <vector>

namespace strata {

// The bundled model's file name.
inline constexpr const char* kBundledModelName = "strata-tiny.gguf";

// Directory of the running executable (from /proc/self/exe); "" when it cannot be read.
std::string executable_dir();

// The usual candidates, in order: <exe dir>/../models/strata-tiny.gguf, then
// <source_dir>/models/strata-tiny.gguf (skipped when source_dir is empty).
std::vector<std::string> bundled_model_candidates(const std::string& source_dir);

// The first candidate that is an existing regular file. Throws strata::Error listing every path tried
// and how to pass a model (-m) when none is found.
std::string find_default_model(const std::vector<std::string>& candidates);

}  // namespace strata
