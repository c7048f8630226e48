// Tests of `strata convert` on synthetic Hugging Face checkpoints written here: a tiny safetensors
// writer (independent of the reader under test) plus config.json. Expected GGUF names, shapes and
// transforms are those of llama.cpp's GGUF files, restated in the test as explicit small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "strata/base/error.h"
#include "strata/convert/converter.h"
#include "strata/convert/safetensors.h"
#include "strata/engine/model.h"
#include "strata/engine/session.h"
#include "strata/gguf/gguf.h"
#include "strata/quant/fp16.h"
#include "strata/quant/quantize.h"

namespace fs = std::filesystem;
using namespace strata;
using nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------------
// Synthetic checkpoint construction.

struct HfTensor {
  std::string dtype = "F32";  // F32, F16, BF16, I32, F8_E4M3 / F8_E5M2 (bytes only: every value 0)
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, HF order
};

using TensorMap = std::map<std::string, HfTensor>;

std::vector<uint8_t> encode(const HfTensor& t) {
  std::vector<uint8_t> out;
  for (float v : t.values) {
    if (t.dtype == "F32") {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      for (int b = 0; b < 4; ++b) out.push_back(static_cast<uint8_t>(u >> (8 * b)));
    } else if (t.dtype.rfind("F8_", 0) == 0) {
      out.push_back(0);
    } else if (t.dtype == "I32") {
      const int32_t i = static_cast<int32_t>(v);
      for (int b = 0; b < 4; ++b) out.push_back(static_cast<uint8_t>(static_cast<uint32_t>(i) >> (8 * b)));
    } else {
      const uint16_t h = t.dtype == "BF16" ? fp32_to_bf16(v) : fp32_to_fp16(v);
      out.push_back(static_cast<uint8_t>(h));
      out.push_back(static_cast<uint8_t>(h >> 8));
    }
  }
  return out;
}

void write_safetensors(const std::string& path, const TensorMap& tensors) {
  json header = json::object();
  std::vector<uint8_t> data;
  for (const auto& [name, t] : tensors) {
    const auto bytes = encode(t);
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + bytes.size()}}};
    data.insert(data.end(), bytes.begin(), bytes.end());
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = h.size();
  for (int b = 0; b < 8; ++b) out.put(static_cast<char>(n >> (8 * b)));
  out << h;
  out.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

// Deterministic values with small magnitudes, distinct per tensor.
std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 0.05f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

HfTensor rnd(std::vector<int64_t> shape, uint32_t seed, float scale = 0.05f) {
  HfTensor t;
  t.shape = std::move(shape);
  t.values = random_values(numel(t.shape), seed, scale);
  return t;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = testing::TempDir() + "/strata_convert_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(2); }

// ---------------------------------------------------------------------------------------------
// Tiny qwen3_moe.

struct Qwen3MoeDims {
  int layers = 2, hidden = 256, heads = 4, kv = 2, head_dim = 64, experts = 4, used = 2, ff = 256, vocab = 300;
};

json qwen3moe_config(const Qwen3MoeDims& d) {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"num_hidden_layers", d.layers},
          {"hidden_size", d.hidden},
          {"intermediate_size", 512},
          {"num_attention_heads", d.heads},
          {"num_key_value_heads", d.kv},
          {"head_dim", d.head_dim},
          {"vocab_size", d.vocab},
          {"max_position_embeddings", 4096},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 1000000.0},
          {"num_experts", d.experts},
          {"num_experts_per_tok", d.used},
          {"moe_intermediate_size", d.ff},
          {"norm_topk_prob", true},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()},
          {"tie_word_embeddings", false}};
}

TensorMap qwen3moe_tensors(const Qwen3MoeDims& d) {
  TensorMap m;
  uint32_t seed = 1;
  const int64_t E = d.hidden, D = d.head_dim;
  m["model.embed_tokens.weight"] = rnd({d.vocab, E}, seed++);
  m["model.norm.weight"] = rnd({E}, seed++, 1.0f);
  m["lm_head.weight"] = rnd({d.vocab, E}, seed++);
  for (int l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    m[p + "input_layernorm.weight"] = rnd({E}, seed++, 1.0f);
    m[p + "post_attention_layernorm.weight"] = rnd({E}, seed++, 1.0f);
    m[p + "self_attn.q_proj.weight"] = rnd({d.heads * D, E}, seed++);
    m[p + "self_attn.k_proj.weight"] = rnd({d.kv * D, E}, seed++);
    m[p + "self_attn.v_proj.weight"] = rnd({d.kv * D, E}, seed++);
    m[p + "self_attn.o_proj.weight"] = rnd({E, d.heads * D}, seed++);
    m[p + "self_attn.q_norm.weight"] = rnd({D}, seed++, 1.0f);
    m[p + "self_attn.k_norm.weight"] = rnd({D}, seed++, 1.0f);
    m[p + "mlp.gate.weight"] = rnd({d.experts, E}, seed++);
    for (int e = 0; e < d.experts; ++e) {
      const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
      m[q + "gate_proj.weight"] = rnd({d.ff, E}, seed++);
      m[q + "up_proj.weight"] = rnd({d.ff, E}, seed++);
      m[q + "down_proj.weight"] = rnd({E, d.ff}, seed++);
    }
  }
  return m;
}

// A qwen3_moe checkpoint whose tensors `edit` changes before they are written.
std::string make_qwen3moe_edited(const std::string& name, const Qwen3MoeDims& d,
                                 const std::function<void(TensorMap&)>& edit) {
  const std::string dir = fresh_dir(name);
  write_json(dir + "/config.json", qwen3moe_config(d));
  TensorMap m = qwen3moe_tensors(d);
  edit(m);
  write_safetensors(dir + "/model.safetensors", m);
  return dir;
}

std::string make_qwen3moe(const std::string& name, const Qwen3MoeDims& d, TensorMap* out = nullptr) {
  const std::string dir = fresh_dir(name);
  write_json(dir + "/config.json", qwen3moe_config(d));
  TensorMap m = qwen3moe_tensors(d);
  write_safetensors(dir + "/model.safetensors", m);
  if (out) *out = std::move(m);
  return dir;
}

// ---------------------------------------------------------------------------------------------
// Tiny qwen3_5_moe (multimodal wrapper, fused experts).

struct Qwen35Dims {
  int layers = 4, hidden = 256, heads = 2, kv = 1, head_dim = 64, experts = 4, used = 2, ff = 64, shff = 64,
      vocab = 300, hk = 2, hv = 4, dk = 32, dv = 32, kernel = 4;
  int interval = 4;             // full attention at layers interval-1, 2*interval-1, ...
  bool write_interval = true;   // false: the layout only as layer_types (current transformers)
  bool full(int l) const { return (l + 1) % interval == 0; }
  int key_dim() const { return hk * dk; }
  int value_dim() const { return hv * dv; }
  int conv_dim() const { return 2 * key_dim() + value_dim(); }
};

json qwen35_config(const Qwen35Dims& d) {
  json layer_types = json::array();
  for (int i = 0; i < d.layers; ++i) layer_types.push_back(d.full(i) ? "full_attention" : "linear_attention");
  json text = {{"model_type", "qwen3_5_moe_text"},
               {"num_hidden_layers", d.layers},
               {"hidden_size", d.hidden},
               {"num_attention_heads", d.heads},
               {"num_key_value_heads", d.kv},
               {"head_dim", d.head_dim},
               {"vocab_size", d.vocab},
               {"max_position_embeddings", 262144},
               {"rms_norm_eps", 1e-6},
               {"num_experts", d.experts},
               {"num_experts_per_tok", d.used},
               {"moe_intermediate_size", d.ff},
               {"shared_expert_intermediate_size", d.shff},
               {"linear_conv_kernel_dim", d.kernel},
               {"linear_num_key_heads", d.hk},
               {"linear_num_value_heads", d.hv},
               {"linear_key_head_dim", d.dk},
               {"linear_value_head_dim", d.dv},
               {"layer_types", layer_types},
               {"rope_parameters",
                {{"rope_type", "default"},
                 {"rope_theta", 10000000.0},
                 {"partial_rotary_factor", 0.25},
                 {"mrope_section", {11, 11, 10}},
                 {"mrope_interleaved", true}}},
               {"tie_word_embeddings", false}};
  if (d.write_interval) text["full_attention_interval"] = d.interval;
  return {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
          {"model_type", "qwen3_5_moe"},
          {"text_config", text},
          {"vision_config", {{"depth", 2}}},
          {"tie_word_embeddings", false}};
}

TensorMap qwen35_tensors(const Qwen35Dims& d) {
  TensorMap m;
  uint32_t seed = 1000;
  const int64_t E = d.hidden, D = d.head_dim;
  const std::string root = "model.language_model.";
  m[root + "embed_tokens.weight"] = rnd({d.vocab, E}, seed++);
  m[root + "norm.weight"] = rnd({E}, seed++, 0.1f);
  m["lm_head.weight"] = rnd({d.vocab, E}, seed++);
  m["model.visual.blocks.0.attn.qkv.weight"] = rnd({48, 16}, seed++);
  m["mtp.fc.weight"] = rnd({E, 2 * E}, seed++);
  for (int l = 0; l < d.layers; ++l) {
    const std::string p = root + "layers." + std::to_string(l) + ".";
    m[p + "input_layernorm.weight"] = rnd({E}, seed++, 0.1f);
    m[p + "post_attention_layernorm.weight"] = rnd({E}, seed++, 0.1f);
    if (d.full(l)) {
      m[p + "self_attn.q_proj.weight"] = rnd({2 * d.heads * D, E}, seed++);
      m[p + "self_attn.k_proj.weight"] = rnd({d.kv * D, E}, seed++);
      m[p + "self_attn.v_proj.weight"] = rnd({d.kv * D, E}, seed++);
      m[p + "self_attn.o_proj.weight"] = rnd({E, d.heads * D}, seed++);
      m[p + "self_attn.q_norm.weight"] = rnd({D}, seed++, 0.1f);
      m[p + "self_attn.k_norm.weight"] = rnd({D}, seed++, 0.1f);
    } else {
      const std::string a = p + "linear_attn.";
      m[a + "in_proj_qkv.weight"] = rnd({d.conv_dim(), E}, seed++);
      m[a + "in_proj_z.weight"] = rnd({d.value_dim(), E}, seed++);
      m[a + "in_proj_b.weight"] = rnd({d.hv, E}, seed++);
      m[a + "in_proj_a.weight"] = rnd({d.hv, E}, seed++);
      m[a + "conv1d.weight"] = rnd({d.conv_dim(), 1, d.kernel}, seed++);
      m[a + "dt_bias"] = rnd({d.hv}, seed++, 1.0f);
      m[a + "A_log"] = rnd({d.hv}, seed++, 1.0f);
      m[a + "norm.weight"] = rnd({d.dv}, seed++, 1.0f);
      m[a + "out_proj.weight"] = rnd({E, d.value_dim()}, seed++);
    }
    m[p + "mlp.gate.weight"] = rnd({d.experts, E}, seed++);
    m[p + "mlp.experts.gate_up_proj"] = rnd({d.experts, 2 * d.ff, E}, seed++);
    m[p + "mlp.experts.down_proj"] = rnd({d.experts, E, d.ff}, seed++);
    m[p + "mlp.shared_expert_gate.weight"] = rnd({1, E}, seed++);
    m[p + "mlp.shared_expert.gate_proj.weight"] = rnd({d.shff, E}, seed++);
    m[p + "mlp.shared_expert.up_proj.weight"] = rnd({d.shff, E}, seed++);
    m[p + "mlp.shared_expert.down_proj.weight"] = rnd({E, d.shff}, seed++);
  }
  return m;
}

