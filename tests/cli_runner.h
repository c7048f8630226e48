// Running the built `strata` (or any shell command) from a test: exit code, stdout and stderr.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "strata/base/error.h"

namespace strata::testing_cli {

struct RunResult {
  int exit_code = -1;  // -1 when the command could not start or did not exit normally
  std::string out, err;
};

// Runs a whole shell command line; stderr goes through a per-process temporary file so the two
// streams stay apart.
inline RunResult run_shell(const std::string& cmd) {
  const std::string err_path = cat(::testing::TempDir(), "/strata_cli_", ::getpid(), ".err");
  RunResult r;
  FILE* p = ::popen((cmd + " 2>" + err_path).c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  std::remove(err_path.c_str());
  return r;
}

// Runs `strata ARGS` (through sh, so ARGS may hold a redirection), with `env` ("K=V ...") before it.
inline RunResult run_cli(const std::string& args, const std::string& env = "") {
  return run_shell(env + " " + std::string(STRATA_CLI) + " " + args);
}

// `strata run RUN_ARGS` without and with SPEC_ARGS: both succeed and print the same text; returns the
// speculative run (its stderr holds the drafter's statistics and notes).
inline RunResult expect_spec_run_lossless(const std::string& run_args, const std::string& spec_args) {
  const RunResult plain = run_cli("run " + run_args);
  const RunResult spec = run_cli("run " + run_args + " " + spec_args);
  EXPECT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(spec.exit_code, 0) << spec.err;
  EXPECT_EQ(spec.out, plain.out) << spec_args;
  return spec;
}

}  // namespace strata::testing_cli
