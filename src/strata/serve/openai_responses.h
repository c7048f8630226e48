// OpenAI's Responses API (/v1/responses) on top of the chat machinery: the input items are translated
// into a ChatRequest (the same rendering, sampling and tool handling as /v1/chat/completions) and the
// answer is written back as output items (reasoning, message, function_call) and response.* events.
// Nothing is stored: previous_response_id is refused, the client sends the whole conversation.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "strata/serve/chat_stream.h"
#include "strata/serve/requests.h"
#include "strata/serve/responses.h"

namespace strata::serve {

struct ResponsesRequest {
  ChatRequest chat;
  OrderedJson echo;  // the request settings a response object repeats (instructions, tools, tool_choice, ...)
};

// Throws ApiError (400, naming the field) on anything the API would refuse or strata cannot honour.
ResponsesRequest parse_responses_request(const std::string& body, int64_t n_vocab);

// The token count of a text: usage's output_tokens_details.reasoning_tokens is that of the reasoning
// text (0 when no counter is given).
using TokenCounter = std::function<int(const std::string&)>;

// A whole "response" object for a finished answer.
OrderedJson response_json(const ResponsesRequest& request, const ResponseMeta& meta, const AssistantOutput& answer,
                          const JobOutcome& outcome, const TokenCounter& count = {});

// The streamed form: response.created, response.in_progress, then per output item its added / delta /
// done events, then response.completed (or response.incomplete, response.failed).
std::unique_ptr<ChatEventWriter> responses_stream_writer(const ResponsesRequest& request, const ResponseMeta& meta,
                                                         TokenCounter count = {});

}  // namespace strata::serve
