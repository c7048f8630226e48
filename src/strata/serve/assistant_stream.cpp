#include "strata/serve/assistant_stream.h"

#include <algorithm>

namespace strata::serve {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";

// Length of the longest tail of `s` that is a proper prefix of `tag` (it may still become the tag).
size_t partial_tag_tail(std::string_view s, std::string_view tag) {
  for (size_t len = std::min(tag.size() - 1, s.size()); len > 0; --len) {
    if (s.substr(s.size() - len) == tag.substr(0, len)) return len;
  }
  return 0;
}

size_t trailing_newlines(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && s[s.size() - 1 - n] == '\n') ++n;
  return n;
}

}  // namespace

AssistantDelta AssistantStreamSplitter::push(std::string_view text) {
  held_ += text;
  AssistantDelta out;
  step(out, false);
  return out;
}

void AssistantStreamSplitter::step(AssistantDelta& out, bool at_end) {
  for (;;) {
    if (state_ == State::Start) {
      const size_t first = held_.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) {
        if (!at_end) return;
        state_ = State::Content;
        continue;
      }
      const std::string_view rest = std::string_view(held_).substr(first);
      if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
        held_.erase(0, first + kThinkOpen.size());
        state_ = State::Think;
        strip_leading_newlines_ = true;
        continue;
      }
      if (!at_end && rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return;
      state_ = State::Content;
      continue;
    }
    if (strip_leading_newlines_) {
      const size_t first = held_.find_first_not_of('\n');
      held_.erase(0, first == std::string::npos ? held_.size() : first);
      if (held_.empty()) return;
      strip_leading_newlines_ = false;
    }
    if (state_ == State::Think) {
      const size_t close = held_.find(kThinkClose);
      if (close != std::string::npos) {
        std::string_view before = std::string_view(held_).substr(0, close);
        before.remove_suffix(trailing_newlines(before));
        out.reasoning += before;
        held_.erase(0, close + kThinkClose.size());
        state_ = State::Content;
        strip_leading_newlines_ = true;
        continue;
      }
      if (at_end) {  // stopped while thinking
        std::string_view all = held_;
        all.remove_suffix(trailing_newlines(all));
        out.reasoning += all;
        held_.clear();
        return;
      }
      // Hold a possible start of "</think>" and trailing newlines (stripped before "</think>").
      size_t keep = partial_tag_tail(held_, kThinkClose);
      keep += trailing_newlines(std::string_view(held_).substr(0, held_.size() - keep));
      out.reasoning += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    if (state_ == State::Content) {
      if (tools_) {
        const size_t open = held_.find(kToolOpen);
        if (open != std::string::npos) {
          out.content += held_.substr(0, open);
          held_.erase(0, open);
          state_ = State::ToolCall;
          continue;
        }
      }
      const size_t keep = (tools_ && !at_end) ? partial_tag_tail(held_, kToolOpen) : 0;
      out.content += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return;
    }
    return;  // ToolCall: everything waits for finish()
  }
}

AssistantStreamSplitter::Final AssistantStreamSplitter::finish() {
  Final f;
  step(f.delta, true);
  if (state_ == State::ToolCall) {
    // The held text starts at "<tool_call>": parse it as an answer of its own.
    AssistantOutput parsed = parse_assistant_output(held_);
    f.tool_calls = std::move(parsed.tool_calls);
    f.delta.content += f.tool_calls.empty() ? held_ : parsed.content;
    held_.clear();
  }
  return f;
}

}  // namespace strata::serve