std::string make_qwen35(const std::string& name, const Qwen35Dims& d, TensorMap* out = nullptr) {
  const std::string dir = fresh_dir(name);
  write_json(dir + "/config.json", qwen35_config(d));
  TensorMap m = qwen35_tensors(d);
  write_safetensors(dir + "/model.safetensors", m);
  if (out) *out = std::move(m);
  return dir;
}

// ---------------------------------------------------------------------------------------------
// Tiny laguna (transformers' LagunaConfig fields; per-expert tensors as transformers saves them).

struct LagunaDims {
  int layers = 4, hidden = 256, kv = 2, head_dim = 64, experts = 4, used = 2, ff = 64, shff = 64, dense_ff = 256,
      vocab = 300, window = 4;
  std::vector<int> heads = {2, 4, 4, 2};
  std::vector<std::string> types = {"full_attention", "sliding_attention", "sliding_attention", "full_attention"};
  std::vector<std::string> mlp = {"dense", "sparse", "sparse", "sparse"};
  json gating = true;
  std::string full_rope_type = "default";
  json full_rope_extra = json::object();  // merged into rope_parameters.full_attention (YaRN's fields)
};

json laguna_config(const LagunaDims& d) {
  json full = {{"rope_type", d.full_rope_type}, {"rope_theta", 500000.0}, {"partial_rotary_factor", 0.5}};
  full.update(d.full_rope_extra);
  return {{"architectures", {"LagunaForCausalLM"}},
          {"model_type", "laguna"},
          {"num_hidden_layers", d.layers},
          {"hidden_size", d.hidden},
          {"intermediate_size", d.dense_ff},
          {"num_attention_heads", d.heads[0]},
          {"num_attention_heads_per_layer", d.heads},
          {"num_key_value_heads", d.kv},
          {"head_dim", d.head_dim},
          {"vocab_size", d.vocab},
          {"max_position_embeddings", 4096},
          {"rms_norm_eps", 1e-6},
          {"num_experts", d.experts},
          {"num_experts_per_tok", d.used},
          {"moe_intermediate_size", d.ff},
          {"shared_expert_intermediate_size", d.shff},
          {"moe_routed_scaling_factor", 2.5},
          {"moe_router_logit_softcapping", 4.0},
          {"gating", d.gating},
          {"sliding_window", d.window},
          {"layer_types", d.types},
          {"mlp_layer_types", d.mlp},
          {"rope_parameters",
           {{"full_attention", full},
            {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 1.0}}}}},
          {"tie_word_embeddings", false}};
}

TensorMap laguna_tensors(const LagunaDims& d) {
  TensorMap m;
  uint32_t seed = 5000;
  const int64_t E = d.hidden, D = d.head_dim;
  m["model.embed_tokens.weight"] = rnd({d.vocab, E}, seed++, 1.0f);
  m["model.norm.weight"] = rnd({E}, seed++, 1.0f);
  m["lm_head.weight"] = rnd({d.vocab, E}, seed++);
  for (int l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t H = d.heads[static_cast<size_t>(l)];
    m[p + "input_layernorm.weight"] = rnd({E}, seed++, 1.0f);
    m[p + "post_attention_layernorm.weight"] = rnd({E}, seed++, 1.0f);
    m[p + "self_attn.q_proj.weight"] = rnd({H * D, E}, seed++);
    m[p + "self_attn.k_proj.weight"] = rnd({d.kv * D, E}, seed++);
    m[p + "self_attn.v_proj.weight"] = rnd({d.kv * D, E}, seed++);
    m[p + "self_attn.o_proj.weight"] = rnd({E, H * D}, seed++);
    m[p + "self_attn.q_norm.weight"] = rnd({D}, seed++, 1.0f);
    m[p + "self_attn.k_norm.weight"] = rnd({D}, seed++, 1.0f);
    const bool per_head = d.gating == json(true) || d.gating == json("per-head");
    m[p + "self_attn.g_proj.weight"] = rnd({per_head ? H : H * D, E}, seed++);
    if (d.mlp[static_cast<size_t>(l)] == "dense") {
      m[p + "mlp.gate_proj.weight"] = rnd({d.dense_ff, E}, seed++);
      m[p + "mlp.up_proj.weight"] = rnd({d.dense_ff, E}, seed++);
      m[p + "mlp.down_proj.weight"] = rnd({E, d.dense_ff}, seed++);
      continue;
    }
    m[p + "mlp.gate.weight"] = rnd({d.experts, E}, seed++);
    // The selection bias under both names transformers and the released checkpoints use.
    m[p + (l % 2 ? "mlp.gate.e_score_correction_bias" : "mlp.experts.e_score_correction_bias")] =
        rnd({d.experts}, seed++, 0.5f);
    for (int e = 0; e < d.experts; ++e) {
      const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
      m[q + "gate_proj.weight"] = rnd({d.ff, E}, seed++);
      m[q + "up_proj.weight"] = rnd({d.ff, E}, seed++);
      m[q + "down_proj.weight"] = rnd({E, d.ff}, seed++);
    }
    m[p + "mlp.shared_experts.gate_proj.weight"] = rnd({d.shff, E}, seed++);
    m[p + "mlp.shared_experts.up_proj.weight"] = rnd({d.shff, E}, seed++);
    m[p + "mlp.shared_experts.down_proj.weight"] = rnd({E, d.shff}, seed++);
  }
  return m;
}

std::string make_laguna(const std::string& name, const LagunaDims& d, TensorMap* out = nullptr) {
  const std::string dir = fresh_dir(name);
  write_json(dir + "/config.json", laguna_config(d));
  TensorMap m = laguna_tensors(d);
  write_safetensors(dir + "/model.safetensors", m);
  if (out) *out = std::move(m);
  return dir;
}

// ---------------------------------------------------------------------------------------------
// Conversion and reading back.

convert::ConvertSummary run_convert(const std::string& dir, const std::string& out, const std::string& type,
                                    std::vector<std::string>* notes = nullptr) {
  convert::ConvertOptions opt;
  opt.hf_dir = dir;
  opt.out_path = out;
  opt.type = type;
  opt.threads = 2;
  opt.on_note = [notes](const std::string& s) {
    if (notes) notes->push_back(s);
  };
  return convert::convert_hf_to_gguf(opt);
}

std::vector<float> gguf_floats(const GgufTensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.n_elements()));
  for (int64_t r = 0; r < t.n_rows(); ++r)
    dequantize_row(t.type, t.data + r * t.row_nbytes(), out.data() + r * t.ne[0], t.ne[0]);
  return out;
}

std::vector<int64_t> ne_of(const GgufTensorInfo& t) { return std::vector<int64_t>(t.ne, t.ne + t.n_dims); }

