#include "strata/text/vocab.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/base/error.h"
#include "strata/gguf/gguf.h"
#include "strata/gguf/writer.h"
#include "strata/text/pretokenizer.h"

namespace strata {
namespace {

using nlohmann::json;

int32_t optional_id(const GgufFile& f, const char* key) {
  if (!f.has(key)) return -1;
  return static_cast<int32_t>(f.get_u32(key));
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
}

bool file_exists(const std::string& path) { return static_cast<bool>(std::ifstream(path)); }

// Finds the Split regex inside tokenizer.json's pre_tokenizer (alone or inside a Sequence).
std::string find_split_regex(const json& pre, const std::string& where) {
  if (pre.is_null()) fail(where, ": pre_tokenizer is null; only byte-level BPE with a Split regex is supported");
  const std::string type = pre.value("type", "");
  if (type == "Sequence") {
    std::string found;
    bool byte_level = false;
    for (const auto& p : pre.at("pretokenizers")) {
      const std::string t = p.value("type", "");
      if (t == "Split") {
        found = p.at("pattern").value("Regex", "");
        if (p.value("behavior", "") != "Isolated" || p.value("invert", false)) {
          fail(where, ": Split pre-tokenizer with behavior '", p.value("behavior", ""), "' / invert is not supported");
        }
      } else if (t == "ByteLevel") {
        if (p.value("use_regex", true) || p.value("add_prefix_space", false)) {
          fail(where, ": ByteLevel pre-tokenizer with use_regex/add_prefix_space is not supported");
        }
        byte_level = true;
      } else {
        fail(where, ": unsupported pre-tokenizer '", t, "' in the Sequence");
      }
    }
    if (found.empty() || !byte_level) fail(where, ": expected a Split regex followed by ByteLevel in pre_tokenizer");
    return found;
  }
  fail(where, ": unsupported pre_tokenizer type '", type, "' (expected a Sequence of Split + ByteLevel)");
}

// tokenizer_config.json names tokens either as a string or as {"content": ...}.
std::string token_name(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return "";
}

}  // namespace

void validate_vocab(const Vocab& v, const std::string& where) {
  const auto n = static_cast<int64_t>(v.tokens.size());
  if (n == 0) fail(where, ": the vocabulary is empty");
  if (v.token_types.size() != v.tokens.size()) {
    fail(where, ": ", v.tokens.size(), " tokens but ", v.token_types.size(), " token types");
  }
  for (size_t i = 0; i < v.token_types.size(); ++i) {
    if (v.token_types[i] < kTokenNormal || v.token_types[i] > kTokenByte) {
      fail(where, ": token ", i, " has unknown token type ", v.token_types[i]);
    }
  }
  auto check = [&](int32_t id, const char* what) {
    if (id < -1 || id >= n) fail(where, ": ", what, " ", id, " is outside the vocabulary of ", n, " tokens");
  };
  check(v.bos_id, "bos token id");
  check(v.eos_id, "eos token id");
  check(v.pad_id, "padding token id");
}

Vocab vocab_from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2") {
    fail(f.path(), ": tokenizer.ggml.model is '", model, "'; only 'gpt2' (byte-level BPE) is supported");
  }
  Vocab v;
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.has("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back(static_cast<int32_t>(t));
  } else {
    v.token_types.assign(v.tokens.size(), kTokenNormal);
  }
  v.merges = f.get_string_array("tokenizer.ggml.merges");
  v.bos_id = optional_id(f, "tokenizer.ggml.bos_token_id");
  v.eos_id = optional_id(f, "tokenizer.ggml.eos_token_id");
  v.pad_id = optional_id(f, "tokenizer.ggml.padding_token_id");
  v.pre = f.get_string_or("tokenizer.ggml.pre", "");
  if (v.pre.empty()) fail(f.path(), ": tokenizer.ggml.pre is missing; cannot choose the pre-tokenizer regex");
  v.chat_template = f.get_string_or("tokenizer.chat_template", "");
  v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  validate_vocab(v, f.path());
  return v;
}

