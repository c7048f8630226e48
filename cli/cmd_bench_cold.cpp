// `strata bench-cold [-m FILE] [--types q4_k,q5_k,q6_k,q8_0] [--picks 8,4] [--threads N]`: the CPU
// cold-expert path of hybrid decode alone (engine/bench_cold.h), as GB/s of expert weights read beside
// the host's triad bandwidth measured in the same run. With --batch T,..: the batched products instead
// (an expert's gate/up/down matmuls with T tokens), GOPS with the batched kernel and the per-token one,
// weights in cache and from DRAM, on each --batch-threads count. With --host-paths: host memory read by the pool's
// threads and by a GPU kernel over PCIe, alone and at once. Without -m it times random in-memory experts of
// each --types entry at a preset's shapes (default qwen3.6-35b-a3b); with -m, the file's own MoE layers.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/convert/synth_presets.h"
#include "strata/cpu/cold_experts.h"
#include "strata/cpu/cpu_kernels.h"
#include "strata/engine/bench_bandwidth.h"
#include "strata/engine/bench_cold.h"
#include "strata/engine/bench_report.h"
#include "strata/engine/model.h"
#ifdef STRATA_HAVE_CUDA
#include "strata/cuda/bench_gpu.h"
#endif

namespace {

struct BenchColdArgs {
  std::string model;
  std::string types = "q4_k,q5_k,q6_k,q8_0";
  std::string preset = "qwen3.6-35b-a3b";
  int layers = 2;
  std::string picks = "8,4";
  int threads = 0;
  double seconds = 1.0;
  size_t triad_mib = 256;
  std::string kernels;
  std::string batch;
  std::string batch_threads = "1";
  bool host_paths = false;
};

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string type_label(const strata::ExpertFfn& w) {
  const auto name = [](const strata::ExpertStack& s) { return std::string(strata::type_traits(s.first.type).name); };
  if (w.gate.first.type == w.up.first.type && w.up.first.type == w.down.first.type) return name(w.gate);
  return name(w.gate) + "/" + name(w.up) + "/" + name(w.down);
}

void print_row(const std::string& what, const strata::ColdBenchResult& r, double triad) {
  std::printf("%-22s %5d %7d %9.1f %9.3f %9.3f %8.1f %6.1f%% %9.3f %8.1f %7.0f\n", what.c_str(), r.picks, r.threads,
              r.bytes_per_job / 1048576.0, r.cold_ms_per_job, r.cold_median_ms, r.cold_gbs, 100.0 * r.cold_gbs / triad,
              r.cached_ms_per_job, r.cached_gbs, r.working_set_bytes / 1048576.0);
  std::fflush(stdout);
}

// The experts --batch times: the file's MoE layers (-m) or in-memory ones per --types entry.
template <class Fn>
void for_each_expert_set(const BenchColdArgs& a, Fn fn) {
  if (!a.model.empty()) {
    const auto model = strata::Model::load(a.model);
    std::vector<strata::ExpertFfn> layers;
    for (const auto& l : model->weights().layers)
      if (l.moe.gate.n_expert > 0) layers.push_back(l.moe);
    if (layers.empty()) strata::fail(a.model, ": no MoE layers");
    fn("file " + type_label(layers.front()), layers);
    return;
  }
  const auto& c = strata::convert::find_synth_preset(a.preset).config;
  if (c.n_expert <= 0) strata::fail("bench-cold: preset ", a.preset, " has no experts");
  for (const std::string& t : split_commas(a.types)) {
    const auto type = strata::type_from_name(t);
    if (!type) strata::fail("bench-cold: unknown type '", t, "'");
    const strata::SyntheticExperts ex(*type, c.n_embd, c.n_ff_exp, c.n_expert, a.layers, 1234);
    fn(type_label(ex.layers().front()), ex.layers());
  }
}

void run_batch_bench(const BenchColdArgs& a, const std::vector<int>&) {
  std::vector<int> tokens, threads;
  for (const std::string& s : split_commas(a.batch)) tokens.push_back(std::stoi(s));
  for (const std::string& s : split_commas(a.batch_threads)) threads.push_back(std::stoi(s));
  if (tokens.empty() || threads.empty()) strata::fail("bench-cold: --batch and --batch-threads need values");
  std::printf("batched expert products (gate + up + down matmuls, T tokens each), %s kernels\n",
              strata::cpu_kernel_level_name(strata::cpu_kernel_level()));
  std::printf("%-14s %5s %7s %6s %12s %12s %7s %12s %12s\n", "experts", "T", "threads", "weights", "per-token", "tiles",
              "speedup", "tiles/core", "tok/s/core");
  for_each_expert_set(a, [&](const std::string& label, const std::vector<strata::ExpertFfn>& layers) {
    const double ops_per_token = 6.0 * static_cast<double>(layers.front().gate.first.n_cols) *
                                 static_cast<double>(layers.front().gate.first.n_rows);
    for (int th : threads)
      for (int dram = 0; dram <= 1; ++dram)
        for (int t : tokens) {
          const strata::BatchBenchResult r = strata::bench_batched_experts(layers, t, th, dram != 0, a.seconds);
          std::printf("%-14s %5d %7d %6s %8.1f GOPS %7.1f GOPS %6.2fx %7.1f GOPS %12.0f\n", label.c_str(), t, th,
                      dram ? "dram" : "cache", r.per_token_gops, r.tiles_gops, r.tiles_gops / r.per_token_gops,
                      r.tiles_gops / th, r.tiles_gops / th * 1e9 / ops_per_token);
          std::fflush(stdout);
        }
  });
  std::printf("GOPS: 2 x multiply-adds per second; per-token: one token at a time (dot_rows_fused), tiles: the "
              "batched kernel (dot_tile_fused), bitwise the same results; tok/s/core: one expert's tokens per second "
              "per thread (tiles)\ndevice: %s, %u hardware threads; date %s\ncommand: %s\n",
              strata::cpu_model_name().c_str(), std::thread::hardware_concurrency(), strata::local_iso_datetime().c_str(),
              strata::own_command_line().c_str());
}

void setup_bench_cold(CLI::App& sub) {
  auto a = std::make_shared<BenchColdArgs>();
  sub.add_option("-m,--model", a->model, "GGUF file: time its MoE layers' experts (instead of --types)");
  sub.add_option("--types", a->types,
                 "without -m: weight types of the in-memory experts, comma-separated (default q4_k,q5_k,q6_k,q8_0)");
  sub.add_option("--preset", a->preset, "without -m: synth preset whose expert shapes to use (default qwen3.6-35b-a3b)");
  sub.add_option("--layers", a->layers, "without -m: layers of experts per type (default 2)");
  sub.add_option("--picks", a->picks, "experts per job (one token's cold picks of a layer), comma-separated (default 8,4)");
  sub.add_option("-t,--threads", a->threads, "cold-expert pool threads (default: as the hybrid session, cores - 2)");
  sub.add_option("--seconds", a->seconds, "seconds per cold measurement (default 1)");
  sub.add_option("--triad-mib", a->triad_mib, "MiB per array of the bandwidth triad, and per --host-paths buffer (default 256)");
  sub.add_option("--batch", a->batch,
                 "tokens per expert, comma-separated: time the batched products (prefill's) instead of decode's");
  sub.add_option("--batch-threads", a->batch_threads, "with --batch: thread counts, comma-separated (default 1)");
  sub.add_option("--kernels", a->kernels, "force a CPU kernel level: scalar, avx2 or avx512 (default: the best)");
  sub.add_flag("--host-paths", a->host_paths,
               "instead: host memory read by the pool's threads and by a GPU kernel over PCIe (mapped pinned "
               "memory), each alone and both at once (a build with CUDA)");
  sub.callback([a, &sub] {
    if (a->kernels == "scalar") strata::set_cpu_kernel_level(strata::CpuKernelLevel::Scalar);
    else if (a->kernels == "avx2") strata::set_cpu_kernel_level(strata::CpuKernelLevel::Avx2);
    else if (a->kernels == "avx512") strata::set_cpu_kernel_level(strata::CpuKernelLevel::Avx512);
    else if (!a->kernels.empty()) strata::fail("bench-cold: --kernels must be scalar, avx2 or avx512");
    if (a->layers < 1) strata::fail("bench-cold: --layers must be >= 1");
    if (a->seconds <= 0) strata::fail("bench-cold: --seconds must be > 0");
    std::vector<int> picks;
    for (const std::string& s : split_commas(a->picks)) picks.push_back(std::stoi(s));
    if (picks.empty()) strata::fail("bench-cold: --picks is empty");
    const int threads = a->threads > 0 ? a->threads : strata::ColdExpertPool::default_threads();
    if (a->host_paths) {
      for (const char* other : {"-m", "--types", "--preset", "--layers", "--picks", "--seconds", "--batch",
                                "--batch-threads", "--kernels"})
        if (sub.count(other) > 0) strata::fail("bench-cold: --host-paths takes only -t and --triad-mib, not ", other);
#ifdef STRATA_HAVE_CUDA
      // What a cold expert read over PCIe by the GPU would add to the CPU's reads: one host DRAM feeds both.
      const strata::cuda::HostReadPaths r = strata::cuda::measure_host_read_paths(a->triad_mib << 20, threads);
      if (!r.error.empty()) strata::fail("bench-cold --host-paths: ", r.error);
      std::printf("%s", strata::cuda::format_host_read_paths(r).c_str());
      std::printf("device: %s, %u hardware threads; date %s\ncommand: %s\n", strata::cpu_model_name().c_str(),
                  std::thread::hardware_concurrency(), strata::local_iso_datetime().c_str(),
                  strata::own_command_line().c_str());
      return;
#else
      strata::fail("bench-cold: --host-paths needs a build with CUDA (this one has none)");
#endif
    }
    if (!a->batch.empty()) {
      run_batch_bench(*a, picks);
      return;
    }

    std::fprintf(stderr, "measuring host DRAM bandwidth (triad, %d threads)...\n", omp_get_max_threads());
    const strata::BandwidthResult bw = strata::measure_triad_bandwidth(a->triad_mib << 20, 5);
    // Let OpenMP's threads stop spinning before the pool's threads want the cores.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    strata::ColdExpertPool pool(threads);

    std::printf("cold experts on the CPU: %d pool threads, %s kernels; host triad %.1f GB/s (%d threads)\n", threads,
                strata::cpu_kernel_level_name(strata::cpu_kernel_level()), bw.triad_gbs, bw.threads);
    std::printf("%-22s %5s %7s %9s %9s %9s %8s %7s %9s %8s %7s\n", "experts", "picks", "threads", "MiB/job",
                "ms/job", "median", "GB/s", "triad", "cached ms", "GB/s", "set MiB");
    const auto run_all = [&](const std::string& label, const std::vector<strata::ExpertFfn>& layers) {
      for (int k : picks) {
        strata::ColdBenchOptions o;
        o.picks = k;
        o.seconds = a->seconds;
        print_row(label, strata::bench_cold_experts(pool, layers, o), bw.triad_gbs);
      }
    };
    if (!a->model.empty()) {
      const auto model = strata::Model::load(a->model);
      std::vector<strata::ExpertFfn> layers;
      for (const auto& l : model->weights().layers)
        if (l.moe.gate.n_expert > 0) layers.push_back(l.moe);
      if (layers.empty()) strata::fail(a->model, ": no MoE layers");
      run_all("file " + type_label(layers.front()), layers);
    } else {
      const auto& c = strata::convert::find_synth_preset(a->preset).config;
      if (c.n_expert <= 0) strata::fail("bench-cold: preset ", a->preset, " has no experts");
      for (const std::string& t : split_commas(a->types)) {
        const auto type = strata::type_from_name(t);
        if (!type) strata::fail("bench-cold: unknown type '", t, "'");
        const strata::SyntheticExperts ex(*type, c.n_embd, c.n_ff_exp, c.n_expert, a->layers, 1234);
        run_all(type_label(ex.layers().front()), ex.layers());
      }
    }
    std::printf("MiB/job: expert weight bytes per job; GB/s: those bytes / time (cold: cycling over every expert; "
                "cached: one job's experts repeated); triad: cold GB/s over the triad\n");
    std::printf("device: %s, %u hardware threads; date %s\ncommand: %s\n", strata::cpu_model_name().c_str(),
                std::thread::hardware_concurrency(), strata::local_iso_datetime().c_str(),
                strata::own_command_line().c_str());
  });
}

const bool registered = strata::cli::register_command(
    "bench-cold", "Time the CPU cold-expert kernels (hybrid decode's CPU side) against the triad bandwidth",
    setup_bench_cold);

}  // namespace
