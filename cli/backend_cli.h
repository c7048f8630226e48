// Where a front end (run, chat, logits) runs the model: the CPU engine by default, the GPU with --gpu
// (CUDA builds). One flag set and one factory, so every command offers the same choice and a build
// without CUDA refuses --gpu with one clear line instead of silently using the CPU.
#pragma once

#include <memory>

#include <CLI/CLI.hpp>

#include "strata/engine/model.h"
#include "strata/engine/sequence.h"

namespace strata::cli {

struct BackendOptions {
  bool gpu = false;
};

// --gpu.
void add_backend_options(CLI::App& sub, BackendOptions& o);

// A sequence of max_ctx tokens on the chosen backend. Throws strata::Error for --gpu in a build
// without CUDA or on a machine without a GPU.
std::unique_ptr<Sequence> make_sequence(const Model& model, int max_ctx, const BackendOptions& o);

}  // namespace strata::cli