// Expects GGUF tensor bytes to equal the float32 values exactly (F32 output of F32 input).
void expect_f32_exact(const GgufTensorInfo& t, const std::vector<float>& expected) {
  ASSERT_EQ(t.type, GgmlType::F32) << t.name;
  ASSERT_EQ(static_cast<size_t>(t.n_elements()), expected.size()) << t.name;
  EXPECT_EQ(std::memcmp(t.data, expected.data(), expected.size() * 4), 0) << t.name << " differs from its source";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

// =============================================================================================

TEST(ConvertQwen3Moe, NamesShapesMetadataAndExactF32Values) {
  Qwen3MoeDims d;
  TensorMap hf;
  const std::string dir = make_qwen3moe("q3_f32", d, &hf);
  const std::string out = dir + "/out.gguf";
  const auto sum = run_convert(dir, out, "f32");
  EXPECT_EQ(sum.arch, "qwen3moe");
  EXPECT_EQ(sum.n_tensors, 3u + 2u * 12u);

  GgufFile g = GgufFile::open(out);
  EXPECT_EQ(g.get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(g.get_u32("general.file_type"), 0u);
  EXPECT_EQ(g.get_u32("qwen3moe.block_count"), 2u);
  EXPECT_EQ(g.get_u32("qwen3moe.context_length"), 4096u);
  EXPECT_EQ(g.get_u32("qwen3moe.embedding_length"), 256u);
  EXPECT_EQ(g.get_u32("qwen3moe.feed_forward_length"), 512u);
  EXPECT_EQ(g.get_u32("qwen3moe.attention.head_count"), 4u);
  EXPECT_EQ(g.get_u32("qwen3moe.attention.head_count_kv"), 2u);
  EXPECT_EQ(g.get_u32("qwen3moe.attention.key_length"), 64u);
  EXPECT_EQ(g.get_u32("qwen3moe.attention.value_length"), 64u);
  EXPECT_EQ(g.get_u32("qwen3moe.expert_count"), 4u);
  EXPECT_EQ(g.get_u32("qwen3moe.expert_used_count"), 2u);
  EXPECT_EQ(g.get_u32("qwen3moe.expert_feed_forward_length"), 256u);
  EXPECT_FLOAT_EQ(g.get_f32("qwen3moe.rope.freq_base"), 1000000.0f);
  EXPECT_FLOAT_EQ(g.get_f32("qwen3moe.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(g.find("qwen3moe.attention.layer_norm_rms_epsilon")->type, GgufType::F32);
  EXPECT_EQ(g.find("qwen3moe.block_count")->type, GgufType::U32);
  EXPECT_FALSE(g.has("qwen3moe.rope.dimension_count"));

  // Shapes: ne = reversed HF shape; experts stacked in ne[2].
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"token_embd.weight", {256, 300}},        {"output_norm.weight", {256}},
      {"output.weight", {256, 300}},            {"blk.1.attn_norm.weight", {256}},
      {"blk.1.attn_q.weight", {256, 256}},      {"blk.1.attn_k.weight", {256, 128}},
      {"blk.1.attn_v.weight", {256, 128}},      {"blk.1.attn_output.weight", {256, 256}},
      {"blk.1.attn_q_norm.weight", {64}},       {"blk.1.attn_k_norm.weight", {64}},
      {"blk.1.ffn_norm.weight", {256}},         {"blk.1.ffn_gate_inp.weight", {256, 4}},
      {"blk.1.ffn_gate_exps.weight", {256, 256, 4}}, {"blk.1.ffn_up_exps.weight", {256, 256, 4}},
      {"blk.1.ffn_down_exps.weight", {256, 256, 4}},
  };
  for (const auto& [name, ne] : shapes) {
    const GgufTensorInfo* t = g.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(ne_of(*t), ne) << name;
    EXPECT_EQ(t->type, GgmlType::F32) << name;
  }

  // Values: straight copies, qwen3moe norms NOT shifted by one.
  expect_f32_exact(g.tensor("token_embd.weight"), hf["model.embed_tokens.weight"].values);
  expect_f32_exact(g.tensor("output.weight"), hf["lm_head.weight"].values);
  expect_f32_exact(g.tensor("output_norm.weight"), hf["model.norm.weight"].values);
  expect_f32_exact(g.tensor("blk.1.attn_q.weight"), hf["model.layers.1.self_attn.q_proj.weight"].values);
  expect_f32_exact(g.tensor("blk.0.attn_k_norm.weight"), hf["model.layers.0.self_attn.k_norm.weight"].values);
  expect_f32_exact(g.tensor("blk.0.ffn_norm.weight"), hf["model.layers.0.post_attention_layernorm.weight"].values);
  expect_f32_exact(g.tensor("blk.0.ffn_gate_inp.weight"), hf["model.layers.0.mlp.gate.weight"].values);

  // Expert stacking: the slice ne[2] == e is expert e, in expert order.
  for (const char* w : {"gate", "up", "down"}) {
    std::vector<float> expected;
    for (int e = 0; e < d.experts; ++e) {
      const auto& v = hf["model.layers.1.mlp.experts." + std::to_string(e) + "." + w + "_proj.weight"].values;
      expected.insert(expected.end(), v.begin(), v.end());
    }
    expect_f32_exact(g.tensor(std::string("blk.1.ffn_") + w + "_exps.weight"), expected);
  }
}

TEST(ConvertQwen35Moe, MultimodalFusedExpertsTransformsAndMetadata) {
  Qwen35Dims d;
  TensorMap hf;
  const std::string dir = make_qwen35("q35_f32", d, &hf);
  const std::string out = dir + "/out.gguf";
  const auto sum = run_convert(dir, out, "f32");
  EXPECT_EQ(sum.arch, "qwen35moe");
  EXPECT_EQ(sum.ignored.size(), 2u);  // the vision tensor and the MTP tensor

  GgufFile g = GgufFile::open(out);
  EXPECT_EQ(g.get_string("general.architecture"), "qwen35moe");
  EXPECT_EQ(g.get_u32("qwen35moe.block_count"), 4u);
  EXPECT_EQ(g.get_u32("qwen35moe.context_length"), 262144u);
  EXPECT_FALSE(g.has("qwen35moe.feed_forward_length"));
  EXPECT_EQ(g.get_u32("qwen35moe.attention.key_length"), 64u);
  EXPECT_EQ(g.get_u32("qwen35moe.expert_shared_feed_forward_length"), 64u);
  EXPECT_EQ(g.get_u32("qwen35moe.rope.dimension_count"), 16u);  // 64 * 0.25
  EXPECT_EQ(g.get_int_array("qwen35moe.rope.dimension_sections"), (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(g.get_u32("qwen35moe.ssm.conv_kernel"), 4u);
  EXPECT_EQ(g.get_u32("qwen35moe.ssm.state_size"), 32u);
  EXPECT_EQ(g.get_u32("qwen35moe.ssm.group_count"), 2u);
  EXPECT_EQ(g.get_u32("qwen35moe.ssm.time_step_rank"), 4u);
  EXPECT_EQ(g.get_u32("qwen35moe.ssm.inner_size"), 128u);
  EXPECT_EQ(g.get_u32("qwen35moe.full_attention_interval"), 4u);
  EXPECT_FLOAT_EQ(g.get_f32("qwen35moe.rope.freq_base"), 1e7f);

  const std::string L = "model.language_model.layers.";
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"token_embd.weight", {256, 300}},
      {"output.weight", {256, 300}},
      {"blk.0.attn_norm.weight", {256}},
      {"blk.0.post_attention_norm.weight", {256}},
      {"blk.0.attn_qkv.weight", {256, 256}},
      {"blk.0.attn_gate.weight", {256, 128}},
      {"blk.0.ssm_beta.weight", {256, 4}},
      {"blk.0.ssm_alpha.weight", {256, 4}},
      {"blk.0.ssm_conv1d.weight", {4, 256}},
      {"blk.0.ssm_dt.bias", {4}},
      {"blk.0.ssm_a", {4}},
      {"blk.0.ssm_norm.weight", {32}},
      {"blk.0.ssm_out.weight", {128, 256}},
      {"blk.3.attn_q.weight", {256, 256}},
      {"blk.3.attn_k.weight", {256, 64}},
      {"blk.3.attn_v.weight", {256, 64}},
      {"blk.3.attn_output.weight", {128, 256}},
      {"blk.3.attn_q_norm.weight", {64}},
      {"blk.0.ffn_gate_inp.weight", {256, 4}},
      {"blk.0.ffn_gate_exps.weight", {256, 64, 4}},
      {"blk.0.ffn_up_exps.weight", {256, 64, 4}},
      {"blk.0.ffn_down_exps.weight", {64, 256, 4}},
      {"blk.0.ffn_gate_inp_shexp.weight", {256}},
      {"blk.0.ffn_gate_shexp.weight", {256, 64}},
      {"blk.0.ffn_down_shexp.weight", {64, 256}},
  };
  for (const auto& [name, ne] : shapes) {
    const GgufTensorInfo* t = g.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(ne_of(*t), ne) << name;
  }
  EXPECT_EQ(g.find_tensor("blk.3.attn_qkv.weight"), nullptr);  // full-attention layer has no DeltaNet
  EXPECT_EQ(g.find_tensor("blk.0.attn_q.weight"), nullptr);

  // Zero-centred norms are stored +1; the DeltaNet output norm is not.
  auto plus_one = [](std::vector<float> v) {
    for (auto& x : v) x += 1.0f;
    return v;
  };
  expect_f32_exact(g.tensor("output_norm.weight"), plus_one(hf["model.language_model.norm.weight"].values));
  expect_f32_exact(g.tensor("blk.2.attn_norm.weight"), plus_one(hf[L + "2.input_layernorm.weight"].values));
  expect_f32_exact(g.tensor("blk.2.post_attention_norm.weight"),
                   plus_one(hf[L + "2.post_attention_layernorm.weight"].values));
  expect_f32_exact(g.tensor("blk.3.attn_q_norm.weight"), plus_one(hf[L + "3.self_attn.q_norm.weight"].values));
  expect_f32_exact(g.tensor("blk.3.attn_k_norm.weight"), plus_one(hf[L + "3.self_attn.k_norm.weight"].values));
  expect_f32_exact(g.tensor("blk.1.ssm_norm.weight"), hf[L + "1.linear_attn.norm.weight"].values);
  // q_proj keeps HF's per-head [query, gate] layout.
  expect_f32_exact(g.tensor("blk.3.attn_q.weight"), hf[L + "3.self_attn.q_proj.weight"].values);
  expect_f32_exact(g.tensor("blk.0.ffn_gate_inp_shexp.weight"), hf[L + "0.mlp.shared_expert_gate.weight"].values);

  // Fused experts: gate = first ff rows of each expert's gate_up block, up = the next ff rows.
  {
    const auto& gu = hf[L + "1.mlp.experts.gate_up_proj"].values;
    std::vector<float> gate, up;
    const size_t blk = static_cast<size_t>(d.ff) * d.hidden;
    for (int e = 0; e < d.experts; ++e) {
      const auto* base = gu.data() + e * 2 * blk;
      gate.insert(gate.end(), base, base + blk);
      up.insert(up.end(), base + blk, base + 2 * blk);
    }
    expect_f32_exact(g.tensor("blk.1.ffn_gate_exps.weight"), gate);
    expect_f32_exact(g.tensor("blk.1.ffn_up_exps.weight"), up);
    expect_f32_exact(g.tensor("blk.1.ffn_down_exps.weight"), hf[L + "1.mlp.experts.down_proj"].values);
  }

  // Value-head reorder, Hk = 2, Hv = 4: HF heads grouped by key head (G0v0, G0v1, G1v0, G1v1) = 0,1,2,3
  // are stored tiled (G0v0, G1v0, G0v1, G1v1), i.e. GGUF head p holds HF head {0, 2, 1, 3}[p].
  const int hf_head_at[4] = {0, 2, 1, 3};
  const int64_t E = d.hidden, dv = d.dv, kd = d.key_dim();
  {
    const auto& src = hf[L + "0.linear_attn.in_proj_qkv.weight"].values;  // (conv_dim, E)
    std::vector<float> expected(src.begin(), src.begin() + 2 * kd * E);    // q and k rows untouched
    for (int p = 0; p < 4; ++p) {
      const auto* b = src.data() + (2 * kd + hf_head_at[p] * dv) * E;
      expected.insert(expected.end(), b, b + dv * E);
    }
    expect_f32_exact(g.tensor("blk.0.attn_qkv.weight"), expected);
  }
  {
    const auto& src = hf[L + "0.linear_attn.in_proj_z.weight"].values;
    std::vector<float> expected;
    for (int p = 0; p < 4; ++p) expected.insert(expected.end(), src.begin() + hf_head_at[p] * dv * E,
                                                src.begin() + (hf_head_at[p] + 1) * dv * E);
    expect_f32_exact(g.tensor("blk.0.attn_gate.weight"), expected);
  }
  for (const auto& [gguf, hfn] : {std::pair{"blk.0.ssm_beta.weight", "0.linear_attn.in_proj_b.weight"},
                                  std::pair{"blk.0.ssm_alpha.weight", "0.linear_attn.in_proj_a.weight"}}) {
    const auto& src = hf[L + hfn].values;
    std::vector<float> expected;
    for (int p = 0; p < 4; ++p)
      expected.insert(expected.end(), src.begin() + hf_head_at[p] * E, src.begin() + (hf_head_at[p] + 1) * E);
    expect_f32_exact(g.tensor(gguf), expected);
  }
  {
    // conv1d (C, 1, K) -> ne [K, C]; the v channels reordered like the qkv rows.
    const auto& src = hf[L + "0.linear_attn.conv1d.weight"].values;
    const int64_t K = d.kernel;
    std::vector<float> expected(src.begin(), src.begin() + 2 * kd * K);
    for (int p = 0; p < 4; ++p) {
      const auto* b = src.data() + (2 * kd + hf_head_at[p] * dv) * K;
      expected.insert(expected.end(), b, b + dv * K);
    }
    expect_f32_exact(g.tensor("blk.0.ssm_conv1d.weight"), expected);
  }
  {
    const auto& dt = hf[L + "0.linear_attn.dt_bias"].values;
    const auto& alog = hf[L + "0.linear_attn.A_log"].values;
    std::vector<float> edt, ea;
    for (int p = 0; p < 4; ++p) {
      edt.push_back(dt[hf_head_at[p]]);
      ea.push_back(-std::exp(alog[hf_head_at[p]]));
    }
    expect_f32_exact(g.tensor("blk.0.ssm_dt.bias"), edt);
    const auto got = gguf_floats(g.tensor("blk.0.ssm_a"));
    for (int p = 0; p < 4; ++p) EXPECT_NEAR(got[p], ea[p], 1e-6 * std::abs(ea[p])) << p;
  }
  {
    // out_proj (E, value_dim): input columns reordered by head.
    const auto& src = hf[L + "0.linear_attn.out_proj.weight"].values;
    const int64_t VD = d.value_dim();
    std::vector<float> expected;
    for (int64_t row = 0; row < E; ++row)
      for (int p = 0; p < 4; ++p)
        for (int64_t w = 0; w < dv; ++w) expected.push_back(src[row * VD + hf_head_at[p] * dv + w]);
    expect_f32_exact(g.tensor("blk.0.ssm_out.weight"), expected);
  }
}

TEST(ConvertQwen35Moe, TextOnlyCheckpointWithModelPrefixAndPerExpertWeights) {
  Qwen35Dims d;
  d.layers = 4;
  const std::string dir = fresh_dir("q35_text");
  json cfg = qwen35_config(d)["text_config"];
  write_json(dir + "/config.json", cfg);  // model_type qwen3_5_moe_text, no wrapper
  TensorMap src = qwen35_tensors(d), m;
  for (auto& [name, t] : src) {
    if (name.rfind("model.visual.", 0) == 0 || name.rfind("mtp.", 0) == 0) continue;
    std::string n = name;
    if (n.rfind("model.language_model.", 0) == 0) n = "model." + n.substr(21);
    // Split fused experts into per-expert tensors.
    const auto gu = n.find("mlp.experts.gate_up_proj");
    const auto dn = n.find("mlp.experts.down_proj");
    if (gu != std::string::npos || dn != std::string::npos) {
      const std::string stem = n.substr(0, n.find("mlp.experts.") + 12);
      const int64_t rows = t.shape[1], cols = t.shape[2];
      for (int e = 0; e < d.experts; ++e) {
        auto slice = [&](int64_t r0, int64_t nr) {
          HfTensor s;
          s.shape = {nr, cols};
          s.values.assign(t.values.begin() + (e * rows + r0) * cols, t.values.begin() + (e * rows + r0 + nr) * cols);
          return s;
        };
        const std::string pe = stem + std::to_string(e) + ".";
        if (gu != std::string::npos) {
          m[pe + "gate_proj.weight"] = slice(0, rows / 2);
          m[pe + "up_proj.weight"] = slice(rows / 2, rows / 2);
        } else {
          m[pe + "down_proj.weight"] = slice(0, rows);
        }
      }
      continue;
    }
    m[n] = t;
  }
  write_safetensors(dir + "/model.safetensors", m);
  run_convert(dir, dir + "/out.gguf", "f32");

  // Same GGUF tensor data as the fused multimodal checkpoint.
  const std::string ref_dir = make_qwen35("q35_text_ref", d);
  run_convert(ref_dir, ref_dir + "/out.gguf", "f32");
  GgufFile a = GgufFile::open(dir + "/out.gguf"), b = GgufFile::open(ref_dir + "/out.gguf");
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (const auto& t : b.tensors()) {
    const GgufTensorInfo* u = a.find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(u->nbytes, t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(u->data, t.data, t.nbytes), 0) << t.name;
  }
}

// mtp_num_hidden_layers 1: the MTP head becomes blk.<n_layer> under llama.cpp's nextn names. The MTP
// layer's own tensors are checked against a checkpoint holding the same tensors as its last trunk layer
// (byte for byte: the same mapping), the nextn tensors value for value.
TEST(ConvertQwen35Moe, MtpHeadUnderNextnNames) {
  Qwen35Dims d;
  const int64_t E = d.hidden;
  json cfg = qwen35_config(d);
  cfg["text_config"]["mtp_num_hidden_layers"] = 1;
  TensorMap m = qwen35_tensors(d);
  uint32_t seed = 9000;
  m["mtp.pre_fc_norm_embedding.weight"] = rnd({E}, seed++, 0.1f);
  m["mtp.pre_fc_norm_hidden.weight"] = rnd({E}, seed++, 0.1f);
  m["mtp.norm.weight"] = rnd({E}, seed++, 0.1f);
  // The MTP layer: a full-attention layer's tensors with values of their own.
  const std::string last = "model.language_model.layers.3.";
  TensorMap as_trunk = m;
  for (const auto& [name, t] : qwen35_tensors(d)) {
    if (name.rfind(last, 0) != 0) continue;
    HfTensor fresh = rnd(t.shape, seed++, 0.5f);
    m["mtp.layers.0." + name.substr(last.size())] = fresh;
    as_trunk[name] = fresh;
  }
  const std::string dir = fresh_dir("q35_mtp");
  write_json(dir + "/config.json", cfg);
  write_safetensors(dir + "/model.safetensors", m);
  const auto sum = run_convert(dir, dir + "/out.gguf", "f32");
  EXPECT_EQ(sum.ignored.size(), 1u);  // the vision tensor only

  const std::string ref = fresh_dir("q35_mtp_ref");
  write_json(ref + "/config.json", qwen35_config(d));
  write_safetensors(ref + "/model.safetensors", as_trunk);
  run_convert(ref, ref + "/out.gguf", "f32");

  GgufFile g = GgufFile::open(dir + "/out.gguf"), r = GgufFile::open(ref + "/out.gguf");
  EXPECT_EQ(g.get_u32("qwen35moe.block_count"), 5u);
  EXPECT_EQ(g.get_u32("qwen35moe.nextn_predict_layers"), 1u);
  auto plus_one = [](std::vector<float> v) {
    for (auto& x : v) x += 1.0f;
    return v;
  };
  ASSERT_NE(g.find_tensor("blk.4.nextn.eh_proj.weight"), nullptr);
  EXPECT_EQ(ne_of(*g.find_tensor("blk.4.nextn.eh_proj.weight")), (std::vector<int64_t>{2 * E, E}));
  expect_f32_exact(g.tensor("blk.4.nextn.eh_proj.weight"), m["mtp.fc.weight"].values);
  expect_f32_exact(g.tensor("blk.4.nextn.enorm.weight"), plus_one(m["mtp.pre_fc_norm_embedding.weight"].values));
  expect_f32_exact(g.tensor("blk.4.nextn.hnorm.weight"), plus_one(m["mtp.pre_fc_norm_hidden.weight"].values));
  expect_f32_exact(g.tensor("blk.4.nextn.shared_head_norm.weight"), plus_one(m["mtp.norm.weight"].values));
  int layer_tensors = 0;
  for (const auto& t : r.tensors()) {
    if (t.name.rfind("blk.3.", 0) != 0) continue;
    const GgufTensorInfo* u = g.find_tensor("blk.4." + t.name.substr(6));
    ASSERT_NE(u, nullptr) << t.name;
    ASSERT_EQ(u->nbytes, t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(u->data, t.data, t.nbytes), 0) << t.name;
    ++layer_tensors;
  }
  EXPECT_EQ(layer_tensors, 16);
  // The trunk is unchanged by the head.
  const std::string plain_dir = make_qwen35("q35_mtp_plain", d);
  run_convert(plain_dir, plain_dir + "/o.gguf", "f32");
  const GgufFile plain = GgufFile::open(plain_dir + "/o.gguf");
  for (const auto& t : plain.tensors()) {
    const GgufTensorInfo* u = g.find_tensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(std::memcmp(u->data, t.data, t.nbytes), 0) << t.name;
  }
  auto model = Model::load(dir + "/out.gguf");
  EXPECT_EQ(model->config().n_layer, 4);
  EXPECT_EQ(model->config().n_mtp, 1);

  // A missing MTP tensor is named; more than one MTP layer is refused.
  m.erase("mtp.norm.weight");
  write_safetensors(dir + "/model.safetensors", m);
  try {
    run_convert(dir, dir + "/out2.gguf", "f32");
    ADD_FAILURE() << "expected a missing-tensor error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mtp.norm.weight"), std::string::npos) << e.what();
  }
  cfg["text_config"]["mtp_num_hidden_layers"] = 2;
  write_json(dir + "/config.json", cfg);
  EXPECT_THROW(run_convert(dir, dir + "/out3.gguf", "f32"), Error);
}

