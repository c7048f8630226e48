// `strata convert --hf DIR -o OUT.gguf [--type T] [--threads N]`: Hugging Face checkpoint -> GGUF.
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <memory>
#include <string>

#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/convert/converter.h"
#include "strata/convert/type_policy.h"

namespace {

struct ConvertArgs {
  std::string hf_dir;
  std::string out;
  std::string type = "bf16";
  int threads = 0;
};

std::string ne_string(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

// The converter reads the directory's JSON, safetensors and tokenizer files: writing over one of them
// would destroy the checkpoint being read.
void refuse_input_as_output(const std::string& hf_dir, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(hf_dir, ec);
  const fs::path target = fs::weakly_canonical(out, ec);
  if (ec) return;  // the converter reports unusable paths itself
  const std::string ext = target.extension().string();
  const bool input_kind = ext == ".safetensors" || ext == ".json" || ext == ".model" || ext == ".txt";
  if (target == dir || (target.parent_path() == dir && input_kind && fs::exists(target)))
    strata::fail("-o ", out, " is one of its inputs (in --hf ", hf_dir, "); write the GGUF elsewhere");
}

void setup_convert(CLI::App& sub) {
  auto args = std::make_shared<ConvertArgs>();
  sub.add_option("--hf", args->hf_dir, "Hugging Face checkpoint directory (config.json + *.safetensors)")->required();
  sub.add_option("-o,--output", args->out, "output GGUF file")->required();
  sub.add_option("--type", args->type, "output type: " + strata::convert::supported_type_names() + " (default bf16)");
  sub.add_option("--threads", args->threads, "quantisation threads (default: all cores)");
  sub.callback([args] {
    refuse_input_as_output(args->hf_dir, args->out);
    strata::convert::ConvertOptions opt;
    opt.hf_dir = args->hf_dir;
    opt.out_path = args->out;
    opt.type = args->type;
    opt.threads = args->threads;
    opt.on_note = [](const std::string& s) { std::fprintf(stderr, "note: %s\n", s.c_str()); };
    opt.on_tensor = [](const strata::convert::TensorProgress& p) {
      std::printf("[%4zu/%4zu] %-36s %-22s %-5s %10.2f MiB %6.2fs\n", p.index, p.total, p.name.c_str(),
                  ne_string(p.ne).c_str(), strata::type_traits(p.type).name, p.nbytes / 1048576.0, p.seconds);
      std::fflush(stdout);
    };
    const auto sum = strata::convert::convert_hf_to_gguf(opt);
    std::printf("wrote %s: arch %s, %zu tensors, %.2f MiB of tensor data, tokenizer %s\n", args->out.c_str(),
                sum.arch.c_str(), sum.n_tensors, sum.tensor_bytes / 1048576.0, sum.has_tokenizer ? "yes" : "no");
    std::printf("types:");
    for (const auto& [type, n] : sum.tensors_by_type) std::printf(" %s x%zu", type.c_str(), n);
    std::printf("\n");
    if (!sum.ignored.empty()) std::printf("ignored %zu HF tensors (vision tower / MTP / tied lm_head)\n", sum.ignored.size());
  });
}

const bool registered = strata::cli::register_command("convert", "Convert a Hugging Face checkpoint to GGUF", setup_convert);

}  // namespace
