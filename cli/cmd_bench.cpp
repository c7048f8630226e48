// `strata bench -m FILE [-p 512] [-n 128] [-r 5] [--threads N] [--json]`: prefill and decode tok/s
// and time to first token (median and spread over repetitions), like llama-bench, with the host
// DRAM bandwidth floor printed beside each figure.
#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/engine/bench_backend.h"
#include "strata/engine/bench_report.h"
#include "strata/engine/cli_support.h"
#include "strata/engine/model.h"
#ifdef STRATA_HAVE_CUDA
#include "strata/cuda/bench_gpu.h"
#endif

namespace {

struct BenchArgs {
  std::string model;
  strata::BenchParams params;
  int threads = 0;
  bool json = false;
  size_t triad_mib = 256;
  bool gpu = false;
};

// The exact command line, from /proc/self/cmdline (NUL-separated), for the record.
std::string own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  std::string arg;
  for (char c : raw) {
    if (c != '\0') {
      arg += c;
      continue;
    }
    out += (out.empty() ? "" : " ") + (arg.find(' ') == std::string::npos ? arg : "'" + arg + "'");
    arg.clear();
  }
  return out;
}

void setup_bench(CLI::App& sub) {
  auto a = std::make_shared<BenchArgs>();
  sub.add_option("-m,--model", a->model, "GGUF model file")->required();
  sub.add_option("-p,--n-prompt", a->params.n_prompt, "prompt tokens (default 512)");
  sub.add_option("-n,--n-gen", a->params.n_gen, "generated tokens (default 128)");
  sub.add_option("-r,--repetitions", a->params.reps, "repetitions (default 5)");
  sub.add_option("--seed", a->params.seed, "seed of the random prompt tokens (default 1234)");
  sub.add_option("--threads", a->threads, "CPU threads (default: all hardware threads)");
  sub.add_option("--triad-mib", a->triad_mib, "MiB per array of the bandwidth triad (default 256)");
  sub.add_flag("--json", a->json, "print JSON instead of the table");
  sub.add_flag("--gpu", a->gpu, "run the whole model on the GPU (CUDA build); floors then use GPU memory bandwidth");
  sub.callback([a] {
    strata::set_cpu_threads(a->threads);
    strata::BenchReport r;
    r.command_line = own_command_line();
    r.date = strata::local_iso_datetime();
    r.cpu_model = strata::cpu_model_name();
    r.threads = omp_get_max_threads();
    r.params = a->params;
    r.model_path = a->model;

    const auto model = strata::Model::load(a->model);
    const auto& file = model->file();
    r.model_name = file.get_string_or("general.name", std::filesystem::path(a->model).filename().string());
    r.arch = model->config().arch_name;
    for (const auto& t : file.tensors()) {
      r.model_bytes += static_cast<double>(t.row_nbytes()) * static_cast<double>(t.n_rows());
      r.n_params += static_cast<double>(t.n_elements());
    }
    r.active = strata::count_active_bytes(file, model->config());
    const int max_ctx = a->params.n_prompt + a->params.n_gen + 1;
    std::unique_ptr<strata::BenchBackend> backend;
    if (a->gpu) {
#ifdef STRATA_HAVE_CUDA
      if (!a->json) std::fprintf(stderr, "measuring GPU memory bandwidth (device copy)...\n");
      r.bandwidth = strata::cuda::measure_gpu_copy_bandwidth();
      backend = strata::cuda::make_gpu_bench_backend(*model, max_ctx);
#else
      throw strata::Error("--gpu: this strata was built without CUDA (configure with nvcc present or -DSTRATA_CUDA=ON)");
#endif
    } else {
      if (!a->json) std::fprintf(stderr, "measuring host DRAM bandwidth (triad)...\n");
      r.bandwidth = strata::measure_triad_bandwidth(a->triad_mib << 20, 5);
      backend = strata::make_cpu_bench_backend(*model, max_ctx);
    }
    r.backend = backend->name();
    if (!a->json) std::fprintf(stderr, "running %d repetitions (+1 warm-up)...\n", a->params.reps);
    r.run = strata::run_bench(*backend, a->params);
    r.vram_by_tier = backend->vram_by_tier();

    if (a->json) {
      std::printf("%s\n", strata::format_bench_json(r).c_str());
    } else {
      std::printf("%s", strata::format_bench_table(r).c_str());
      std::printf("device: %s, %d threads; date %s\ncommand: %s\n", r.cpu_model.c_str(), r.threads, r.date.c_str(),
                  r.command_line.c_str());
    }
  });
}

const bool registered = strata::cli::register_command("bench", "Measure prefill/decode speed (like llama-bench)", setup_bench);

}  // namespace
