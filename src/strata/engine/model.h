// A loaded model: the mapped GGUF file, its validated hyper-parameters and the weight views into it.
// Immutable after load, so any number of Sessions (sequences) can share one Model.
#pragma once

#include <memory>
#include <string>

#include "strata/gguf/gguf.h"
#include "strata/model/config.h"
#include "strata/model/weights.h"

namespace strata {

class Model {
 public:
  // Maps the file, reads the config (failing on an unsupported architecture) and binds every weight.
  static std::unique_ptr<Model> load(const std::string& gguf_path);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const GgufFile& file() const { return file_; }

 private:
  Model(GgufFile file);
  GgufFile file_;
  ModelConfig config_;
  ModelWeights weights_;
};

}  // namespace strata