// A config declaring an MTP layer over a checkpoint without any mtp.* tensor (re-uploads often strip
// them): the trunk converts alone, with one note (on stderr from the CLI) that --spec mtp is not
// available. Some MTP tensors without the rest are still refused.
TEST(ConvertQwen35Moe, DeclaredMtpWithoutMtpTensorsConvertsTheTrunkWithANote) {
  Qwen35Dims d;
  json cfg = qwen35_config(d);
  cfg["text_config"]["mtp_num_hidden_layers"] = 1;
  TensorMap m = qwen35_tensors(d);
  m.erase("mtp.fc.weight");
  const std::string dir = fresh_dir("q35_mtp_stripped");
  write_json(dir + "/config.json", cfg);
  write_safetensors(dir + "/model.safetensors", m);
  std::vector<std::string> notes;
  const auto sum = run_convert(dir, dir + "/out.gguf", "f32", &notes);
  auto mtp_notes = [](const std::vector<std::string>& v) {
    return std::count_if(v.begin(), v.end(), [](const std::string& n) {
      return n.find("no MTP weights") != std::string::npos &&
             n.find("--spec mtp will not be available") != std::string::npos;
    });
  };
  EXPECT_EQ(mtp_notes(notes), 1);      // as reported while converting
  EXPECT_EQ(mtp_notes(sum.notes), 1);  // and in the summary

  const GgufFile g = GgufFile::open(dir + "/out.gguf");
  EXPECT_EQ(g.get_u32("qwen35moe.block_count"), 4u);
  EXPECT_FALSE(g.has("qwen35moe.nextn_predict_layers"));
  // The same tensors as the checkpoint without the MTP declaration.
  const std::string plain = make_qwen35("q35_mtp_stripped_plain", d);
  run_convert(plain, plain + "/out.gguf", "f32");
  const GgufFile p = GgufFile::open(plain + "/out.gguf");
  ASSERT_EQ(g.tensors().size(), p.tensors().size());
  for (const auto& t : p.tensors()) EXPECT_NE(g.find_tensor(t.name), nullptr) << t.name;
  EXPECT_EQ(Model::load(dir + "/out.gguf")->config().n_mtp, 0);

  // The CLI prints the note on stderr.
  const std::string cmd = std::string(STRATA_CLI) + " convert --hf " + dir + " -o " + dir + "/cli.gguf --type f32 > " +
                          dir + "/stdout.txt 2> " + dir + "/stderr.txt";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream err(dir + "/stderr.txt");
  const std::string text((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("note: config.json declares mtp_num_hidden_layers = 1 but the checkpoint has no MTP weights"),
            std::string::npos)
      << text;

  // One MTP tensor (mtp.fc.weight) without the rest: refused, naming a missing one, nothing written.
  const std::string partial = fresh_dir("q35_mtp_partial");
  write_json(partial + "/config.json", cfg);
  write_safetensors(partial + "/model.safetensors", qwen35_tensors(d));
  const std::string e = error_of([&] { run_convert(partial, partial + "/out.gguf", "f32"); });
  EXPECT_NE(e.find("of the MTP head is missing while other mtp.* tensors are present"), std::string::npos) << e;
  EXPECT_NE(e.find("'mtp."), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(partial + "/out.gguf"));
}

TEST(ConvertQwen3Moe, ShardedCheckpointEqualsSingleFile) {
  Qwen3MoeDims d;
  TensorMap all;
  const std::string one = make_qwen3moe("q3_single", d, &all);
  run_convert(one, one + "/out.gguf", "f32");

  const std::string dir = fresh_dir("q3_sharded");
  write_json(dir + "/config.json", qwen3moe_config(d));
  TensorMap a, b;
  json wm = json::object();
  int i = 0;
  for (const auto& [name, t] : all) {
    const bool first = (i++ % 2) == 0;
    (first ? a : b)[name] = t;
    wm[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir + "/model-00001-of-00002.safetensors", a);
  write_safetensors(dir + "/model-00002-of-00002.safetensors", b);
  write_json(dir + "/model.safetensors.index.json", {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}});
  run_convert(dir, dir + "/out.gguf", "f32");

  GgufFile x = GgufFile::open(one + "/out.gguf"), y = GgufFile::open(dir + "/out.gguf");
  ASSERT_EQ(x.tensors().size(), y.tensors().size());
  for (const auto& t : x.tensors()) {
    const GgufTensorInfo& u = y.tensor(t.name);
    ASSERT_EQ(u.nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(u.data, t.data, t.nbytes), 0) << t.name;
  }

  // An index naming a shard that is not there is an error naming the shard.
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  const std::string err = error_of([&] { run_convert(dir, dir + "/out2.gguf", "f32"); });
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
}

TEST(ConvertQwen3Moe, Bf16SourceToBf16AndF32IsExact) {
  Qwen3MoeDims d;
  d.layers = 1;
  const std::string dir = fresh_dir("q3_bf16");
  write_json(dir + "/config.json", qwen3moe_config(d));
  TensorMap m = qwen3moe_tensors(d);
  for (auto& [n, t] : m) {
    t.dtype = "BF16";
    for (auto& v : t.values) v = bf16_to_fp32(fp32_to_bf16(v));  // values the checkpoint holds exactly
  }
  write_safetensors(dir + "/model.safetensors", m);
  run_convert(dir, dir + "/f32.gguf", "f32");
  run_convert(dir, dir + "/bf16.gguf", "bf16");
  GgufFile f = GgufFile::open(dir + "/f32.gguf"), b = GgufFile::open(dir + "/bf16.gguf");
  EXPECT_EQ(b.get_u32("general.file_type"), 32u);
  expect_f32_exact(f.tensor("blk.0.attn_v.weight"), m["model.layers.0.self_attn.v_proj.weight"].values);
  const GgufTensorInfo& bv = b.tensor("blk.0.attn_v.weight");
  ASSERT_EQ(bv.type, GgmlType::BF16);
  const auto& v = m["model.layers.0.self_attn.v_proj.weight"].values;
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bv.data + 2 * i, 2);
    ASSERT_EQ(h, fp32_to_bf16(v[i])) << i;
  }
  EXPECT_EQ(b.tensor("blk.0.attn_norm.weight").type, GgmlType::F32);  // norms stay F32
}

