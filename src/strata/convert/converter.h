// `strata convert`: a Hugging Face checkpoint directory (config.json + *.safetensors [+ tokenizer])
// of qwen3_moe / qwen3_5_moe(_text) to a GGUF file that follows the naming GGUF files in the wild use.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "strata/quant/types.h"

namespace strata::convert {

// Reported once per tensor, after its bytes are produced.
struct TensorProgress {
  size_t index = 0;  // 1-based
  size_t total = 0;
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type = GgmlType::F32;
  size_t nbytes = 0;
  double seconds = 0;
};

struct ConvertOptions {
  std::string hf_dir;
  std::string out_path;
  std::string type = "bf16";  // see supported_type_names() in type_policy.h
  int threads = 0;            // 0: OpenMP default
  std::function<void(const TensorProgress&)> on_tensor;  // optional
  std::function<void(const std::string&)> on_note;       // optional: fallbacks, ignored tensors, vocab, a
                                                         // declared MTP head without weights
};

struct ConvertSummary {
  std::string arch;  // GGUF architecture name
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  std::map<std::string, size_t> tensors_by_type;  // type name -> count
  std::vector<std::string> ignored;               // HF tensors deliberately not converted
  std::vector<std::string> notes;                 // type fallbacks etc.
  bool has_tokenizer = false;
};

ConvertSummary convert_hf_to_gguf(const ConvertOptions& options);

}  // namespace strata::convert
