// `strata synth --preset NAME [--quant T] [--skew realistic|uniform|zipf:S] [--layers N] [--seed N] [--threads N] -o FILE.gguf`:
// a random-weight model with a real model's shapes, for benchmarks (`strata bench`, llama-bench).
// `strata synth --list` prints the presets.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/convert/synth.h"
#include "strata/convert/synth_presets.h"
#include "strata/convert/type_policy.h"

namespace {

struct SynthArgs {
  strata::convert::SynthOptions opt;
  bool list = false;
};

std::string ne_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

void print_presets() {
  std::printf("%-18s %-10s %7s %6s %8s %8s  %s\n", "preset", "arch", "layers", "embd", "experts", "vocab", "source");
  for (const auto& p : strata::convert::synth_presets()) {
    const auto& c = p.config;
    std::printf("%-18s %-10s %7d %6d %4d/%-3d %8d  %s\n", p.name.c_str(), strata::convert::gguf_arch_name(c.arch),
                c.n_layer, c.n_embd, c.n_expert_used, c.n_expert, c.n_vocab, p.source.c_str());
  }
}

void setup_synth(CLI::App& sub) {
  auto a = std::make_shared<SynthArgs>();
  sub.add_flag("--list", a->list, "print the presets and exit");
  sub.add_option("--preset", a->opt.preset, "model shape: " + strata::convert::synth_preset_names());
  sub.add_option("--quant", a->opt.quant,
                 "weight type: " + strata::convert::supported_type_names() + " (default q4_k_m)");
  sub.add_option("--skew", a->opt.skew,
                 "router skew: realistic (default: static skew like a real model's, ~70% of picks on the hottest 40% "
                 "of experts), uniform (unscaled random routers) or zipf:S (router rows scaled by 1/rank^S)");
  auto* layers = sub.add_option("--layers", a->opt.layers,
                 "keep only the first N layers of the preset (same shapes and layer pattern; default: all)");
  sub.add_option("--mtp", a->opt.mtp,
                 "add N random multi-token-prediction layers (0 or 1; qwen35moe presets) for --spec mtp");
  sub.add_option("--seed", a->opt.seed, "random seed (default 42)");
  sub.add_option("--threads", a->opt.threads, "threads (default: all cores)");
  sub.add_option("-o,--output", a->opt.out_path, "output GGUF file");
  sub.callback([a, layers] {
    if (a->list) {
      print_presets();
      return;
    }
    if (a->opt.preset.empty()) strata::fail("synth: --preset is required (or --list)");
    // In SynthOptions 0 means "all layers"; on the command line an explicit N must be >= 1.
    if (layers->count() > 0 && a->opt.layers < 1)
      strata::fail("synth: --layers ", a->opt.layers, " must be >= 1 (leave it out for all layers)");
    a->opt.on_note = [](const std::string& s) { std::fprintf(stderr, "note: %s\n", s.c_str()); };
    a->opt.on_tensor = [](const strata::convert::SynthProgress& p) {
      std::printf("[%4zu/%4zu] %5.1f%% %-34s %-20s %-5s %10.2f MiB %6.2fs\n", p.index, p.total,
                  100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total ? p.bytes_total : 1),
                  p.name.c_str(), ne_string(p.ne).c_str(), strata::type_traits(p.type).name, p.nbytes / 1048576.0,
                  p.seconds);
      std::fflush(stdout);
    };
    const auto sum = strata::convert::synth_model(a->opt);
    std::printf("wrote %s: %s, arch %s, %d of %d layers, %zu tensors, %.3f B params, %.2f GiB of tensor data\n",
                a->opt.out_path.c_str(), a->opt.preset.c_str(), sum.arch.c_str(), sum.n_layer, sum.preset_n_layer,
                sum.n_tensors, sum.n_params / 1e9, sum.tensor_bytes / 1073741824.0);
    std::printf("types:");
    for (const auto& [type, n] : sum.tensors_by_type) std::printf(" %s x%zu", type.c_str(), n);
    std::printf("\n");
  });
}

const bool registered =
    strata::cli::register_command("synth", "Write a random-weight model with a real model's shapes", setup_synth);

}  // namespace