// Relative RMS error of dequantised GGUF data against the source values.
double rel_rms_error(const GgufTensorInfo& t, const std::vector<float>& src) {
  const auto got = gguf_floats(t);
  double err = 0, ref = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    err += (got[i] - src[i]) * (got[i] - src[i]);
    ref += src[i] * src[i];
  }
  return std::sqrt(err / ref);
}

TEST(ConvertQwen3Moe, QuantisedOutputsDequantiseCloseToInputs) {
  Qwen3MoeDims d;
  TensorMap hf;
  const std::string dir = make_qwen3moe("q3_quant", d, &hf);
  struct Case {
    const char* type;
    GgmlType matrix;
    uint32_t file_type;
    double tol;
  };
  for (const Case& c : {Case{"q8_0", GgmlType::Q8_0, 7, 0.01}, Case{"q4_0", GgmlType::Q4_0, 2, 0.15},
                        Case{"q4_k", GgmlType::Q4_K, 14, 0.12}, Case{"q5_k", GgmlType::Q5_K, 16, 0.06},
                        Case{"q6_k", GgmlType::Q6_K, 18, 0.03}, Case{"f16", GgmlType::F16, 1, 1e-3}}) {
    SCOPED_TRACE(c.type);
    const std::string out = dir + "/" + c.type + ".gguf";
    run_convert(dir, out, c.type);
    GgufFile g = GgufFile::open(out);
    EXPECT_EQ(g.get_u32("general.file_type"), c.file_type);
    const GgufTensorInfo& q = g.tensor("blk.0.attn_q.weight");
    EXPECT_EQ(q.type, c.matrix);
    EXPECT_LT(rel_rms_error(q, hf["model.layers.0.self_attn.q_proj.weight"].values), c.tol);
    const GgufTensorInfo& up = g.tensor("blk.1.ffn_up_exps.weight");
    EXPECT_EQ(up.type, c.matrix);
    std::vector<float> stacked;
    for (int e = 0; e < d.experts; ++e) {
      const auto& v = hf["model.layers.1.mlp.experts." + std::to_string(e) + ".up_proj.weight"].values;
      stacked.insert(stacked.end(), v.begin(), v.end());
    }
    EXPECT_LT(rel_rms_error(up, stacked), c.tol);
    // Norms and the router are never quantised.
    expect_f32_exact(g.tensor("blk.0.attn_norm.weight"), hf["model.layers.0.input_layernorm.weight"].values);
    expect_f32_exact(g.tensor("blk.1.ffn_gate_inp.weight"), hf["model.layers.1.mlp.gate.weight"].values);
  }
}

TEST(ConvertQwen3Moe, Q4KMMixRecipe) {
  Qwen3MoeDims d;
  d.layers = 8;  // n/8 = 1: more-bits layers are 0, 7 and (i - 1) % 3 == 2 -> 3, 6
  const std::string dir = make_qwen3moe("q3_q4km", d);
  run_convert(dir, dir + "/out.gguf", "q4_k_m");
  GgufFile g = GgufFile::open(dir + "/out.gguf");
  EXPECT_EQ(g.get_u32("general.file_type"), 15u);
  EXPECT_EQ(g.tensor("output.weight").type, GgmlType::Q6_K);
  EXPECT_EQ(g.tensor("token_embd.weight").type, GgmlType::Q4_K);
  const std::vector<int> more = {0, 3, 6, 7};
  for (int l = 0; l < 8; ++l) {
    const bool m = std::find(more.begin(), more.end(), l) != more.end();
    const GgmlType hi = m ? GgmlType::Q6_K : GgmlType::Q4_K;
    EXPECT_EQ(g.tensor("blk." + std::to_string(l) + ".attn_v.weight").type, hi) << l;
    EXPECT_EQ(g.tensor("blk." + std::to_string(l) + ".ffn_down_exps.weight").type, hi) << l;
    EXPECT_EQ(g.tensor("blk." + std::to_string(l) + ".attn_q.weight").type, GgmlType::Q4_K) << l;
    EXPECT_EQ(g.tensor("blk." + std::to_string(l) + ".ffn_gate_exps.weight").type, GgmlType::Q4_K) << l;
    EXPECT_EQ(g.tensor("blk." + std::to_string(l) + ".ffn_norm.weight").type, GgmlType::F32) << l;
  }
}

