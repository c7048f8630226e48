// The API's request bodies parsed into plain structs, with every field type- and range-checked.
// Anything wrong throws ApiError (400, naming the field), so a handler never sees a bad value.
// Parsing uses nlohmann::ordered_json so tool declarations keep the key order the client sent
// (the chat template serializes them in that order).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/grammar/grammar.h"
#include "strata/sample/sampler.h"
#include "strata/text/chat_template.h"

namespace strata::serve {

// What every generating request shares.
struct RequestParams {
  SamplerParams sampler;           // temperature, top_p, top_k, min_p, penalties, logit_bias, seed
  std::optional<int> max_tokens;   // nullopt: until the end of turn or the context is full
  std::vector<std::string> stop;   // up to 4 non-empty strings; generation ends before the match
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
  std::shared_ptr<const grammar::Grammar> grammar;  // structured output: the answer is decoded under it
  // "speculative" (a strata extension): false turns the server's speculative decoding (serve --spec)
  // off for this request; true asks for it (400 when the server has none); unset: the server's choice.
  std::optional<bool> speculative;
};

enum class ToolChoice { None, Auto, Required, Named };

struct ChatRequest {
  std::string model;  // "" when the client sent none
  std::vector<ChatMessage> messages;
  OrderedJson tools;  // null or an array of {"type": "function", "function": {...}}
  ToolChoice tool_choice = ToolChoice::Auto;
  std::string tool_choice_name;         // ToolChoice::Named
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking
  RequestParams gen;
};

struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt_text;    // prompt given as text
  std::vector<int32_t> prompt_tokens;        // or as token ids (when prompt_text is empty)
  RequestParams gen;
};

struct TokenizeRequest {
  std::optional<std::string> content;      // plain text
  std::vector<ChatMessage> messages;       // or a conversation, rendered with the chat template
  OrderedJson tools;
  bool add_special = true;                 // parse special tokens written in the text; add BOS when the model wants it
};

struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};

// n_vocab bounds logit_bias ids and prompt token ids.
ChatRequest parse_chat_request(const std::string& body, int64_t n_vocab);
CompletionRequest parse_completion_request(const std::string& body, int64_t n_vocab);
TokenizeRequest parse_tokenize_request(const std::string& body);
DetokenizeRequest parse_detokenize_request(const std::string& body, int64_t n_vocab);

// The body as a JSON object; 400 when it is not valid JSON (or not valid UTF-8) or not an object.
OrderedJson parse_json_object(const std::string& body);

}  // namespace strata::serve
