// How a KV cache stores its rows: f32, f16 or q8_0 (blocks of 32 int8 values with an f16 scale, the
// GGUF Q8_0 layout), for keys and values independently. Backend-neutral: the CPU engine and the GPU
// session size and convert their caches through these, and the VRAM receipt counts bytes with them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "strata/model/config.h"
#include "strata/quant/types.h"

namespace strata {

enum class KvType { F32, F16, Q8_0 };

struct KvCacheTypes {
  KvType k = KvType::F32;
  KvType v = KvType::F32;
};

// "f32", "f16", "q8_0" (the names llama.cpp's --cache-type-k/-v use).
const char* kv_type_name(KvType t);
// Parses a name above; `what` names the source in the error ("--cache-type-k 'x': expected f32, f16 or q8_0").
KvType parse_kv_type(const std::string& text, const std::string& what);
// The storage format of a row (F32, F16 or Q8_0).
GgmlType kv_ggml_type(KvType t);
// Bytes of a row of n values (n a whole number of the type's blocks).
size_t kv_row_bytes(KvType t, int64_t n);

// Refuses types a model's heads cannot be stored in: q8_0 blocks must not straddle two heads, so its
// key length per head (values are stored at the key length) must be a multiple of 32.
void check_kv_types(const ModelConfig& c, const KvCacheTypes& types);
// Refuses types the GPU backend does not store (q8_0), naming those it does: the GPU sequence state
// checks it, and the backend options check it with --gpu before any model is loaded.
void check_gpu_kv_types(const KvCacheTypes& types);
// K and V bytes of one cached position of attention layer il (its own KV head
// count).
uint64_t kv_layer_row_bytes(const ModelConfig& c, int il, const KvCacheTypes& types);
// K and V bytes each token of context adds over the full-attention layers (the sliding-window layers'
// rings stop growing at their size: kv_cache_bytes in engine/sequence_state.h counts them).
uint64_t kv_bytes_per_token(const ModelConfig& c, const KvCacheTypes& types);

}  // namespace strata
