// Streaming detokenizer: turns generated ids into text as they arrive, holding back the bytes of a
// UTF-8 character until it is complete, so a client never receives half a character.
#pragma once

#include <cstdint>
#include <string>

#include "strata/text/tokenizer.h"

namespace strata {

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(tokenizer), skip_special_(skip_special) {}

  // Adds one token; returns the text that is now complete (possibly empty).
  std::string push(int32_t id);
  // Returns whatever is held back (an unfinished character at the end of generation), as raw bytes.
  std::string flush();
  // Bytes held back right now.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace strata
