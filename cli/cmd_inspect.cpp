// `strata inspect FILE [--json]`: what a GGUF file holds and, above all, how its bytes split between
// routed experts (which strata may keep on the CPU) and everything else (which wants VRAM), per layer.
// A file that fails validation prints the reader's one-line error and exits non-zero (via main).
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/model_summary.h"

namespace {

using strata::GgufArray;
using strata::GgufFile;
using strata::GgufType;
using strata::GgufValue;
using nlohmann::ordered_json;

constexpr size_t kArrayShown = 16;   // arrays up to this length are shown in full
constexpr size_t kStringShown = 80;  // longer strings are cut in the table view

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

const GgufArray* as_array(const GgufValue& v) {
  if (v.type != GgufType::ARRAY) return nullptr;
  const auto* p = std::get_if<std::shared_ptr<GgufArray>>(&v.v);
  return p != nullptr ? p->get() : nullptr;
}

std::string type_desc(const GgufValue& v) {
  if (const GgufArray* a = as_array(v)) return std::string("array of ") + strata::gguf_type_name(a->elem_type);
  return strata::gguf_type_name(v.type);
}

std::string escape(const std::string& s, size_t limit) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const char c = s[i];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else out += c;
  }
  if (s.size() > limit) out += "...";
  return out;
}

std::string scalar_text(const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&v.v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v.v)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", *d);
    return buf;
  }
  if (const auto* b = std::get_if<bool>(&v.v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v.v)) return "\"" + escape(*s, kStringShown) + "\"";
  return "?";
}

// Short text for a value: scalars as is, short scalar arrays in full, anything else as type + length.
std::string value_text(const GgufValue& v) {
  const GgufArray* a = as_array(v);
  if (a == nullptr) return scalar_text(v);
  const bool small = a->items.size() <= kArrayShown && a->elem_type != GgufType::ARRAY;
  if (!small) return "[" + type_desc(v) + ", " + std::to_string(a->items.size()) + " items]";
  std::string s = "[";
  for (size_t i = 0; i < a->items.size(); ++i) s += (i ? ", " : "") + scalar_text(a->items[i]);
  return s + "]";
}

ordered_json scalar_json(const GgufValue& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (const auto* d = std::get_if<double>(&v.v)) return *d;
  if (const auto* b = std::get_if<bool>(&v.v)) return *b;
  if (const auto* s = std::get_if<std::string>(&v.v)) return *s;
  return nullptr;
}

ordered_json value_json(const GgufValue& v) {
  const GgufArray* a = as_array(v);
  if (a == nullptr) return scalar_json(v);
  if (a->items.size() <= kArrayShown && a->elem_type != GgufType::ARRAY) {
    ordered_json arr = ordered_json::array();
    for (const auto& it : a->items) arr.push_back(scalar_json(it));
    return arr;
  }
  return ordered_json{{"array_of", strata::gguf_type_name(a->elem_type)}, {"length", a->items.size()}};
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double x = static_cast<double>(n);
  int u = 0;
  while (x >= 1024.0 && u < 4) {
    x /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%" PRIu64 " B", n);
  else std::snprintf(buf, sizeof buf, "%.2f %s", x, units[u]);
  return buf;
}

// Bytes one expert slot occupies summed over all layers: what each extra cached expert costs.
uint64_t one_expert_every_layer(const strata::ModelBytes& mb) {
  uint64_t sum = 0;
  for (const auto& l : mb.layers) sum += l.bytes_per_expert;
  return sum;
}

double percent(uint64_t part, uint64_t whole) { return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole); }

// Tokenizer facts, read leniently: inspect shows what is there rather than insisting on types.
struct TokenizerSummary {
  std::string model, pre;
  int64_t vocab = -1, merges = -1;
  const GgufValue* bos = nullptr;
  const GgufValue* eos = nullptr;
  int64_t chat_template_bytes = -1;
};

