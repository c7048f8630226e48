#include "strata/convert/synth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>

#include "strata/base/error.h"
#include "strata/convert/gguf_metadata.h"
#include "strata/convert/synth_blocks.h"
#include "strata/convert/synth_presets.h"
#include "strata/convert/synth_tensors.h"
#include "strata/convert/synth_vocab.h"
#include "strata/convert/type_policy.h"
#include "strata/gguf/writer.h"
#include "strata/quant/quantize.h"

namespace strata::convert {

std::optional<double> parse_skew(const std::string& text) {
  if (text == "realistic") return std::nullopt;
  if (text == "uniform" || text == "none" || text == "0") return 0.0;
  const std::string prefix = "zipf:";
  if (text.rfind(prefix, 0) != 0)
    fail("--skew '", text, "' is not understood (expected realistic, uniform or zipf:S, e.g. zipf:1.0)");
  const std::string num = text.substr(prefix.size());
  char* end = nullptr;
  const double s = std::strtod(num.c_str(), &end);
  if (num.empty() || end == nullptr || *end != '\0' || !std::isfinite(s) || s < 0.0 || s > 8.0)
    fail("--skew '", text, "': S must be a number in [0, 8]");
  return s;
}

namespace {

// Generates and quantises every row of `t` into dst on all OpenMP threads; the first exception is
// rethrown on the calling thread (exceptions must not leave an OpenMP region).
void fill_synth_tensor(const SynthTensor& t, GgmlType type, uint64_t seed, uint8_t* dst, size_t nbytes) {
  const int64_t rows = t.meta.n_rows();
  const int64_t n = t.meta.ne[0];
  const size_t rb = row_bytes(type, n);
  if (rb * static_cast<size_t>(rows) != nbytes)
    fail("internal: synth ", t.meta.name, ": writer asks for ", nbytes, " bytes, rows need ", rb * rows);
  // Block types straight from the RNG (synth_blocks.h); floats (and f16/bf16) through synth_row.
  const bool direct = synth_quant_direct(t, type);
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel
  {
    std::vector<float> row(direct ? 0 : static_cast<size_t>(n));
#pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; ++r) {
      try {
        uint8_t* out = dst + static_cast<size_t>(r) * rb;
        if (direct) {
          synth_quant_row(t, type, seed, r, out);
        } else {
          synth_row(t, seed, r, row.data());
          quantize_row(type, row.data(), out, n);
        }
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

HfConfig synth_config(const SynthPreset& preset, int layers) {
  HfConfig cfg = preset.config;
  if (layers == 0) return cfg;
  if (layers < 1 || layers > cfg.n_layer)
    fail("synth: --layers ", layers, " is out of range for preset '", preset.name, "' (1..", cfg.n_layer, ")");
  cfg.n_layer = layers;
  // The first N layers of the real model: is_full_attention is per layer, so the prefix keeps the
  // DeltaNet / full-attention pattern (full attention at layers interval-1, 2*interval-1, ...).
  if (cfg.is_full_attention.size() > static_cast<size_t>(layers))
    cfg.is_full_attention.resize(static_cast<size_t>(layers));
  if (cfg.is_sliding.size() > static_cast<size_t>(layers)) cfg.is_sliding.resize(static_cast<size_t>(layers));
  if (cfg.heads_per_layer.size() > static_cast<size_t>(layers)) cfg.heads_per_layer.resize(static_cast<size_t>(layers));
  cfg.n_dense_lead = std::min(cfg.n_dense_lead, layers);
  return cfg;
}

SynthSummary synth_model(const SynthOptions& opt) {
  if (opt.out_path.empty()) fail("synth: no output file (-o FILE.gguf)");
  if (opt.threads < 0) fail("synth: --threads must be >= 0");
  const SynthPreset& preset = find_synth_preset(opt.preset);
  const TypeRequest req = parse_type_request(opt.quant);
  const std::optional<double> skew_given = parse_skew(opt.skew);
  HfConfig cfg = synth_config(preset, opt.layers);
  if (opt.mtp < 0 || opt.mtp > 1) fail("synth: --mtp ", opt.mtp, " must be 0 or 1");
  if (opt.mtp > 0 && cfg.arch != HfArch::Qwen35Moe)
    fail("synth: --mtp needs a qwen35moe preset (preset '", preset.name, "' is ", gguf_arch_name(cfg.arch), ")");
  cfg.n_mtp = opt.mtp;
  const double skew = skew_given ? *skew_given : realistic_skew_exponent(cfg.n_expert, cfg.n_expert_used);
  if (opt.threads > 0) omp_set_num_threads(opt.threads);

  GgufWriter writer;
  // Generation is cheap next to writing ~20 GB: let the next tensor be generated while one is written.
  writer.set_overlap_fill(true);
  write_model_metadata(cfg, "synth-" + preset.name, req.file_type, writer);
  // Provenance, so a benchmark result can say what it ran on (llama.cpp ignores unknown keys).
  writer.set("strata.synth.preset", GgufValue::str(preset.name));
  writer.set("strata.synth.seed", GgufValue::u64(opt.seed));
  writer.set("strata.synth.skew", GgufValue::str(opt.skew));
  writer.set("strata.synth.skew_exponent", GgufValue::f64(skew));
  writer.set("strata.synth.layers", GgufValue::u32(static_cast<uint32_t>(cfg.n_layer)));
  writer.set("strata.synth.preset_layers", GgufValue::u32(static_cast<uint32_t>(preset.config.n_layer)));
  write_vocab_to_gguf(make_synth_vocab(cfg.n_vocab, cfg.arch == HfArch::Qwen35Moe ? "qwen35" : "qwen2"), writer);

  SynthSummary sum;
  sum.arch = gguf_arch_name(cfg.arch);
  sum.n_layer = cfg.n_layer;
  sum.preset_n_layer = preset.config.n_layer;
  // Shared so the Fill callbacks (run later, inside writer.write) can refer to them.
  auto tensors = std::make_shared<std::vector<SynthTensor>>(plan_synth_tensors(cfg, skew, opt.seed));
  std::vector<size_t> sizes;
  for (const auto& t : *tensors) {
    const TypeChoice choice = choose_tensor_type(t.meta, req, cfg.n_layer);
    if (!choice.note.empty() && opt.on_note) opt.on_note(choice.note);
    const size_t nbytes = row_bytes(choice.type, t.meta.ne[0]) * static_cast<size_t>(t.meta.n_rows());
    sizes.push_back(nbytes);
    sum.n_tensors++;
    sum.tensor_bytes += nbytes;
    sum.n_params += static_cast<uint64_t>(t.meta.ne[0]) * static_cast<uint64_t>(t.meta.n_rows());
    sum.tensors_by_type[type_traits(choice.type).name]++;
  }
  auto done = std::make_shared<size_t>(0);
  const size_t total = tensors->size();
  for (size_t i = 0; i < total; ++i) {
    const SynthTensor* t = &(*tensors)[i];
    const GgmlType type = choose_tensor_type(t->meta, req, cfg.n_layer).type;
    const uint64_t seed = opt.seed;
    const size_t bytes_total = sum.tensor_bytes;
    writer.add_tensor(t->meta.name, type, t->meta.ne,
                      [tensors, t, type, seed, i, total, done, bytes_total, &opt](uint8_t* dst, size_t n) {
                        const auto start = std::chrono::steady_clock::now();
                        fill_synth_tensor(*t, type, seed, dst, n);
                        *done += n;
                        if (opt.on_tensor) {
                          SynthProgress p;
                          p.index = i + 1;
                          p.total = total;
                          p.name = t->meta.name;
                          p.ne = t->meta.ne;
                          p.type = type;
                          p.nbytes = n;
                          p.bytes_done = *done;
                          p.bytes_total = bytes_total;
                          p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                          opt.on_tensor(p);
                        }
                      });
  }
  writer.write(opt.out_path);
  return sum;
}

}  // namespace strata::convert
