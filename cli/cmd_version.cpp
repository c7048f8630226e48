// `strata version`: build facts a bug report needs.
#include <cstdio>

#include "cli/command.h"

namespace {

void setup_version(CLI::App& sub) {
  sub.callback([] {
#ifdef STRATA_HAVE_CUDA
    const char* cuda = "yes";
#else
    const char* cuda = "no";
#endif
    std::printf("strata 0.1.0 (CUDA backend: %s)\n", cuda);
  });
}

const bool registered = strata::cli::register_command("version", "Print version and build facts", setup_version);

}  // namespace