TokenizerSummary summarize_tokenizer(const GgufFile& f) {
  TokenizerSummary t;
  auto str = [&](const char* key) -> std::string {
    const GgufValue* v = f.find(key);
    const auto* s = v ? std::get_if<std::string>(&v->v) : nullptr;
    return s ? *s : std::string();
  };
  auto len = [&](const char* key) -> int64_t {
    const GgufValue* v = f.find(key);
    const GgufArray* a = v ? as_array(*v) : nullptr;
    return a ? static_cast<int64_t>(a->items.size()) : -1;
  };
  t.model = str("tokenizer.ggml.model");
  t.pre = str("tokenizer.ggml.pre");
  t.vocab = len("tokenizer.ggml.tokens");
  t.merges = len("tokenizer.ggml.merges");
  t.bos = f.find("tokenizer.ggml.bos_token_id");
  t.eos = f.find("tokenizer.ggml.eos_token_id");
  if (const GgufValue* v = f.find("tokenizer.chat_template")) {
    if (const auto* s = std::get_if<std::string>(&v->v)) t.chat_template_bytes = static_cast<int64_t>(s->size());
  }
  return t;
}

bool is_tokenizer_summary_key(const std::string& k) {
  return k == "tokenizer.ggml.model" || k == "tokenizer.ggml.pre" || k == "tokenizer.ggml.tokens" ||
         k == "tokenizer.ggml.merges" || k == "tokenizer.ggml.bos_token_id" || k == "tokenizer.ggml.eos_token_id" ||
         k == "tokenizer.chat_template";
}

enum class Section { General, Hyper, Tokenizer, Other };

Section section_of(const std::string& key, const std::string& arch) {
  if (!arch.empty() && starts_with(key, arch + ".")) return Section::Hyper;
  if (starts_with(key, "general.")) return Section::General;
  if (starts_with(key, "tokenizer.")) return Section::Tokenizer;
  return Section::Other;
}

// Multi-token-prediction blocks (<arch>.nextn_predict_layers), 0 when the file has none.
uint32_t mtp_layers(const GgufFile& f, const std::string& arch) {
  return arch.empty() ? 0 : f.get_u32_or(arch + ".nextn_predict_layers", 0);
}

