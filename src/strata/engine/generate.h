// The generation loop every front end shares (`strata run`, `strata chat`, the HTTP server):
// prompt ids in, text pieces out through a callback as they are decoded, until an end-of-generation
// token, the token limit, a stop string, the context limit, a cancellation request or the callback
// says stop. It knows nothing about terminals or sockets.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/engine/drafter.h"
#include "strata/engine/session.h"
#include "strata/sample/sampler.h"
#include "strata/text/tokenizer.h"

namespace strata {

enum class StopReason {
  EndOfGeneration,  // the model produced eos / an end-of-turn token (not emitted as text)
  MaxTokens,        // max_new_tokens generated
  StopString,       // a stop string appeared; the text up to it was emitted, the string itself not
  ContextFull,      // the session's context has no room for another token
  Cancelled,        // *cancel became true, or the piece callback returned false
};
const char* stop_reason_name(StopReason reason);  // "eos", "length", "stop", "context", "cancelled"

// Speculative decoding: after each sampled token the drafter proposes up to draft_max tokens, the
// target runs the token and the proposal in one pending forward, and verification keeps the drafts the
// target agrees with plus one token of its own (sample/speculative.h). Greedy output is token for token
// what plain decoding gives; sampled output has the same distribution. Off under a token constraint
// (GenerationStats::spec_off says so).
struct SpeculativeParams {
  Drafter* drafter = nullptr;  // nullptr: no speculation
  int draft_max = 16;          // >= 1; also clamped to the context and max_new_tokens left
  int draft_min = 0;           // >= 0, <= draft_max: a shorter proposal runs a plain step instead
  // The tokens the session held before this call's prompt (a chat's earlier turns), which the drafter
  // sees before the prompt; nullptr: the drafter's history starts with the prompt.
  const std::vector<int32_t>* preceding = nullptr;
};
// Throws strata::Error naming the field when a value is out of range.
void validate_speculative_params(const SpeculativeParams& spec);

struct GenerationParams {
  int max_new_tokens = 128;                // >= 0
  std::vector<std::string> stop_strings;   // empty strings are ignored
  const std::atomic<bool>* cancel = nullptr;  // checked before every forward pass
  bool skip_special = true;  // control tokens (<|im_start|>, ...) produce no text
  // Token healing: bytes the caller cut from the end of the prompt (see heal_prompt_end). The first
  // sampled token must start with them, and they are not emitted again (they were the user's text).
  std::string healed_prefix;
  SpeculativeParams spec;
};

// Token healing for raw completions. A prompt that ends inside what the tokenizer would merge with
// the next characters (e.g. "def f(n):" where training text always had "):\n" as one token) leaves
// the model at a token boundary it never saw. Cutting the last prompt token and constraining the
// first generated token to begin with its bytes lets the model pick the merged token itself.
// Removes the last token of `prompt` (when the prompt keeps at least one token and the last one is
// ordinary text) and returns its bytes; returns "" and leaves `prompt` as it was otherwise.
std::string heal_prompt_end(const Tokenizer& tokenizer, std::vector<int32_t>& prompt);

struct GenerationStats {
  int prompt_tokens = 0;      // tokens prefilled by this call
  int generated_tokens = 0;   // tokens sampled (the end-of-generation token included)
  double prefill_seconds = 0;   // the prompt's forward pass
  double decode_seconds = 0;    // every later forward pass, with sampling and detokenizing
  double ttft_seconds = 0;      // call start -> first token sampled (0 when none was)
  int decode_steps = 0;         // forward passes timed by decode_seconds (plain steps and verifications)
  int decode_tokens = 0;        // tokens those passes produced (decode_steps without speculation)
  // Speculative decoding (GenerationParams::spec).
  int spec_steps = 0;       // verification passes (each: the last token and its drafts)
  int drafted_tokens = 0;   // drafted tokens verified
  int accepted_tokens = 0;  // of those, the ones the target agreed with
  std::string drafter;      // the drafter's name while speculation ran ("" without)
  std::string spec_off;     // why a drafter was given but not used ("" when it was, or none was given)

  double prompt_tokens_per_second() const;  // 0 when nothing was timed
  double decode_tokens_per_second() const;
  double acceptance_rate() const;  // accepted / drafted, 0 when nothing was drafted
  // Tokens per verification pass: accepted drafts + the target's own one; 0 without verifications.
  double tokens_per_spec_step() const;
};

struct GenerationResult {
  GenerationStats stats;
  StopReason stop_reason = StopReason::MaxTokens;
  std::string stop_string;      // StopString: which one (APIs that report it, e.g. Anthropic's stop_sequence)
  std::vector<int32_t> tokens;  // every sampled id, in order
  std::string text;             // everything emitted through the callback, concatenated
  // How many of `tokens` the session has processed: all but the last (a sampled token is only fed
  // when the next one is needed). The session holds prompt + tokens[0 .. tokens_in_session).
  int tokens_in_session = 0;
};

// Receives each newly decoded piece of text (complete UTF-8 characters, never a part of a stop
// string). Return false to stop generating (reported as Cancelled).
using PieceCallback = std::function<bool(std::string_view piece)>;

// Feeds `prompt` after what the session already holds (so a chat can send only a new turn), then
// samples up to params.max_new_tokens tokens. The sampler's penalties see prompt + generated ids.
// Throws strata::Error when the prompt is empty, or when it does not fit in the context:
// "prompt of N tokens exceeds the context of M" (N counts what the session already holds).
GenerationResult generate(Sequence& session, const Tokenizer& tokenizer, Sampler& sampler,
                          const std::vector<int32_t>& prompt, const GenerationParams& params,
                          const PieceCallback& on_piece);

// Holds back text that might be the start of a stop string, so the caller never emits part of one.
// Exposed for tests and for front ends that filter text themselves.
class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stop_strings);
  // Adds text; returns what is now safe to emit. Sets stopped() when a stop string is complete,
  // in which case the returned text ends just before it and later pushes return "".
  std::string push(std::string_view text);
  // The text still held back (at the end of generation it is safe to emit).
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string that ended it


 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace strata
