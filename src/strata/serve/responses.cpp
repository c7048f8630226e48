#include "strata/serve/responses.h"

#include <random>

namespace strata::serve {

std::string make_response_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

const char* finish_reason(StopReason reason, bool has_tool_calls) {
  if (has_tool_calls) return "tool_calls";
  switch (reason) {
    case StopReason::MaxTokens:
    case StopReason::ContextFull: return "length";
    default: return "stop";
  }
}

OrderedJson usage_json(const JobOutcome& o) {
  OrderedJson u;
  u["prompt_tokens"] = o.prompt_tokens;
  u["completion_tokens"] = o.completion_tokens;
  u["total_tokens"] = o.prompt_tokens + o.completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", o.cached_tokens}};
  // OpenAI's names for predicted-output tokens the model confirmed or not: the same count for drafts.
  if (!o.drafter.empty())
    u["completion_tokens_details"] = {{"accepted_prediction_tokens", o.accepted_tokens},
                                      {"rejected_prediction_tokens", o.drafted_tokens - o.accepted_tokens}};
  add_speculative_usage(u, o);
  return u;
}

void add_speculative_usage(OrderedJson& usage, const JobOutcome& o) {
  if (o.drafter.empty()) return;
  usage["speculative"] = {
      {"drafter", o.drafter}, {"drafted_tokens", o.drafted_tokens}, {"accepted_tokens", o.accepted_tokens}};
}

OrderedJson tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  OrderedJson arr = OrderedJson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    OrderedJson c;
    if (with_index) c["index"] = i;
    // The parser numbers calls from call_0 in every answer; clients key results by id across turns.
    c["id"] = make_response_id("call_");
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    arr.push_back(std::move(c));
  }
  return arr;
}

namespace {
OrderedJson envelope(const ResponseMeta& meta, const char* object) {
  OrderedJson j;
  j["id"] = meta.id;
  j["object"] = object;
  j["created"] = meta.created;
  j["model"] = meta.model;
  return j;
}
OrderedJson nullable(const char* s) { return s ? OrderedJson(s) : OrderedJson(nullptr); }
}  // namespace

OrderedJson chat_completion_json(const ResponseMeta& meta, const AssistantOutput& answer, const char* finish,
                                 const JobOutcome& outcome) {
  OrderedJson j = envelope(meta, "chat.completion");
  OrderedJson msg;
  msg["role"] = "assistant";
  // OpenAI sends null content for a turn that is only tool calls.
  msg["content"] = (answer.content.empty() && !answer.tool_calls.empty()) ? OrderedJson(nullptr) : OrderedJson(answer.content);
  if (!answer.reasoning_content.empty()) msg["reasoning_content"] = answer.reasoning_content;
  if (!answer.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(answer.tool_calls, false);
  OrderedJson choice;
  choice["index"] = 0;
  choice["message"] = std::move(msg);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish;
  j["choices"] = OrderedJson::array({std::move(choice)});
  j["usage"] = usage_json(outcome);
  return j;
}

OrderedJson chat_chunk_json(const ResponseMeta& meta, OrderedJson delta, const char* finish) {
  OrderedJson j = envelope(meta, "chat.completion.chunk");
  OrderedJson choice;
  choice["index"] = 0;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullable(finish);
  j["choices"] = OrderedJson::array({std::move(choice)});
  return j;
}

OrderedJson completion_json(const ResponseMeta& meta, const std::string& text, const char* finish,
                            const JobOutcome& outcome) {
  OrderedJson j = envelope(meta, "text_completion");
  OrderedJson choice;
  choice["text"] = text;
  choice["index"] = 0;
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish;
  j["choices"] = OrderedJson::array({std::move(choice)});
  j["usage"] = usage_json(outcome);
  return j;
}

OrderedJson completion_chunk_json(const ResponseMeta& meta, const std::string& text, const char* finish) {
  OrderedJson j = envelope(meta, "text_completion");
  OrderedJson choice;
  choice["text"] = text;
  choice["index"] = 0;
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullable(finish);
  j["choices"] = OrderedJson::array({std::move(choice)});
  return j;
}

std::string dump_json(const OrderedJson& value) { return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace); }

std::string sse_data(const OrderedJson& value) { return "data: " + dump_json(value) + "\n\n"; }

}  // namespace strata::serve
