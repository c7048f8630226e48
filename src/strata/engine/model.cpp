#include "strata/engine/model.h"

#include <utility>

namespace strata {

Model::Model(GgufFile file) : file_(std::move(file)) {
  config_ = load_model_config(file_);
  weights_ = bind_model_weights(file_, config_);
}

std::unique_ptr<Model> Model::load(const std::string& gguf_path) {
  return std::unique_ptr<Model>(new Model(GgufFile::open(gguf_path)));
}

}  // namespace strata
