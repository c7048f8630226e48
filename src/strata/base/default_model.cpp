#include "strata/base/default_model.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "strata/base/error.h"

namespace strata {

namespace fs = std::filesystem;

std::string executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  return exe.parent_path().string();
}

std::vector<std::string> bundled_model_candidates(const std::string& source_dir) {
  std::vector<std::string> out;
  const std::string exe_dir = executable_dir();
  if (!exe_dir.empty())
    out.push_back((fs::path(exe_dir) / ".." / "models" / kBundledModelName).lexically_normal().string());
  if (!source_dir.empty()) out.push_back((fs::path(source_dir) / "models" / kBundledModelName).string());
  return out;
}

namespace {
bool is_regular_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}
}  // namespace

std::string find_default_model(const std::vector<std::string>& candidates) {
  std::string tried;
  for (const std::string& c : candidates) {
    if (is_regular_file(c)) return c;
    tried += cat(tried.empty() ? "" : ", ", c);
  }
  fail("no model given and the bundled model was not found (tried ", tried.empty() ? "no path" : tried,
       "); pass one with -m MODEL.gguf");
}

}  // namespace strata
