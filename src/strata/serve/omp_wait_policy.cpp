#include "strata/serve/omp_wait_policy.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace strata::serve {

void use_passive_omp_waits() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  // The arguments this process was started with, NUL-separated.
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  std::string why = "cannot read /proc/self/cmdline";
  if (!args.empty()) {
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    setenv("OMP_WAIT_POLICY", "passive", 1);
    std::fflush(stdout);
    std::fflush(stderr);
    execv("/proc/self/exe", argv.data());
    why = std::string("exec /proc/self/exe: ") + std::strerror(errno);  // execv returns only on failure
    unsetenv("OMP_WAIT_POLICY");
  }
  std::fprintf(stderr,
               "strata serve: warning: could not restart with OMP_WAIT_POLICY=passive (%s); running with the default "
               "OpenMP wait policy, so a busy machine may slow generation and cancellation (set OMP_WAIT_POLICY to "
               "silence this)\n",
               why.c_str());
}

}  // namespace strata::serve
