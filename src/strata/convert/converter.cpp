#include "strata/convert/converter.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <mutex>

#include "strata/base/error.h"
#include "strata/convert/gguf_metadata.h"
#include "strata/convert/hf_config.h"
#include "strata/convert/safetensors.h"
#include "strata/convert/tensor_plan.h"
#include "strata/convert/type_policy.h"
#include "strata/gguf/writer.h"
#include "strata/quant/quantize.h"
#include "strata/text/vocab.h"

namespace strata::convert {

namespace {

// Produces all rows of `t` as `type` into dst, rows spread over OpenMP threads. The first exception a
// thread throws is rethrown here (exceptions must not leave an OpenMP region).
void fill_tensor(const PlannedTensor& t, GgmlType type, uint8_t* dst, size_t nbytes) {
  const int64_t rows = t.n_rows();
  const size_t rb = row_bytes(type, t.ne[0]);
  if (rb * static_cast<size_t>(rows) != nbytes)
    fail("internal: ", t.name, ": writer asks for ", nbytes, " bytes, rows need ", rb * rows);
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(t.ne[0]));
    std::vector<float> scratch;
#pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < rows; ++r) {
      try {
        t.read_row(r, row.data(), scratch);
        quantize_row(type, row.data(), dst + static_cast<size_t>(r) * rb, t.ne[0]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace

ConvertSummary convert_hf_to_gguf(const ConvertOptions& opt) {
  namespace fs = std::filesystem;
  if (opt.hf_dir.empty()) fail("convert: no input directory (--hf DIR)");
  if (opt.out_path.empty()) fail("convert: no output file (-o OUT.gguf)");
  if (opt.threads < 0) fail("convert: --threads must be >= 0");
  if (opt.threads > 0) omp_set_num_threads(opt.threads);

  const TypeRequest req = parse_type_request(opt.type);
  HfConfig cfg = load_hf_config(opt.hf_dir);
  const HfCheckpoint ck = HfCheckpoint::open(opt.hf_dir);
  // Re-uploads often strip the MTP head but keep mtp_num_hidden_layers: with no mtp.* tensor at all the
  // trunk converts alone; some of them without the rest is still refused (the planner names one missing).
  const int declared_mtp = cfg.n_mtp;
  const auto names = ck.names();
  const bool mtp_absent = cfg.n_mtp > 0 && std::none_of(names.begin(), names.end(),
                                                        [](const std::string& n) { return n.rfind("mtp.", 0) == 0; });
  if (mtp_absent) cfg.n_mtp = 0;
  const ConversionPlan plan = plan_conversion(cfg, ck);

  ConvertSummary sum;
  sum.arch = gguf_arch_name(cfg.arch);
  sum.ignored = plan.ignored;
  auto note = [&](const std::string& s) {
    sum.notes.push_back(s);
    if (opt.on_note) opt.on_note(s);
  };
  for (const auto& s : plan.ignored) {
    if (opt.on_note) opt.on_note("ignored " + s);
  }
  if (mtp_absent)
    note(cat("config.json declares mtp_num_hidden_layers = ", declared_mtp,
             " but the checkpoint has no MTP weights (no mtp.* tensors): converted without the MTP layer, so "
             "--spec mtp will not be available with this GGUF"));

  GgufWriter writer;
  std::string name = fs::path(opt.hf_dir).filename().string();
  if (name.empty()) name = fs::path(opt.hf_dir).parent_path().filename().string();
  write_model_metadata(cfg, name, req.file_type, writer);

  if (fs::exists(fs::path(opt.hf_dir) / "tokenizer.json")) {
    Vocab vocab = vocab_from_hf_dir(opt.hf_dir);
    if (static_cast<int64_t>(vocab.tokens.size()) > cfg.n_vocab)
      fail(opt.hf_dir, "/tokenizer.json: ", vocab.tokens.size(), " tokens, more than vocab_size ", cfg.n_vocab,
           " (the rows of embed_tokens)");
    if (static_cast<int64_t>(vocab.tokens.size()) < cfg.n_vocab) {
      note(cat("tokenizer has ", vocab.tokens.size(), " tokens, vocab_size is ", cfg.n_vocab, ": padded with [PAD<id>]"));
      pad_vocab(vocab, cfg.n_vocab);
    }
    write_vocab_to_gguf(vocab, writer);
    sum.has_tokenizer = true;
  } else {
    note("no tokenizer.json in " + opt.hf_dir + ": the GGUF has no tokenizer metadata");
  }

  const size_t total = plan.tensors.size();
  for (size_t i = 0; i < total; ++i) {
    const PlannedTensor* t = &plan.tensors[i];
    const TypeChoice choice = choose_tensor_type(*t, req, cfg.n_layer);
    if (!choice.note.empty()) note(choice.note);
    const GgmlType type = choice.type;
    const size_t nbytes = row_bytes(type, t->ne[0]) * static_cast<size_t>(t->n_rows());
    sum.n_tensors++;
    sum.tensor_bytes += nbytes;
    sum.tensors_by_type[type_traits(type).name]++;
    writer.add_tensor(t->name, type, t->ne, [t, type, i, total, &opt](uint8_t* dst, size_t n) {
      const auto start = std::chrono::steady_clock::now();
      fill_tensor(*t, type, dst, n);
      if (opt.on_tensor) {
        TensorProgress p;
        p.index = i + 1;
        p.total = total;
        p.name = t->name;
        p.ne = t->ne;
        p.type = type;
        p.nbytes = n;
        p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        opt.on_tensor(p);
      }
    });
  }
  writer.write(opt.out_path);
  return sum;
}

}  // namespace strata::convert