void print_text(const GgufFile& f, const std::string& arch, const strata::ModelBytes& mb) {
  std::printf("file          %s\n", f.path().c_str());
  std::printf("format        GGUF v%u, alignment %zu, %s (%zu bytes), data at offset %" PRIu64 "\n", f.version(),
              f.alignment(), human_bytes(f.file_size()).c_str(), f.file_size(), f.data_offset());
  std::printf("contents      %zu tensors, %zu metadata keys\n", f.tensors().size(), f.metadata().size());
  std::printf("architecture  %s\n", arch.empty() ? "(none: general.architecture missing)" : arch.c_str());
  if (const uint32_t n_mtp = mtp_layers(f, arch)) {
    const uint64_t n_block = f.get_u32_or(arch + ".block_count", 0);
    std::printf("MTP           %u layer(s) after the trunk, blk.%" PRIu64 " .. (nextn.*: drafts with --spec mtp)\n", n_mtp,
                n_block - n_mtp);
  }

  auto print_section = [&](Section s, const char* title, bool skip_summary_keys) {
    bool any = false;
    for (const auto& [k, v] : f.metadata()) {
      if (section_of(k, arch) != s || (skip_summary_keys && is_tokenizer_summary_key(k))) continue;
      if (s == Section::General && k == "general.architecture") continue;
      if (!any) std::printf("\n%s\n", title);
      any = true;
      std::printf("  %-44s %-15s %s\n", k.c_str(), type_desc(v).c_str(), value_text(v).c_str());
    }
  };
  print_section(Section::Hyper, ("hyperparameters (" + arch + ".*)").c_str(), false);
  print_section(Section::General, "general", false);

  const TokenizerSummary t = summarize_tokenizer(f);
  std::printf("\ntokenizer\n");
  std::printf("  %-22s %s\n", "model", t.model.empty() ? "(none)" : t.model.c_str());
  std::printf("  %-22s %s\n", "pre-tokenizer", t.pre.empty() ? "(none)" : t.pre.c_str());
  std::printf("  %-22s %s\n", "vocab size", t.vocab < 0 ? "(none)" : std::to_string(t.vocab).c_str());
  std::printf("  %-22s %s\n", "merges", t.merges < 0 ? "(none)" : std::to_string(t.merges).c_str());
  std::printf("  %-22s %s\n", "bos id", t.bos ? value_text(*t.bos).c_str() : "(none)");
  std::printf("  %-22s %s\n", "eos id", t.eos ? value_text(*t.eos).c_str() : "(none)");
  std::printf("  %-22s %s\n", "chat template",
              t.chat_template_bytes < 0 ? "no" : ("yes (" + std::to_string(t.chat_template_bytes) + " bytes)").c_str());
  print_section(Section::Tokenizer, "other tokenizer keys", true);
  print_section(Section::Other, "other metadata", false);

  std::printf("\ntensors\n  %-48s %-7s %-24s %14s\n", "name", "type", "shape", "bytes");
  for (const auto& ti : f.tensors()) {
    std::printf("  %-48s %-7s %-24s %14zu\n", ti.name.c_str(), strata::type_traits(ti.type).name,
                ti.shape_string().c_str(), ti.nbytes);
  }

  std::printf("\nbytes per layer (routed experts vs everything else)\n");
  std::printf("  %5s %16s %16s %9s %14s\n", "layer", "expert bytes", "other bytes", "n_expert", "bytes/expert");
  for (const auto& l : mb.layers) {
    std::printf("  %5d %16" PRIu64 " %16" PRIu64 " %9" PRId64 " %14" PRIu64 "\n", l.layer, l.expert_bytes,
                l.other_bytes, l.n_expert, l.bytes_per_expert);
  }
  std::printf("  %-5s %16s %16" PRIu64 "   (token embeddings, output head, final norm)\n", "other", "0",
              mb.non_layer_bytes);
  const uint64_t total = mb.total_bytes();
  std::printf("\ntotals\n");
  std::printf("  routed experts   %16" PRIu64 "  %10s  %5.1f%%\n", mb.expert_bytes, human_bytes(mb.expert_bytes).c_str(),
              percent(mb.expert_bytes, total));
  std::printf("  everything else  %16" PRIu64 "  %10s  %5.1f%%  (outside layers: %s)\n", mb.other_bytes,
              human_bytes(mb.other_bytes).c_str(), percent(mb.other_bytes, total),
              human_bytes(mb.non_layer_bytes).c_str());
  std::printf("  all tensors      %16" PRIu64 "  %10s\n", total, human_bytes(total).c_str());
  if (mb.expert_bytes > 0) {
    const uint64_t one = one_expert_every_layer(mb);
    std::printf("  one expert in every layer: %" PRIu64 " bytes (%s); everything else must fit in VRAM first\n", one,
                human_bytes(one).c_str());
  }
}

