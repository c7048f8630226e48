// Splits a streamed assistant turn into reasoning (inside <think>...</think>) and answer text as it
// arrives, the way parse_assistant_output splits a finished one, so a stream can send
// reasoning_content and content deltas. Once a <tool_call> starts (and tools are enabled), the rest
// is held and parsed at the end into tool calls.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "strata/text/chat_template.h"

namespace strata::serve {

struct AssistantDelta {
  std::string reasoning;
  std::string content;
};

class AssistantStreamSplitter {
 public:
  explicit AssistantStreamSplitter(bool parse_tool_calls) : tools_(parse_tool_calls) {}

  // Adds generated text; returns the reasoning and content that may be sent now.
  AssistantDelta push(std::string_view text);

  struct Final {
    AssistantDelta delta;              // held-back text (and text around tool calls)
    std::vector<ToolCall> tool_calls;  // parsed from the held <tool_call> blocks
  };
  // End of generation: releases what was held and parses tool calls.
  Final finish();

 private:
  enum class State { Start, Think, Content, ToolCall };
  void step(AssistantDelta& out, bool at_end);

  bool tools_;
  State state_ = State::Start;
  std::string held_;
  bool strip_leading_newlines_ = false;
};

}  // namespace strata::serve
