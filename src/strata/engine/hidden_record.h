// The hidden states of a sequence's kept tokens, with the token each row ran, for drafters conditioned
// on the target's hidden states: the final ones (after the output norm: what the output matrix scores;
// the MTP drafter) or, when `layers` is set, the residual stream after each of those layers, side by
// side (a block drafter's taps). A sequence given a record appends every token it keeps; the drafter
// drops what it has consumed. Rows hold positions [begin, end()).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/base/error.h"

namespace strata {

struct HiddenRecord {
  int width = 0;           // n_embd, or layers.size() x n_embd (set by the sequence)
  std::vector<int> layers;  // empty: the final hidden state; else the layers whose outputs are taken
  int begin = 0;
  std::vector<int32_t> tokens;
  std::vector<float> rows;  // [tokens.size() x width]
  // Set when the sequence was reset or restored (its positions restart at begin); the drafter clears it.
  bool restarted = false;

  // The row width for a model of n_layer layers of n_embd (what a sequence sets `width` to); fails on a
  // layer the model lacks or one listed twice.
  int width_for(int n_layer, int n_embd) const {
    for (size_t j = 0; j < layers.size(); ++j) {
      if (layers[j] < 0 || layers[j] >= n_layer) fail("hidden record: layer ", layers[j], " is not one of the model's ", n_layer);
      for (size_t i = 0; i < j; ++i)
        if (layers[i] == layers[j]) fail("hidden record: layer ", layers[j], " is listed twice");
    }
    return n_embd * static_cast<int>(layers.empty() ? 1 : layers.size());
  }
  int size() const { return static_cast<int>(tokens.size()); }
  int end() const { return begin + size(); }
  const float* row(int pos) const { return rows.data() + static_cast<size_t>(pos - begin) * static_cast<size_t>(width); }
  void append(const int32_t* tok, const float* h, int n) {
    tokens.insert(tokens.end(), tok, tok + n);
    rows.insert(rows.end(), h, h + static_cast<size_t>(n) * static_cast<size_t>(width));
  }
  void restart(int at) {
    begin = at;
    tokens.clear();
    rows.clear();
    restarted = true;
  }
  void drop_before(int pos) {
    const int n = std::clamp(pos - begin, 0, size());
    tokens.erase(tokens.begin(), tokens.begin() + n);
    rows.erase(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(n) * static_cast<size_t>(width)));
    begin += n;
  }
};

}  // namespace strata
