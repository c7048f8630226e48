// Structured output for the chat API: the grammar a request's answer is decoded under, from
// response_format ({"type": "json_object"} or {"type": "json_schema", "json_schema": {...}}) or from
// a required / named tool call (the chat template's <tool_call> format with the tool's parameters
// schema as the arguments). Schemas the compiler refuses are a 400 naming the field.
#pragma once

#include <memory>
#include <string>

#include "strata/grammar/grammar.h"
#include "strata/text/chat_template.h"

namespace strata::serve {

// nullptr for {"type": "text"}; throws ApiError (400) for anything malformed or unsupported.
std::shared_ptr<const grammar::Grammar> response_format_grammar(const OrderedJson& response_format);

// The text after the forced start "<tool_call>\n" (named: after "<tool_call>\n{\"name\": \"NAME\",
// \"arguments\": "): one call of a declared tool (of `name` when not empty) whose arguments match
// its parameters schema, closed by "}\n</tool_call>". Throws ApiError (400) naming the tool's
// parameters when a schema is refused.
std::shared_ptr<const grammar::Grammar> tool_call_grammar(const OrderedJson& tools, const std::string& name);

}  // namespace strata::serve
