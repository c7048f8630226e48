// The small pieces around generation: the progress indicator's plain (non-terminal) output and
// finding the bundled model (the candidates in order, else a clear error).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "strata/base/default_model.h"
#include "strata/base/error.h"
#include "strata/base/progress.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// Runs fn with stderr redirected to a file (not a terminal) and returns what it wrote.
template <class Fn>
std::string capture_stderr(Fn fn) {
  const std::string path = cat(::testing::TempDir(), "/strata_progress_", ::getpid(), ".txt");
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(path.c_str());
  return ss.str();
}

TEST(ProgressBar, PlainLinesAtEveryTenPercentWhenNotATerminal) {
  const std::string out = capture_stderr([] {
    ProgressBar bar("loading model", 1000, false);
    for (uint64_t i = 0; i <= 1000; i += 5) bar.update(i);
    bar.finish();
    bar.finish();  // idempotent
  });
  std::string expected;
  for (int p = 0; p <= 100; p += 10) expected += cat("loading model: ", p, "% (", p * 10, " / 1000)\n");
  EXPECT_EQ(out, expected);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.find('\x1b'), std::string::npos);
}

TEST(ProgressBar, FormatsBytes) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KB");
  EXPECT_EQ(format_bytes(44ull << 20), "44.0 MB");
  EXPECT_EQ(format_bytes(3ull << 30), "3.0 GB");
}

TEST(DefaultModel, CandidatesInOrder) {
  const fs::path dir = fs::path(::testing::TempDir()) / cat("strata_default_model_", ::getpid());
  fs::create_directories(dir);
  const std::string a = (dir / "a.gguf").string(), b = (dir / "b.gguf").string();
  const std::string missing = (dir / "missing.gguf").string();
  std::ofstream(b) << "x";
  EXPECT_EQ(find_default_model({missing, b}), b);
  std::ofstream(a) << "x";
  EXPECT_EQ(find_default_model({a, b}), a);
  try {
    find_default_model({missing, dir.string()});  // a directory is not a model
    FAIL() << "no model found, yet no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("-m"), std::string::npos) << msg;
  }
  fs::remove_all(dir);
}

TEST(DefaultModel, CandidatesLookNextToTheExecutableThenInTheSourceTree) {
  const auto c = bundled_model_candidates("/src/strata");
  ASSERT_EQ(c.size(), 2u);
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe").parent_path();
  EXPECT_EQ(c[0], (exe_dir.parent_path() / "models" / "strata-tiny.gguf").string());
  EXPECT_EQ(c[1], "/src/strata/models/strata-tiny.gguf");
  EXPECT_EQ(bundled_model_candidates("").size(), 1u);
}

}  // namespace
