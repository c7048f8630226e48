#include "strata/model/kv_type.h"

#include "strata/base/error.h"

namespace strata {

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::F32: return "f32";
    case KvType::F16: return "f16";
    case KvType::Q8_0: return "q8_0";
  }
  return "?";
}

KvType parse_kv_type(const std::string& text, const std::string& what) {
  for (KvType t : {KvType::F32, KvType::F16, KvType::Q8_0})
    if (text == kv_type_name(t)) return t;
  fail(what, " '", text, "': expected f32, f16 or q8_0");
}

GgmlType kv_ggml_type(KvType t) {
  switch (t) {
    case KvType::F32: return GgmlType::F32;
    case KvType::F16: return GgmlType::F16;
    case KvType::Q8_0: return GgmlType::Q8_0;
  }
  return GgmlType::F32;
}

size_t kv_row_bytes(KvType t, int64_t n) { return row_bytes(kv_ggml_type(t), n); }

void check_kv_types(const ModelConfig& c, const KvCacheTypes& types) {
  auto check = [](KvType t, int length, const char* which) {
    const int64_t block = type_traits(kv_ggml_type(t)).block_elems;
    if (length % block != 0)
      fail("KV cache type ", kv_type_name(t), " for ", which, ": the model's ", which, " length per head (", length,
           ") is not a multiple of its block of ", block, " values");
  };
  check(types.k, c.head_dim, "key");
  check(types.v, c.head_dim, "value");
}

uint64_t kv_layer_row_bytes(const ModelConfig& c, int il, const KvCacheTypes& types) {
  // Both engines store values at the key length per head (the supported architectures have equal lengths).
  const int64_t width = static_cast<int64_t>(c.layer(il).n_head_kv) * c.head_dim;
  return kv_row_bytes(types.k, width) + kv_row_bytes(types.v, width);
}

uint64_t kv_bytes_per_token(const ModelConfig& c, const KvCacheTypes& types) {
  uint64_t n = 0;
  for (int il = 0; il < c.n_layer; ++il)
    if (c.mixer(il) == LayerKind::FullAttention) n += kv_layer_row_bytes(c, il, types);
  return n;
}

void check_gpu_kv_types(const KvCacheTypes& types) {
  for (KvType t : {types.k, types.v})
    if (t != KvType::F32 && t != KvType::F16)
      fail("KV cache type ", kv_type_name(t), " is not supported on the GPU (f32 or f16; q8_0 runs on the CPU)");
}

}  // namespace strata