Vocab vocab_from_hf_dir(const std::string& dir) {
  const std::string tok_path = dir + "/tokenizer.json";
  const json tj = read_json(tok_path);
  const json& model = tj.at("model");
  if (model.value("type", "") != "BPE") fail(tok_path, ": model type '", model.value("type", ""), "' is not BPE");
  if (model.value("byte_fallback", false)) fail(tok_path, ": BPE byte_fallback is not supported (not byte-level)");
  if (model.value("ignore_merges", false)) fail(tok_path, ": BPE ignore_merges = true is not supported");
  if (!tj.at("normalizer").is_null() && tj.at("normalizer").value("type", "") != "NFC") {
    fail(tok_path, ": normalizer '", tj.at("normalizer").dump(), "' is not supported (expected NFC)");
  }
  if (tj.at("decoder").value("type", "") != "ByteLevel") fail(tok_path, ": decoder is not ByteLevel");

  Vocab v;
  const std::string regex = find_split_regex(tj.at("pre_tokenizer"), tok_path);
  v.pre = pre_tokenizer_name_for_regex(regex);
  if (v.pre.empty()) fail(tok_path, ": unknown pre-tokenizer split regex: ", regex);

  // Dense ids: the BPE vocabulary plus the added tokens.
  const json& mv = model.at("vocab");
  int64_t max_id = -1;
  for (auto it = mv.begin(); it != mv.end(); ++it) max_id = std::max<int64_t>(max_id, it.value().get<int64_t>());
  for (const auto& a : tj.at("added_tokens")) max_id = std::max<int64_t>(max_id, a.at("id").get<int64_t>());
  v.tokens.assign(static_cast<size_t>(max_id + 1), std::string());
  v.token_types.assign(static_cast<size_t>(max_id + 1), 0);
  for (auto it = mv.begin(); it != mv.end(); ++it) {
    const auto id = it.value().get<int64_t>();
    if (id < 0) fail(tok_path, ": token '", it.key(), "' has negative id");
    v.tokens[static_cast<size_t>(id)] = it.key();
    v.token_types[static_cast<size_t>(id)] = kTokenNormal;
  }
  for (const auto& a : tj.at("added_tokens")) {
    const auto id = a.at("id").get<int64_t>();
    const std::string content = a.at("content").get<std::string>();
    if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false) ||
        a.value("normalized", false)) {
      fail(tok_path, ": added token '", content, "' uses lstrip/rstrip/single_word/normalized, which is not supported");
    }
    if (v.token_types[static_cast<size_t>(id)] == kTokenNormal && v.tokens[static_cast<size_t>(id)] != content) {
      fail(tok_path, ": added token '", content, "' reuses id ", id, " of vocabulary token '", v.tokens[static_cast<size_t>(id)], "'");
    }
    v.tokens[static_cast<size_t>(id)] = content;
    v.token_types[static_cast<size_t>(id)] = a.value("special", false) ? kTokenControl : kTokenUserDefined;
  }
  for (size_t i = 0; i < v.token_types.size(); ++i) {
    if (v.token_types[i] == 0) fail(tok_path, ": token ids are not dense: no token has id ", i);
  }

  for (const auto& m : model.at("merges")) {
    if (m.is_string()) {
      v.merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2) {
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      fail(tok_path, ": merge entry ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }

  auto id_of = [&](const std::string& name, const char* what) -> int32_t {
    if (name.empty()) return -1;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      if (v.tokens[i] == name && v.token_types[i] != kTokenNormal) return static_cast<int32_t>(i);
    }
    auto it = mv.find(name);
    if (it != mv.end()) return it.value().get<int32_t>();
    fail(dir, "/tokenizer_config.json: ", what, " '", name, "' is not a token");
  };
  const std::string cfg_path = dir + "/tokenizer_config.json";
  if (file_exists(cfg_path)) {
    const json cfg = read_json(cfg_path);
    if (cfg.contains("bos_token")) v.bos_id = id_of(token_name(cfg["bos_token"]), "bos_token");
    if (cfg.contains("eos_token")) v.eos_id = id_of(token_name(cfg["eos_token"]), "eos_token");
    if (cfg.contains("pad_token")) v.pad_id = id_of(token_name(cfg["pad_token"]), "pad_token");
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) v.add_bos = cfg["add_bos_token"].get<bool>();
    if (cfg.contains("chat_template")) {
      const json& ct = cfg["chat_template"];
      if (ct.is_string()) {
        v.chat_template = ct.get<std::string>();
      } else if (ct.is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const auto& e : ct) {
          if (e.value("name", "") == "default") v.chat_template = e.value("template", "");
        }
      }
    }
  }
  // transformers lets chat_template.jinja override the template in tokenizer_config.json.
  if (file_exists(dir + "/chat_template.jinja")) {
    v.chat_template = read_text_file(dir + "/chat_template.jinja");
  }
  validate_vocab(v, tok_path);
  return v;
}

void pad_vocab(Vocab& v, int32_t n_vocab) {
  if (n_vocab < static_cast<int32_t>(v.tokens.size())) {
    fail("cannot pad the vocabulary of ", v.tokens.size(), " tokens to ", n_vocab, " (it is larger)");
  }
  for (auto i = static_cast<int32_t>(v.tokens.size()); i < n_vocab; ++i) {
    v.tokens.push_back(cat("[PAD", i, "]"));
    v.token_types.push_back(kTokenUnused);
  }
}

void write_vocab_to_gguf(const Vocab& v, GgufWriter& w) {
  validate_vocab(v, "write_vocab_to_gguf");
  w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::str(v.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(v.tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(v.token_types));
  w.set("tokenizer.ggml.merges", GgufValue::string_array(v.merges));
  if (v.bos_id >= 0) w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(v.bos_id)));
  if (v.eos_id >= 0) w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(v.eos_id)));
  if (v.pad_id >= 0) w.set("tokenizer.ggml.padding_token_id", GgufValue::u32(static_cast<uint32_t>(v.pad_id)));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(v.add_bos));
  if (!v.chat_template.empty()) w.set("tokenizer.chat_template", GgufValue::str(v.chat_template));
}

}  // namespace strata
