#include "strata/moe/model_fingerprint.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string_view>
#include <variant>

#include "strata/engine/model.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/model_summary.h"

namespace strata {
namespace {

// FNV-1a, 64 bit (offset basis and prime from the published FNV parameters).
class Fnv64 {
 public:
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) {
      h_ ^= b[i];
      h_ *= 0x100000001b3ULL;
    }
  }
  void u64(uint64_t x) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(x >> (8 * i));  // fixed byte order
    bytes(b, 8);
  }
  void str(std::string_view s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

void hash_value(Fnv64& h, const GgufValue& v) {
  h.u64(static_cast<uint64_t>(v.type));
  if (const auto* u = std::get_if<uint64_t>(&v.v)) {
    h.u64(*u);
  } else if (const auto* i = std::get_if<int64_t>(&v.v)) {
    h.u64(static_cast<uint64_t>(*i));
  } else if (const auto* d = std::get_if<double>(&v.v)) {
    h.bytes(d, sizeof *d);
  } else if (const auto* b = std::get_if<bool>(&v.v)) {
    h.u64(*b ? 1 : 0);
  } else if (const auto* s = std::get_if<std::string>(&v.v)) {
    h.str(*s);
  } else if (const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v.v)) {
    h.u64(static_cast<uint64_t>((*a)->elem_type));
    h.u64((*a)->items.size());
    for (const GgufValue& item : (*a)->items) hash_value(h, item);
  }
}

bool is_router(std::string_view name) {
  constexpr std::string_view suffix = ".ffn_gate_inp.weight";
  return name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix &&
         classify_tensor(name).layer >= 0;
}

}  // namespace

std::string model_fingerprint(const GgufFile& f) {
  Fnv64 h;
  h.str("strata-model-fingerprint-v1");
  const std::string arch = f.get_string_or("general.architecture", "");
  h.str(arch);
  const std::string prefix = arch + ".";
  for (const auto& [key, value] : f.metadata()) {
    if (arch.empty() || key.compare(0, prefix.size(), prefix) != 0) continue;
    h.str(key);
    hash_value(h, value);
  }
  h.u64(f.tensors().size());
  for (const GgufTensorInfo& t : f.tensors()) {
    h.str(t.name);
    h.u64(static_cast<uint64_t>(t.type));
    h.u64(t.n_dims);
    for (int64_t d : t.ne) h.u64(static_cast<uint64_t>(d));
    h.u64(t.offset);
    h.u64(t.nbytes);
    if (is_router(t.name) || t.name == "token_embd.weight") h.bytes(t.data, std::min<size_t>(t.nbytes, 4096));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h.value()));
  return hex;
}

ModelIdentity model_identity(const Model& model) {
  ModelIdentity id;
  const GgufFile& f = model.file();
  id.fingerprint = model_fingerprint(f);
  id.file = f.path();
  std::string base = f.path();
  if (const size_t slash = base.find_last_of('/'); slash != std::string::npos) base = base.substr(slash + 1);
  id.name = f.get_string_or("general.name", base);
  if (id.name.empty()) id.name = base;
  id.arch = model.config().arch_name;
  id.n_layer = model.config().n_layer;
  id.n_expert = model.config().n_expert;
  id.n_expert_used = model.config().n_expert_used;
  return id;
}

}  // namespace strata
