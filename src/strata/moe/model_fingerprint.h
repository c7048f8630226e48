// A model's identity for routing profiles: a fingerprint that changes when the weights' layout or the
// routers change, cheap to compute (no full-file read).
#pragma once

#include <string>

namespace strata {

class GgufFile;
class Model;

// FNV-1a 64 over: general.architecture and every "<arch>.*" hyper-parameter (key, type and value),
// the tensor directory (name, type, shape, data offset, size of every tensor), and the first 4 KiB of
// every router tensor (blk.N.ffn_gate_inp.weight) and of token_embd.weight, so that two fine-tunes
// with an identical layout still differ. Reads a few pages of the mapping, never the whole file.
// Returned as 16 lower-case hex digits. Tokenizer/chat-template metadata and general.name are not
// included: renaming a file or editing its template keeps its routing profile valid.
std::string model_fingerprint(const GgufFile& file);

struct ModelIdentity {
  std::string fingerprint;
  std::string name;  // general.name, else the file name
  std::string arch;
  std::string file;  // path it was loaded from (for messages; not compared)
  int n_layer = 0, n_expert = 0, n_expert_used = 0;
};

ModelIdentity model_identity(const Model& model);

}  // namespace strata
