#include "strata/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <map>

#include "strata/base/error.h"

namespace strata {
namespace {

// Split regexes of the supported families, exactly as their tokenizer.json files write them.
// qwen2: Qwen2 / Qwen2.5 / Qwen3 (tokenizer.json "pre_tokenizer" Split pattern).
// qwen35: Qwen3.5; the same shape with combining marks (\p{M}) kept with letters and out of the
// punctuation runs (llama.cpp names it LLAMA_VOCAB_PRE_TYPE_QWEN35; pattern confirmed from several
// independent transcriptions of the Qwen3.5 tokenizer.json).
const std::map<std::string, std::string>& regexes() {
  static const std::map<std::string, std::string> m = {
      {"qwen2",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {"qwen35",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
  };
  return m;
}

}  // namespace

const std::string& pre_tokenizer_regex(const std::string& name) {
  auto it = regexes().find(name);
  if (it == regexes().end()) {
    std::string known;
    for (const auto& [k, v] : regexes()) known += (known.empty() ? "" : ", ") + k;
    fail("unsupported pre-tokenizer '", name, "' (tokenizer.ggml.pre); supported: ", known);
  }
  return it->second;
}

std::string pre_tokenizer_name_for_regex(const std::string& regex) {
  for (const auto& [name, re] : regexes()) {
    if (re == regex) return name;
  }
  return "";
}

struct PreTokenizer::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

// Per-thread match data and JIT stack (a pcre2_code is shareable between threads, these are not).
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* ctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(4, nullptr);
    ctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    if (!data || !ctx || !stack) fail("PCRE2: out of memory creating match data");
    pcre2_jit_stack_assign(ctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(ctx);
    pcre2_match_data_free(data);
  }
};

}  // namespace

PreTokenizer::PreTokenizer(const std::string& name) : name_(name), impl_(std::make_unique<Impl>()) {
  const std::string& pattern = pre_tokenizer_regex(name);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // UTF + UCP: \s, \p{..} and (?i) follow Unicode. MATCH_INVALID_UTF: invalid bytes in the subject
  // are never part of a match instead of making the match fail (split() keeps them as own words).
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("PCRE2 cannot compile the '", name, "' pre-tokenizer regex at offset ", err_offset, ": ",
         reinterpret_cast<const char*>(msg));
  }
  const int jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
  if (jit != 0) {
    // Matching still works (interpreted), only slower; a missing JIT is worth knowing about.
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(jit, msg, sizeof(msg));
    fail("PCRE2 JIT compilation of the '", name, "' pre-tokenizer regex failed: ", reinterpret_cast<const char*>(msg));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  thread_local ThreadMatchState state;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  while (pos < n) {
    const int rc = pcre2_match(impl_->code, subject, n, pos, 0, state.data, state.ctx);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      fail("pre-tokenizer '", name_, "': PCRE2 match failed at byte ", pos, ": ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t start = ov[0], end = ov[1];
    if (start > pos) out.push_back(text.substr(pos, start - pos));  // bytes no alternative matches
    if (end == start) {
      // Cannot happen with these patterns (no alternative matches empty); guard against looping.
      fail("pre-tokenizer '", name_, "': empty match at byte ", start);
    }
    out.push_back(text.substr(start, end - start));
    pos = end;
  }
  if (pos < n) out.push_back(text.substr(pos));
}

}  // namespace strata
