// A directory of this test process's own, <TempDir>/<prefix><pid>, removed with everything in it when
// the process exits: test binaries that write model files (hundreds of MB at real shapes) run once per
// test under ctest and must not leave them behind.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <system_error>

inline std::filesystem::path process_temp_dir(const std::string& prefix) {
  namespace fs = std::filesystem;
  struct Made {
    std::mutex mu;
    std::set<fs::path> dirs;
    ~Made() {
      for (const fs::path& d : dirs) {
        std::error_code ec;
        fs::remove_all(d, ec);
      }
    }
  };
  static Made made;
  const fs::path d = fs::path(::testing::TempDir()) / (prefix + std::to_string(::getpid()));
  fs::create_directories(d);
  std::lock_guard<std::mutex> lock(made.mu);
  made.dirs.insert(d);
  return d;
}