void print_json(const GgufFile& f, const std::string& arch, const strata::ModelBytes& mb) {
  ordered_json j;
  j["file"] = f.path();
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["file_size"] = f.file_size();
  j["data_offset"] = f.data_offset();
  j["architecture"] = arch.empty() ? ordered_json(nullptr) : ordered_json(arch);
  j["mtp_layers"] = mtp_layers(f, arch);
  ordered_json hyper = ordered_json::object(), general = ordered_json::object(),
               tok_other = ordered_json::object(), other = ordered_json::object();
  for (const auto& [k, v] : f.metadata()) {
    switch (section_of(k, arch)) {
      case Section::Hyper: hyper[k] = value_json(v); break;
      case Section::General: general[k] = value_json(v); break;
      case Section::Tokenizer:
        if (!is_tokenizer_summary_key(k)) tok_other[k] = value_json(v);
        break;
      case Section::Other: other[k] = value_json(v); break;
    }
  }
  j["hyperparameters"] = hyper;
  j["general"] = general;
  const TokenizerSummary t = summarize_tokenizer(f);
  ordered_json tok;
  tok["model"] = t.model.empty() ? ordered_json(nullptr) : ordered_json(t.model);
  tok["pre"] = t.pre.empty() ? ordered_json(nullptr) : ordered_json(t.pre);
  tok["vocab_size"] = t.vocab < 0 ? ordered_json(nullptr) : ordered_json(t.vocab);
  tok["merges"] = t.merges < 0 ? ordered_json(nullptr) : ordered_json(t.merges);
  tok["bos_token_id"] = t.bos ? value_json(*t.bos) : ordered_json(nullptr);
  tok["eos_token_id"] = t.eos ? value_json(*t.eos) : ordered_json(nullptr);
  tok["has_chat_template"] = t.chat_template_bytes >= 0;
  tok["other"] = tok_other;
  j["tokenizer"] = tok;
  j["other_metadata"] = other;

  ordered_json tensors = ordered_json::array();
  for (const auto& ti : f.tensors()) {
    const strata::TensorClass c = strata::classify_tensor(ti.name);
    ordered_json shape = ordered_json::array();
    for (uint32_t d = 0; d < ti.n_dims; ++d) shape.push_back(ti.ne[d]);
    tensors.push_back({{"name", ti.name},
                       {"type", strata::type_traits(ti.type).name},
                       {"shape", shape},
                       {"bytes", ti.nbytes},
                       {"offset", ti.offset},
                       {"layer", c.layer < 0 ? ordered_json(nullptr) : ordered_json(c.layer)},
                       {"routed_expert", c.routed_expert}});
  }
  j["tensors"] = tensors;
  ordered_json layers = ordered_json::array();
  for (const auto& l : mb.layers) {
    layers.push_back({{"layer", l.layer},
                      {"expert_bytes", l.expert_bytes},
                      {"other_bytes", l.other_bytes},
                      {"n_expert", l.n_expert},
                      {"bytes_per_expert", l.bytes_per_expert}});
  }
  j["layers"] = layers;
  const uint64_t total = mb.total_bytes();
  j["totals"] = {{"expert_bytes", mb.expert_bytes},
                 {"other_bytes", mb.other_bytes},
                 {"non_layer_bytes", mb.non_layer_bytes},
                 {"total_bytes", total},
                 {"one_expert_every_layer_bytes", one_expert_every_layer(mb)},
                 {"expert_percent", percent(mb.expert_bytes, total)},
                 {"other_percent", percent(mb.other_bytes, total)}};
  // Strings in GGUF files are not guaranteed to be valid UTF-8; replace bad bytes rather than fail.
  std::printf("%s\n", j.dump(2, ' ', false, ordered_json::error_handler_t::replace).c_str());
}

struct InspectOptions {
  std::string path;
  bool json = false;
};

void setup_inspect(CLI::App& sub) {
  auto opts = std::make_shared<InspectOptions>();
  sub.add_option("file", opts->path, "GGUF file")->required();
  sub.add_flag("--json", opts->json, "Print the same facts as JSON");
  sub.callback([opts] {
    const GgufFile f = GgufFile::open(opts->path);
    std::string arch;
    if (const GgufValue* v = f.find("general.architecture")) {
      if (const auto* s = std::get_if<std::string>(&v->v)) arch = *s;
    }
    strata::ModelBytes mb;
    try {
      mb = strata::summarize_bytes(f.tensors());
    } catch (const strata::Error& e) {
      strata::fail(f.path(), ": ", e.what());
    }
    if (opts->json) print_json(f, arch, mb);
    else print_text(f, arch, mb);
  });
}

const bool registered = strata::cli::register_command("inspect", "Show a GGUF file: metadata, tensors, expert bytes",
                                                      setup_inspect);

}  // namespace
