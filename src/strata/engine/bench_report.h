// Presenting `strata bench` results: a llama-bench-like table with the bandwidth floor beside every
// figure, and a JSON document with every number plus the command line, date, CPU and threads.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "strata/engine/bench_bandwidth.h"
#include "strata/engine/bench_floor.h"
#include "strata/engine/bench_runner.h"

namespace strata {

struct BenchReport {
  std::string command_line;
  std::string date;       // ISO 8601, local time
  std::string cpu_model;  // /proc/cpuinfo "model name"
  int threads = 0;
  std::string backend;
  std::string model_path, model_name, arch;
  double model_bytes = 0;  // tensor data
  double n_params = 0;
  BenchParams params;
  BandwidthResult bandwidth;
  ActiveBytes active;
  BenchRun run;
  std::vector<std::pair<std::string, size_t>> vram_by_tier;  // empty on the CPU
  // bench --routing: what drove the expert picks ("replayed FILE", "generated NAME seed S"); "" when
  // the router did. Every row and result that reports a speed under replayed routing carries it.
  std::string routing;

  // Floors at the measured bandwidth.
  double decode_floor_tps() const;
  double prefill_floor_tps() const;  // bandwidth only: compute is not counted
  double ttft_floor_ms() const;
};

std::string format_bench_table(const BenchReport& r);
std::string format_bench_json(const BenchReport& r);

std::string cpu_model_name();  // "unknown" when /proc/cpuinfo has none
std::string local_iso_datetime();
// This process's command line (from /proc/self/cmdline), arguments with spaces quoted, for the record.
std::string own_command_line();

}  // namespace strata
