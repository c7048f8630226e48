// What an architecture declares, in one file per architecture (arch_<name>.cpp): the hyper-parameters
// beyond the shared ones, the names of its per-layer tensors, and its layer program (which mixer and
// which feed-forward each layer runs). Every backend runs the program from ModelConfig::layers; none
// re-declares a model. Adding an architecture means one such file, its entry in arch.cpp, and kernels
// for operations that are really new.
#pragma once

#include <string>

#include "strata/model/config.h"

namespace strata {

class GgufFile;

struct ArchDescription {
  Arch arch;
  const char* name;  // general.architecture
  // Reads the architecture's own keys (prefix "<name>.") into c, after the shared ones (embedding,
  // heads, rotary, experts) are read, and sets the layer program c.layers. Errors name file and key.
  void (*read_config)(const GgufFile& f, const std::string& prefix, ModelConfig& c);
  // Tensor name (after "blk.N.") of the norm before the feed-forward.
  const char* ffn_norm_tensor;
};

// Every architecture strata runs, in the order `supported_architectures` lists them.
const std::vector<const ArchDescription*>& architectures();
const ArchDescription& arch_description(Arch arch);

// The descriptions, one per file.
extern const ArchDescription kQwen3Moe;
extern const ArchDescription kQwen35Moe;
extern const ArchDescription kLaguna;

// Helpers for read_config: a positive int key (naming file and key when out of range), the same with a
// default when absent, and a consistency check that fails naming the file.
int gguf_positive(const GgufFile& f, const std::string& key);
int gguf_positive_or(const GgufFile& f, const std::string& key, int def);
// A key that is one positive integer for every layer or an array with one per layer; def for every
// layer when absent.
std::vector<int> gguf_per_layer(const GgufFile& f, const std::string& key, int n_layer, int def);
void require_config(bool ok, const GgufFile& f, const std::string& what);

}  // namespace strata