TEST(ConvertQwen3Moe, RowLengthNotABlockMultipleFallsBackWithANote) {
  Qwen3MoeDims d;
  d.layers = 1;
  d.ff = 96;  // ffn_down_exps rows of 96: not a multiple of 256, a multiple of 32
  TensorMap hf;
  const std::string dir = make_qwen3moe("q3_fallback", d, &hf);
  std::vector<std::string> notes;
  run_convert(dir, dir + "/out.gguf", "q4_k", &notes);
  GgufFile g = GgufFile::open(dir + "/out.gguf");
  EXPECT_EQ(g.tensor("blk.0.ffn_down_exps.weight").type, GgmlType::Q8_0);
  EXPECT_EQ(g.tensor("blk.0.ffn_up_exps.weight").type, GgmlType::Q4_K);
  bool noted = false;
  for (const auto& n : notes) noted |= n.find("blk.0.ffn_down_exps.weight") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(ConvertErrors, BadInputsGiveClearMessages) {
  Qwen3MoeDims d;
  d.layers = 1;

  // Missing config.json.
  {
    const std::string dir = fresh_dir("err_noconfig");
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  }
  // Unknown model_type lists the supported ones.
  {
    const std::string dir = make_qwen3moe("err_type", d);
    json c = qwen3moe_config(d);
    c["model_type"] = "llama";
    write_json(dir + "/config.json", c);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("'llama'"), std::string::npos) << e;
    EXPECT_NE(e.find("qwen3_moe, qwen3_5_moe, qwen3_5_moe_text"), std::string::npos) << e;
  }
  // Unknown --type.
  {
    const std::string dir = make_qwen3moe("err_outtype", d);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "q3_k_xl"); });
    EXPECT_NE(e.find("q3_k_xl"), std::string::npos) << e;
    EXPECT_NE(e.find("q4_k_m"), std::string::npos) << e;
  }
  // Truncated safetensors file.
  {
    const std::string dir = make_qwen3moe("err_trunc", d);
    const auto size = fs::file_size(dir + "/model.safetensors");
    fs::resize_file(dir + "/model.safetensors", size - 100);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dir + "/o.gguf"));
  }
  // Header length beyond the file.
  {
    const std::string dir = make_qwen3moe("err_header", d);
    const auto size = fs::file_size(dir + "/model.safetensors");
    fs::resize_file(dir + "/model.safetensors", 20);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("header length"), std::string::npos) << e;
    (void)size;
  }
  // Unsupported dtype on a needed weight.
  {
    const std::string dir = fresh_dir("err_dtype");
    write_json(dir + "/config.json", qwen3moe_config(d));
    TensorMap m = qwen3moe_tensors(d);
    m["model.layers.0.self_attn.k_proj.weight"].dtype = "I32";
    write_safetensors(dir + "/model.safetensors", m);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("k_proj"), std::string::npos) << e;
    EXPECT_NE(e.find("I32"), std::string::npos) << e;
  }
  // Missing tensor, wrong shape, unknown extra tensor.
  {
    const std::string dir = fresh_dir("err_missing");
    write_json(dir + "/config.json", qwen3moe_config(d));
    TensorMap m = qwen3moe_tensors(d);
    m.erase("model.layers.0.mlp.experts.2.up_proj.weight");
    write_safetensors(dir + "/model.safetensors", m);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("model.layers.0.mlp.experts.2.up_proj.weight"), std::string::npos) << e;
  }
  {
    const std::string dir = fresh_dir("err_shape");
    write_json(dir + "/config.json", qwen3moe_config(d));
    TensorMap m = qwen3moe_tensors(d);
    m["model.layers.0.self_attn.o_proj.weight"] = rnd({256, 128}, 7);
    write_safetensors(dir + "/model.safetensors", m);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("o_proj"), std::string::npos) << e;
    EXPECT_NE(e.find("(256, 128)"), std::string::npos) << e;
  }
  {
    const std::string dir = fresh_dir("err_extra");
    write_json(dir + "/config.json", qwen3moe_config(d));
    TensorMap m = qwen3moe_tensors(d);
    m["model.layers.0.self_attn.rotary_extra.weight"] = rnd({4}, 9);
    write_safetensors(dir + "/model.safetensors", m);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("rotary_extra"), std::string::npos) << e;
  }
  // Dense layers in a qwen3_moe config are refused.
  {
    const std::string dir = make_qwen3moe("err_dense", d);
    json c = qwen3moe_config(d);
    c["mlp_only_layers"] = {0};
    write_json(dir + "/config.json", c);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("mlp_only_layers"), std::string::npos) << e;
  }
}

// Quantized checkpoints are refused before anything is planned or written: by their config's
// quantization_config (top level or text_config), and by their tensors when the config says nothing.
TEST(ConvertErrors, QuantizedCheckpointsAreRefusedAndNothingIsWritten) {
  auto refused = [](const std::string& dir) {
    const std::string out = dir + "/o.gguf";
    const std::string e = error_of([&] { run_convert(dir, out, "q8_0"); });
    EXPECT_NE(e.find("strata convert needs an unquantized checkpoint (bf16, f16 or f32 weights)"), std::string::npos)
        << e;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    return e;
  };
  Qwen3MoeDims d;
  d.layers = 1;
  {
    const std::string dir = make_qwen3moe("quant_cfg_fp8", d);
    json c = qwen3moe_config(d);
    c["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
    write_json(dir + "/config.json", c);
    const std::string e = refused(dir);
    EXPECT_NE(e.find("quantization_config.quant_method 'fp8'"), std::string::npos) << e;
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  }
  {
    Qwen35Dims q;
    const std::string dir = make_qwen35("quant_cfg_gptq", q);
    json c = qwen35_config(q);
    c["text_config"]["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
    write_json(dir + "/config.json", c);
    EXPECT_NE(refused(dir).find("quant_method 'gptq'"), std::string::npos);
  }
  {
    const std::string dir = make_qwen3moe("quant_cfg_unnamed", d);
    json c = qwen3moe_config(d);
    c["quantization_config"] = {{"load_in_4bit", true}};
    write_json(dir + "/config.json", c);
    EXPECT_NE(refused(dir).find("quantized (quantization_config)"), std::string::npos);
  }
  {
    // MLX's own key, beside packed weights.
    const std::string dir = make_qwen3moe("quant_cfg_mlx", d);
    json c = qwen3moe_config(d);
    c["quantization"] = {{"group_size", 64}, {"bits", 4}};
    write_json(dir + "/config.json", c);
    EXPECT_NE(refused(dir).find("quantized (MLX-style 'quantization', 4 bits)"), std::string::npos);
  }
  {
    // MLX-packed tensors with the config stripped of its key: the .biases companion names the format.
    const std::string e = refused(make_qwen3moe_edited("quant_mlx_tensors", d, [](TensorMap& m) {
      const std::string p = "model.layers.0.self_attn.q_proj.";
      m[p + "scales"] = rnd({2, 2}, 13);
      m[p + "biases"] = rnd({2, 2}, 14);
    }));
    EXPECT_NE(e.find("MLX-style 'biases'"), std::string::npos) << e;
    EXPECT_NE(e.find("2 tensor(s)"), std::string::npos) << e;
  }
  {
    // fp8 weights with their scales, the config stripped of quantization_config.
    const std::string e = refused(make_qwen3moe_edited("quant_f8", d, [](TensorMap& m) {
      m["model.layers.0.self_attn.q_proj.weight"].dtype = "F8_E4M3";
      m["model.layers.0.self_attn.q_proj.weight_scale_inv"] = rnd({2, 2}, 11);
    }));
    EXPECT_NE(e.find("2 tensor(s)"), std::string::npos) << e;
    EXPECT_NE(e.find("'model.layers.0.self_attn.q_proj.weight': dtype F8_E4M3"), std::string::npos) << e;
  }
  {
    // GPTQ-style packed weights instead of a float q_proj.weight.
    const std::string e = refused(make_qwen3moe_edited("quant_gptq_tensors", d, [](TensorMap& m) {
      const std::string p = "model.layers.0.self_attn.q_proj.";
      m.erase(p + "weight");
      const std::pair<const char*, const char*> packed[] = {{"qweight", "I32"}, {"qzeros", "I32"}, {"scales", "F16"}};
      for (const auto& [name, dtype] : packed) {
        m[p + name] = rnd({2, 32}, 12);
        m[p + name].dtype = dtype;
      }
    }));
    EXPECT_NE(e.find("GPTQ/AWQ-style 'qweight'"), std::string::npos) << e;
    EXPECT_EQ(e.find("is missing"), std::string::npos) << e;
  }
}

TEST(ConvertSafetensors, ReaderRejectsInconsistentHeaders) {
  const std::string dir = fresh_dir("st_bad");
  auto write_raw = [&](const std::string& header, size_t data_bytes) {
    std::ofstream out(dir + "/x.safetensors", std::ios::binary);
    const uint64_t n = header.size();
    for (int b = 0; b < 8; ++b) out.put(static_cast<char>(n >> (8 * b)));
    out << header << std::string(data_bytes, '\0');
  };
  write_raw(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24);
  EXPECT_NE(error_of([&] { convert::SafetensorsFile::open(dir + "/x.safetensors"); }).find("needs 24"), std::string::npos);
  write_raw(R"({"a":{"dtype":"Q9","shape":[2],"data_offsets":[0,8]}})", 8);
  EXPECT_NE(error_of([&] { convert::SafetensorsFile::open(dir + "/x.safetensors"); }).find("unknown dtype 'Q9'"),
            std::string::npos);
  write_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8);
  EXPECT_NE(error_of([&] { convert::SafetensorsFile::open(dir + "/x.safetensors"); }).find("end before begin"),
            std::string::npos);
  write_raw("{not json", 0);
  EXPECT_NE(error_of([&] { convert::SafetensorsFile::open(dir + "/x.safetensors"); }).find("not valid JSON"),
            std::string::npos);
  // A well-formed F16 tensor reads back exactly.
  {
    std::string h = R"({"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
    std::ofstream out(dir + "/x.safetensors", std::ios::binary);
    const uint64_t n = h.size();
    for (int b = 0; b < 8; ++b) out.put(static_cast<char>(n >> (8 * b)));
    out << h;
    const uint16_t vals[2] = {0x3c00, 0xc000};  // 1.0, -2.0
    out.write(reinterpret_cast<const char*>(vals), 4);
  }
  auto f = convert::SafetensorsFile::open(dir + "/x.safetensors");
  ASSERT_EQ(f.tensors().size(), 1u);
  float got[2];
  f.tensors()[0].read_f32(0, 2, got);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], -2.0f);
}

