// OpenAI-shaped response bodies and server-sent-event chunks for chat completions and completions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/engine/generate.h"
#include "strata/serve/job.h"
#include "strata/text/chat_template.h"

namespace strata::serve {

struct ResponseMeta {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

// A fresh id with the given prefix and 24 random hex digits.
std::string make_response_id(const std::string& prefix);

// "stop", "length" or "tool_calls".
const char* finish_reason(StopReason reason, bool has_tool_calls);

OrderedJson usage_json(const JobOutcome& outcome);
// Adds what speculative decoding did to a usage object of any API (nothing when the request did not
// speculate): "speculative": {drafter, drafted_tokens, accepted_tokens}, a strata extension.
void add_speculative_usage(OrderedJson& usage, const JobOutcome& outcome);
// Each call gets a fresh "call_..." id, unique across answers.
OrderedJson tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);

OrderedJson chat_completion_json(const ResponseMeta& meta, const AssistantOutput& answer, const char* finish,
                                 const JobOutcome& outcome);
// One chat.completion.chunk; finish == nullptr while the answer goes on.
OrderedJson chat_chunk_json(const ResponseMeta& meta, OrderedJson delta, const char* finish);
OrderedJson completion_json(const ResponseMeta& meta, const std::string& text, const char* finish,
                            const JobOutcome& outcome);
OrderedJson completion_chunk_json(const ResponseMeta& meta, const std::string& text, const char* finish);

// JSON text; bytes that are not valid UTF-8 (a model can emit them) become U+FFFD instead of throwing.
std::string dump_json(const OrderedJson& value);
// "data: <json>\n\n"
std::string sse_data(const OrderedJson& value);

}  // namespace strata::serve
