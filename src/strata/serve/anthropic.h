// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) on top of the chat machinery:
// a request is translated into a ChatRequest (the same rendering, sampling and tool handling as
// /v1/chat/completions) and the answer is written back as Anthropic content blocks and events.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "strata/serve/api_error.h"
#include "strata/serve/chat_stream.h"
#include "strata/serve/requests.h"
#include "strata/serve/responses.h"

namespace strata::serve {

// Throws ApiError (400, naming the field) on anything Anthropic would refuse or strata cannot honour.
// count_only: a count_tokens body (no max_tokens, no sampling or stream fields).
ChatRequest parse_anthropic_request(const std::string& body, int64_t n_vocab, bool count_only);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use".
const char* anthropic_stop_reason(StopReason reason, bool has_tool_calls);

// A whole "message" response.
OrderedJson anthropic_message_json(const ResponseMeta& meta, const AssistantOutput& answer, const JobOutcome& outcome);

// The streamed form: message_start, ping, content_block_start/delta/stop per block, message_delta,
// message_stop. prompt_tokens goes into message_start; message_delta carries the final usage.
std::unique_ptr<ChatEventWriter> anthropic_stream_writer(const ResponseMeta& meta, int prompt_tokens);

// {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
std::string anthropic_error_body(const ApiError& e);

}  // namespace strata::serve
