// A piece of a sequence's state that a prompt cache (engine/prompt_cache.h) keeps: the attention rows
// of positions [begin, end) and what a sequence needs to go on from position `end` that cannot be
// rebuilt from rows (DeltaNet conv window and recurrent state, sliding-window rings). Restoring the
// spans of a chain begin_0 = 0, end_i = begin_{i+1} leaves a sequence exactly as it was at the last
// span's end. Host memory, whatever backend saved it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

struct StateSpan {
  int begin = 0, end = 0;
  struct Layer {
    // Attention: rows of positions [first, end) in the cache's own types. A full-attention layer keeps
    // first = begin (earlier rows come from the spans before); a sliding layer keeps its whole ring
    // as of `end` (first = max(0, end - ring rows)), since a ring overwrites what came before.
    int first = 0;
    std::vector<uint8_t> k, v;
    // DeltaNet: conv window and recurrent state as of `end`.
    std::vector<float> conv, ssm;
  };
  std::vector<Layer> layers;
  size_t bytes() const {
    size_t b = sizeof(*this);
    for (const Layer& l : layers) b += sizeof(l) + l.k.size() + l.v.size() + (l.conv.size() + l.ssm.size()) * sizeof(float);
    return b;
  }
};

}  // namespace strata