TEST(ConvertCli, ConvertsAndReportsErrors) {
  Qwen3MoeDims d;
  d.layers = 1;
  const std::string dir = make_qwen3moe("cli", d);
  const std::string out = dir + "/cli.gguf";
  const std::string cmd = std::string(STRATA_CLI) + " convert --hf " + dir + " -o " + out + " --type q8_0 --threads 2 > " +
                          dir + "/log.txt 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream log(dir + "/log.txt");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("blk.0.ffn_down_exps.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("15 tensors"), std::string::npos) << text;
  EXPECT_EQ(GgufFile::open(out).tensor("blk.0.attn_q.weight").type, GgmlType::Q8_0);

  const std::string bad = std::string(STRATA_CLI) + " convert --hf " + dir + " -o " + out + ".2 --type nope > " + dir +
                          "/log2.txt 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream log2(dir + "/log2.txt");
  const std::string text2((std::istreambuf_iterator<char>(log2)), std::istreambuf_iterator<char>());
  EXPECT_NE(text2.find("'nope'"), std::string::npos) << text2;
}

TEST(ConvertTokenizer, TokenizerFilesGoIntoTheGgufPaddedToVocabSize) {
  Qwen3MoeDims d;
  d.layers = 1;
  const std::string dir = make_qwen3moe("tok", d);
  // A tiny byte-level BPE tokenizer in the Hugging Face format (Qwen2 split regex).
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const std::string regex =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  json tok = {
      {"version", "1.0"},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}}, byte_level}}}},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"\xc4\xa0", 3}}},
        {"merges", json::array({json::array({"a", "b"})})}}},
      {"added_tokens",
       {{{"id", 4}, {"content", "<|im_end|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
         {"normalized", false}, {"special", true}}}}};
  write_json(dir + "/tokenizer.json", tok);
  write_json(dir + "/tokenizer_config.json", {{"eos_token", "<|im_end|>"}, {"chat_template", "{{ messages }}"}});
  const auto sum = run_convert(dir, dir + "/out.gguf", "f32");
  EXPECT_TRUE(sum.has_tokenizer);
  GgufFile g = GgufFile::open(dir + "/out.gguf");
  EXPECT_EQ(g.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "qwen2");
  const auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 300u);  // padded to vocab_size, the rows of token_embd
  EXPECT_EQ(tokens[2], "ab");
  EXPECT_EQ(tokens[4], "<|im_end|>");
  EXPECT_EQ(tokens[299], "[PAD299]");
  EXPECT_EQ(g.get_int_array("tokenizer.ggml.token_type")[4], 3);  // control
  EXPECT_EQ(g.get_string_array("tokenizer.ggml.merges"), std::vector<std::string>{"a b"});
  EXPECT_EQ(g.get_u32("tokenizer.ggml.eos_token_id"), 4u);
  EXPECT_EQ(g.get_string("tokenizer.chat_template"), "{{ messages }}");
  // A chat_template.jinja beside it wins, as transformers reads it.
  std::ofstream(dir + "/chat_template.jinja") << "{{ jinja }}";
  run_convert(dir, dir + "/out2.gguf", "f32");
  EXPECT_EQ(GgufFile::open(dir + "/out2.gguf").get_string("tokenizer.chat_template"), "{{ jinja }}");
}

// Config forms real checkpoints carry: norm_topk_prob absent is transformers' Qwen3MoeConfig default
// (false) and reaches the engine through the GGUF; rope scaling under the older "type" key is refused
// as under rope_type; a null tie_word_embeddings is the default.
TEST(ConvertQwen3Moe, ConfigFormsOfRealCheckpoints) {
  Qwen3MoeDims d;
  d.layers = 1;
  for (const bool given : {false, true}) {
    const std::string dir = make_qwen3moe(given ? "form_topk_true" : "form_topk_absent", d);
    json c = qwen3moe_config(d);
    if (given) {
      c["norm_topk_prob"] = true;
    } else {
      c.erase("norm_topk_prob");
    }
    c["tie_word_embeddings"] = nullptr;
    write_json(dir + "/config.json", c);
    run_convert(dir, dir + "/o.gguf", "f32");
    EXPECT_EQ(GgufFile::open(dir + "/o.gguf").get_bool_or("qwen3moe.expert_weights_norm", !given), given);
    EXPECT_EQ(Model::load(dir + "/o.gguf")->config().norm_topk, given);
  }
  for (const char* dict : {"rope_scaling", "rope_parameters"}) {
    const std::string dir = make_qwen3moe(std::string("form_rope_") + dict, d);
    json c = qwen3moe_config(d);
    c[dict] = {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}};
    write_json(dir + "/config.json", c);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find(std::string(dict) + ".type 'yarn'"), std::string::npos) << e;
  }
}

// A config without head_dim takes its architecture's transformers default: 256 for the Qwen3.5 MoE text
// config, 128 for Laguna, hidden_size / num_attention_heads for qwen3_moe (whose config has no such
// field). The shapes are chosen so that hidden_size / num_attention_heads differs from the first two.
TEST(ConvertConfig, AbsentHeadDimTakesTheArchitectureDefault) {
  // Converts `config` without its head_dim over `tensors`.
  auto convert_without_head_dim = [](const std::string& name, json config, const TensorMap& tensors) {
    (config.contains("text_config") ? config["text_config"] : config).erase("head_dim");
    const std::string dir = fresh_dir(name);
    write_json(dir + "/config.json", config);
    write_safetensors(dir + "/model.safetensors", tensors);
    run_convert(dir, dir + "/o.gguf", "f32");
    return GgufFile::open(dir + "/o.gguf");
  };
  {
    Qwen35Dims d;
    d.head_dim = 256;  // hidden 256 / 2 heads would give 128
    const GgufFile g = convert_without_head_dim("head_dim_q35", qwen35_config(d), qwen35_tensors(d));
    EXPECT_EQ(g.get_u32("qwen35moe.attention.key_length"), 256u);
    EXPECT_EQ(g.get_u32("qwen35moe.rope.dimension_count"), 64u);  // 256 x partial_rotary_factor 0.25
  }
  {
    LagunaDims d;
    d.head_dim = 128;
    d.heads = {4, 4, 4, 4};  // hidden 256 / 4 heads would give 64
    const GgufFile g = convert_without_head_dim("head_dim_laguna", laguna_config(d), laguna_tensors(d));
    EXPECT_EQ(g.get_u32("laguna.attention.key_length"), 128u);
  }
  {
    Qwen3MoeDims d;  // head_dim 64 = hidden 256 / 4 heads, neither of the defaults above
    d.layers = 1;
    const GgufFile g = convert_without_head_dim("head_dim_q3", qwen3moe_config(d), qwen3moe_tensors(d));
    EXPECT_EQ(g.get_u32("qwen3moe.attention.key_length"), 64u);
  }
}

// ---------------------------------------------------------------------------------------------
// laguna and the qwen3_5 layout read from layer_types.

