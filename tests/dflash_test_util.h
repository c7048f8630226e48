// A random DFlash drafter file (engine/dflash.h) for a target model, for the drafter's tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "process_temp_dir.h"
#include "strata/engine/model.h"
#include "strata/gguf/writer.h"

namespace strata::dflash_test {

struct Shape {
  int layers = 2, heads = 4, kv_heads = 2, head_dim = 32, rope = 16, ff = 64, block = 4;
  std::vector<int32_t> taps = {1, 5, 7};
  int context = 0;  // dflash.context_length
};

// A random F32 drafter for `target` named `name` in this process's temporary folder; `vocab` overrides
// the vocabulary it claims.
inline std::string write_drafter(const strata::Model& target, const Shape& s, const std::string& name,
                                 int64_t vocab = 0) {
  const int64_t d = target.config().n_embd;
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("dflash"));
  w.set("dflash.embedding_length", GgufValue::u32(static_cast<uint32_t>(d)));
  w.set("dflash.block_count", GgufValue::u32(static_cast<uint32_t>(s.layers)));
  w.set("dflash.attention.head_count", GgufValue::u32(static_cast<uint32_t>(s.heads)));
  w.set("dflash.attention.head_count_kv", GgufValue::u32(static_cast<uint32_t>(s.kv_heads)));
  w.set("dflash.attention.key_length", GgufValue::u32(static_cast<uint32_t>(s.head_dim)));
  w.set("dflash.attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f));
  w.set("dflash.feed_forward_length", GgufValue::u32(static_cast<uint32_t>(s.ff)));
  w.set("dflash.block_size", GgufValue::u32(static_cast<uint32_t>(s.block)));
  w.set("dflash.rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(s.rope)));
  w.set("dflash.rope.freq_base", GgufValue::f32(10000.0f));
  w.set("dflash.vocab_size", GgufValue::u64(static_cast<uint64_t>(vocab ? vocab : target.config().n_vocab)));
  w.set("dflash.target_layers", GgufValue::i32_array(s.taps));
  if (s.context > 0) w.set("dflash.context_length", GgufValue::u32(static_cast<uint32_t>(s.context)));
  auto add = [&](const std::string& n, std::vector<int64_t> ne, float scale, float offset) {
    int64_t count = 1;
    for (int64_t e : ne) count *= e;
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v) x = offset + scale * nd(rng);
    w.add_tensor(n, GgmlType::F32, ne, v.data(), v.size() * sizeof(float));
  };
  const int64_t q = static_cast<int64_t>(s.heads) * s.head_dim, kv = static_cast<int64_t>(s.kv_heads) * s.head_dim;
  add("fc.weight", {d * static_cast<int64_t>(s.taps.size()), d}, 0.05f, 0.0f);
  add("hidden_norm.weight", {d}, 0.1f, 1.0f);
  add("mask_embd.weight", {d}, 0.5f, 0.0f);
  add("output_norm.weight", {d}, 0.1f, 1.0f);
  for (int i = 0; i < s.layers; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    add(b + "attn_norm.weight", {d}, 0.1f, 1.0f);
    add(b + "attn_q_norm.weight", {s.head_dim}, 0.1f, 1.0f);
    add(b + "attn_k_norm.weight", {s.head_dim}, 0.1f, 1.0f);
    add(b + "ffn_norm.weight", {d}, 0.1f, 1.0f);
    add(b + "attn_q.weight", {d, q}, 0.08f, 0.0f);
    add(b + "attn_k.weight", {d, kv}, 0.08f, 0.0f);
    add(b + "attn_v.weight", {d, kv}, 0.08f, 0.0f);
    add(b + "attn_output.weight", {q, d}, 0.08f, 0.0f);
    add(b + "ffn_gate.weight", {d, s.ff}, 0.08f, 0.0f);
    add(b + "ffn_up.weight", {d, s.ff}, 0.08f, 0.0f);
    add(b + "ffn_down.weight", {s.ff, d}, 0.08f, 0.0f);
  }
  const std::string path = (process_temp_dir("strata_test_dflash_") / name).string();
  w.write(path);
  return path;
}

}  // namespace strata::dflash_test
