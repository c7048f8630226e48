#include "strata/text/detokenizer.h"

#include "strata/text/utf8.h"

namespace strata {

std::string StreamingDetokenizer::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return std::string();
  pending_ += tok_.token_text(id);
  const size_t ready = utf8::complete_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace strata