TEST(ConvertLaguna, NamesShapesMetadataAndTheLayerProgram) {
  LagunaDims d;
  TensorMap hf;
  const std::string dir = make_laguna("laguna_f32", d, &hf);
  const std::string out = dir + "/out.gguf";
  EXPECT_EQ(run_convert(dir, out, "f32").arch, "laguna");
  const GgufFile g = GgufFile::open(out);
  EXPECT_EQ(g.get_int_array("laguna.attention.head_count"), (std::vector<int64_t>{2, 4, 4, 2}));
  EXPECT_EQ(g.get_u32("laguna.attention.head_count_kv"), 2u);
  EXPECT_EQ(g.get_u32("laguna.attention.sliding_window"), 4u);
  EXPECT_EQ(g.get_u32("laguna.attention.sliding_window_pattern"), 3u);  // full at 0 and 3
  EXPECT_EQ(g.get_f32("laguna.rope.freq_base"), 500000.0f);
  EXPECT_EQ(g.get_u32("laguna.rope.dimension_count"), 32u);
  EXPECT_EQ(g.get_f32("laguna.rope.freq_base_swa"), 10000.0f);
  EXPECT_EQ(g.get_u32("laguna.rope.dimension_count_swa"), 64u);
  EXPECT_EQ(g.get_u32("laguna.leading_dense_block_count"), 1u);
  EXPECT_EQ(g.get_u32("laguna.feed_forward_length"), 256u);
  EXPECT_EQ(g.get_u32("laguna.expert_gating_func"), 2u);
  EXPECT_EQ(g.get_f32("laguna.expert_weights_scale"), 2.5f);
  EXPECT_TRUE(g.get_bool("laguna.expert_weights_norm"));
  EXPECT_EQ(g.get_f32("laguna.router_logit_softcapping"), 4.0f);
  EXPECT_EQ(g.get_u32("laguna.expert_shared_feed_forward_length"), 64u);

  // Tensor names and straight copies (GGUF ne is the HF shape reversed).
  expect_f32_exact(g.tensor("blk.1.attn_gate.weight"), hf["model.layers.1.self_attn.g_proj.weight"].values);
  EXPECT_EQ(g.tensor("blk.1.attn_gate.weight").ne[1], 4);
  EXPECT_EQ(g.tensor("blk.1.attn_q.weight").ne[1], 4 * 64);
  EXPECT_EQ(g.tensor("blk.3.attn_q.weight").ne[1], 2 * 64);
  expect_f32_exact(g.tensor("blk.0.ffn_down.weight"), hf["model.layers.0.mlp.down_proj.weight"].values);
  expect_f32_exact(g.tensor("blk.1.exp_probs_b.bias"), hf["model.layers.1.mlp.gate.e_score_correction_bias"].values);
  expect_f32_exact(g.tensor("blk.2.exp_probs_b.bias"), hf["model.layers.2.mlp.experts.e_score_correction_bias"].values);
  expect_f32_exact(g.tensor("blk.2.ffn_up_shexp.weight"), hf["model.layers.2.mlp.shared_experts.up_proj.weight"].values);
  expect_f32_exact(g.tensor("blk.3.ffn_norm.weight"), hf["model.layers.3.post_attention_layernorm.weight"].values);
  EXPECT_EQ(g.find_tensor("blk.0.ffn_gate_inp.weight"), nullptr);
  EXPECT_EQ(g.find_tensor("blk.1.ffn_gate_inp_shexp.weight"), nullptr);  // laguna's shared expert is ungated
  EXPECT_EQ(g.tensor("blk.1.ffn_gate_exps.weight").ne[2], 4);

  // The engine reads the layer program back.
  auto model = Model::load(out);
  const ModelConfig& c = model->config();
  ASSERT_EQ(c.n_layer, 4);
  const LayerKind S = LayerKind::SlidingAttention, F = LayerKind::FullAttention;
  EXPECT_EQ(c.mixer(0), F);
  EXPECT_EQ(c.mixer(1), S);
  EXPECT_EQ(c.mixer(2), S);
  EXPECT_EQ(c.mixer(3), F);
  EXPECT_EQ(c.layer(1).window, 4);
  EXPECT_EQ(c.layer(1).n_head, 4);
  EXPECT_EQ(c.layer(3).n_head, 2);
  EXPECT_EQ(c.layer(0).rope_dims, 32);
  EXPECT_EQ(c.layer(1).rope_dims, 64);
  EXPECT_EQ(c.layer(0).rope_freq_base, 500000.0f);
  EXPECT_EQ(c.layer(2).rope_freq_base, 10000.0f);
  EXPECT_EQ(c.layer(0).ffn, FfnKind::Dense);
  EXPECT_EQ(c.layer(1).ffn, FfnKind::Moe);
  EXPECT_EQ(c.attn_gate, AttnGate::SoftplusPerHead);
  EXPECT_EQ(c.router, RouterKind::Sigmoid);
  EXPECT_EQ(c.router_softcap, 4.0f);
  EXPECT_EQ(c.expert_weights_scale, 2.5f);
  EXPECT_TRUE(c.expert_selection_bias);
  EXPECT_FALSE(c.shared_expert_gated);
  Session s(*model, 16);
  const std::vector<int32_t> ids = {1, 5, 9, 2, 7, 3, 8, 4};
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  s.forward(ids.data(), static_cast<int>(ids.size()), logits.data(), false);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

TEST(ConvertLaguna, PerElementGateAndLayoutsGgufCannotExpress) {
  {
    LagunaDims d;
    d.gating = "per-element";
    const std::string dir = make_laguna("laguna_elem", d);
    run_convert(dir, dir + "/o.gguf", "f32");
    const GgufFile g = GgufFile::open(dir + "/o.gguf");
    EXPECT_EQ(g.tensor("blk.1.attn_gate.weight").ne[1], 4 * 64);
    EXPECT_EQ(Model::load(dir + "/o.gguf")->config().attn_gate, AttnGate::SoftplusPerElement);
  }
  {
    LagunaDims d;
    d.mlp = {"dense", "sparse", "dense", "sparse"};
    const std::string dir = make_laguna("laguna_dense_late", d);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("mlp_layer_types[2] is dense after a sparse layer"), std::string::npos) << e;
  }
  {
    // YaRN on the full-attention layers: written with llama.cpp's keys, read back onto those layers only.
    LagunaDims d;
    d.full_rope_type = "yarn";
    d.full_rope_extra = {{"factor", 8.0}, {"original_max_position_embeddings", 512}, {"beta_fast", 16.0},
                         {"attention_factor", 1.5}};
    const std::string dir = make_laguna("laguna_yarn", d);
    run_convert(dir, dir + "/o.gguf", "f32");
    const ModelConfig c = Model::load(dir + "/o.gguf")->config();
    EXPECT_EQ(c.layer(0).yarn.factor, 8.0f);
    EXPECT_EQ(c.layer(0).yarn.orig_ctx, 512);
    EXPECT_EQ(c.layer(0).yarn.beta_fast, 16.0f);
    EXPECT_EQ(c.layer(0).yarn.beta_slow, 1.0f);
    EXPECT_NEAR(c.layer(0).yarn.mscale, 1.5f, 1e-6);  // HF's attention_factor, as given
    EXPECT_FALSE(c.layer(1).yarn.on());  // sliding layers keep plain rotary
    EXPECT_TRUE(c.layer(3).yarn.on());
  }
  {
    LagunaDims d;
    d.full_rope_type = "yarn";  // no original_max_position_embeddings
    const std::string dir = make_laguna("laguna_yarn_incomplete", d);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("yarn needs factor >= 1 and original_max_position_embeddings"), std::string::npos) << e;
  }
  {
    LagunaDims d;
    d.full_rope_type = "linear";
    const std::string dir = make_laguna("laguna_linear", d);
    const std::string e = error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
    EXPECT_NE(e.find("rope_parameters.full_attention.rope_type 'linear'"), std::string::npos) << e;
  }
  {
    // Every layer sliding: no period with full attention first describes it; written as flags.
    LagunaDims d;
    d.types.assign(4, "sliding_attention");
    const std::string dir = make_laguna("laguna_all_sliding", d);
    run_convert(dir, dir + "/o.gguf", "f32");
    auto model = Model::load(dir + "/o.gguf");
    for (int il = 0; il < 4; ++il) EXPECT_EQ(model->config().mixer(il), LayerKind::SlidingAttention);
  }
}

// Laguna's rope settings are read as transformers reads them: rope_parameters keyed by layer type,
// LagunaConfig's defaults when absent. A flat rope_parameters, keys beside the per-type entries, a
// top-level rope key, or a missing entry for a layer type in use are refused, naming the key.
TEST(ConvertLaguna, RopeParametersKeyedByLayerTypeOnly) {
  LagunaDims d;  // layers 0 and 3 full, 1 and 2 sliding; head_dim 64
  const std::string dir = make_laguna("laguna_rope_forms", d);
  const json base = laguna_config(d);
  auto convert_with = [&](const json& c) {
    write_json(dir + "/config.json", c);
    fs::remove(dir + "/o.gguf");
    return error_of([&] { run_convert(dir, dir + "/o.gguf", "f32"); });
  };
  // The written rope keys: full-attention theta and rotary dims, then the sliding layers'.
  auto expect_rope = [&](float theta, uint32_t dims, float theta_swa, uint32_t dims_swa) {
    const GgufFile g = GgufFile::open(dir + "/o.gguf");
    EXPECT_EQ(g.get_f32("laguna.rope.freq_base"), theta);
    EXPECT_EQ(g.get_u32("laguna.rope.dimension_count"), dims);
    EXPECT_EQ(g.get_f32("laguna.rope.freq_base_swa"), theta_swa);
    EXPECT_EQ(g.get_u32("laguna.rope.dimension_count_swa"), dims_swa);
  };
  {
    json c = base;
    c["rope_parameters"] = {
        {"full_attention", {{"rope_type", "default"}, {"rope_theta", 250000.0}, {"partial_rotary_factor", 0.25}}},
        {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 20000.0}, {"partial_rotary_factor", 0.5}}}};
    ASSERT_EQ(convert_with(c), "<no error>");
    expect_rope(250000.0f, 16, 20000.0f, 32);
  }
  {
    json c = base;  // absent: LagunaConfig's defaults for both types
    c.erase("rope_parameters");
    ASSERT_EQ(convert_with(c), "<no error>");
    expect_rope(500000.0f, 32, 10000.0f, 64);
  }
  {
    json c = base;  // flat: one dict for every layer type
    c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}, {"partial_rotary_factor", 0.5}};
    const std::string e = convert_with(c);
    EXPECT_NE(e.find("rope_parameters is not keyed by layer type"), std::string::npos) << e;
    EXPECT_NE(e.find("rope_parameters.full_attention and rope_parameters.sliding_attention"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dir + "/o.gguf"));
  }
  {
    json c = base;
    c["rope_parameters"]["rope_theta"] = 1000000.0;
    const std::string e = convert_with(c);
    EXPECT_NE(e.find("rope_parameters.rope_theta sits beside the per-layer-type entries"), std::string::npos) << e;
  }
  for (const char* key : {"rope_theta", "partial_rotary_factor"}) {
    json c = base;
    c[key] = 0.5;
    const std::string e = convert_with(c);
    EXPECT_NE(e.find(cat("'", key, "' at the top level is not read for laguna")), std::string::npos) << e;
  }
  {
    json c = base;
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    const std::string e = convert_with(c);
    EXPECT_NE(e.find("'rope_scaling' at the top level"), std::string::npos) << e;
  }
  {
    json c = base;  // sliding layers without their entry
    c["rope_parameters"].erase("sliding_attention");
    const std::string e = convert_with(c);
    EXPECT_NE(e.find("rope_parameters has no 'sliding_attention' entry, which layer 1"), std::string::npos) << e;
    // Without sliding layers the entry is not needed.
    c["layer_types"] = {"full_attention", "full_attention", "full_attention", "full_attention"};
    EXPECT_EQ(convert_with(c), "<no error>");
  }
}

TEST(ConvertQwen35Moe, IntervalDerivedFromLayerTypesAlone) {
  Qwen35Dims d;
  d.interval = 2;
  d.write_interval = false;
  const std::string dir = make_qwen35("q35_interval2", d);
  run_convert(dir, dir + "/o.gguf", "f32");
  const GgufFile g = GgufFile::open(dir + "/o.gguf");
  EXPECT_EQ(g.get_u32("qwen35moe.full_attention_interval"), 2u);
  auto model = Model::load(dir + "/o.gguf");
  for (int il = 0; il < d.layers; ++il)
    EXPECT_EQ(model->config().mixer(il), il % 2 == 1 ? LayerKind::FullAttention : LayerKind::DeltaNet) << il;

  // A layout no interval describes is refused, naming it.
  json c = qwen35_config(d);
  c["text_config"]["layer_types"] = {"linear_attention", "full_attention", "full_attention", "linear_attention"};
  write_json(dir + "/config.json", c);
  const std::string e = error_of([&] { run_convert(dir, dir + "/o2.gguf", "f32"); });
  EXPECT_NE(e.find("layer_types is not periodic"), std::string::npos) << e;
  // An interval that contradicts layer_types is refused too.
  c = qwen35_config(d);
  c["text_config"]["full_attention_interval"] = 4;
  write_json(dir + "/config.json", c);
  const std::string e2 = error_of([&] { run_convert(dir, dir + "/o3.gguf", "f32"); });
  EXPECT_NE(e2.find("disagrees with full_attention_interval 4"), std::string::npos) << e2;
}
