#include "strata/convert/synth_vocab.h"

#include <vector>

#include "strata/base/error.h"
#include "strata/text/byte_unicode.h"

namespace strata::convert {

Vocab make_synth_vocab(int32_t n_vocab, const std::string& pre) {
  // Pairs of byte-level strings to merge, in priority order ("Ġ" is the byte-level form of a space).
  static const std::vector<std::pair<std::string, std::string>> kMerges = {
      {"Ġ", "t"}, {"h", "e"}, {"i", "n"}, {"Ġt", "he"}, {"e", "r"}, {"a", "n"}, {"o", "n"}, {"Ġ", "a"},
  };
  static const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int32_t needed = 256 + static_cast<int32_t>(kMerges.size()) + 3;
  if (n_vocab < needed) fail("synth: vocabulary of ", n_vocab, " tokens is too small (need at least ", needed, ")");

  Vocab v;
  v.pre = pre;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
    v.token_types.push_back(kTokenNormal);
  }
  for (const auto& [l, r] : kMerges) {
    v.merges.push_back(l + " " + r);
    v.tokens.push_back(l + r);
    v.token_types.push_back(kTokenNormal);
  }
  pad_vocab(v, n_vocab - 3);
  const int32_t first_special = static_cast<int32_t>(v.tokens.size());
  for (const char* s : kSpecials) {
    v.tokens.push_back(s);
    v.token_types.push_back(kTokenControl);
  }
  v.eos_id = first_special + 2;  // <|im_end|>, as in Qwen's instruct checkpoints
  v.pad_id = first_special;      // <|endoftext|>
  v.add_bos = false;
  v.chat_template =
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
      "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  validate_vocab(v, "synth vocabulary");
  return v;
}

}  // namespace strata::convert
