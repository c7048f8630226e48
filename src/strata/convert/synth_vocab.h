// A minimal but complete byte-level BPE vocabulary for synthetic models: all 256 byte tokens, a few
// merges (with their merged tokens), [PAD<id>] filler up to the model's vocabulary size, and the
// ChatML special tokens at the end, as Qwen vocabularies have them. Enough for strata and llama.cpp
// to load and tokenize any text; the weights are random, so what the tokens mean does not matter.
#pragma once

#include <cstdint>
#include <string>

#include "strata/text/vocab.h"

namespace strata::convert {

// pre: tokenizer.ggml.pre ("qwen2" for qwen3moe, "qwen35" for qwen35moe). Throws when n_vocab is too
// small to hold the byte tokens, merges and specials.
Vocab make_synth_vocab(int32_t n_vocab, const std::string& pre);

}  // namespace strata::convert
