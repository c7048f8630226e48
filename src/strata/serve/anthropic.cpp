#include "strata/serve/anthropic.h"

#include <limits>
#include <optional>

#include "strata/serve/request_fields.h"

namespace strata::serve {
namespace {

using namespace fields;

// Anthropic takes any number of stop sequences; a bound keeps the stop filter's work per token small.
constexpr size_t kMaxStopSequences = 16;

const std::string& block_type(const OrderedJson& block, const std::string& name) {
  get_object(block, name);
  return get_string(required(block, "type", name), name + ".type");
}

// cache_control is accepted on every block and has no effect.
void check_block_keys(const OrderedJson& block, const std::string& name, std::vector<std::string> allowed) {
  allowed.push_back("type");
  allowed.push_back("cache_control");
  check_keys(block, name, allowed);
}

// A text block; system prompts and tool_result content are strings or arrays of them.
const std::vector<TextPart> kTextBlock = {{"text", "text", {"citations", "cache_control"}}};

// A user turn: tool_result blocks become tool messages (in order), the text one user message after them.
void add_user_turn(const OrderedJson& content, const std::string& name, std::vector<ChatMessage>& out) {
  if (content.is_string()) {
    out.push_back({"user", content.get<std::string>(), {}, "", "", std::nullopt});
    return;
  }
  get_array(content, name);
  std::string text;
  bool has_text = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bname = cat(name, "[", i, "]");
    const std::string& type = block_type(content[i], bname);
    const OrderedJson& b = content[i];
    if (type == "text") {
      text += part_text(b, bname, kTextBlock);
      has_text = true;
    } else if (type == "tool_result") {
      check_block_keys(b, bname, {"tool_use_id", "content", "is_error"});
      ChatMessage m{"tool", "", {}, "", "", std::nullopt};
      m.tool_call_id = get_string(required(b, "tool_use_id", bname), bname + ".tool_use_id");
      if (b.contains("content") && !b["content"].is_null()) m.content = text_of(b["content"], bname + ".content", kTextBlock);
      // The chat template has no error flag for a tool's answer: say it in the text the model reads.
      if (b.contains("is_error") && get_bool(b["is_error"], bname + ".is_error")) m.content = "Error: " + m.content;
      out.push_back(std::move(m));
    } else {
      bad_request(bname, "content block type '", type, "' is not supported in a user message (text, tool_result)");
    }
  }
  if (has_text || content.empty()) out.push_back({"user", text, {}, "", "", std::nullopt});
}

void add_assistant_turn(const OrderedJson& content, const std::string& name, std::vector<ChatMessage>& out) {
  ChatMessage m{"assistant", "", {}, "", "", std::nullopt};
  if (content.is_string()) {
    m.content = content.get<std::string>();
    out.push_back(std::move(m));
    return;
  }
  get_array(content, name);
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bname = cat(name, "[", i, "]");
    const std::string& type = block_type(content[i], bname);
    const OrderedJson& b = content[i];
    if (type == "text") {
      m.content += part_text(b, bname, kTextBlock);
    } else if (type == "thinking") {
      check_block_keys(b, bname, {"thinking", "signature"});
      m.reasoning_content = m.reasoning_content.value_or("") + get_string(required(b, "thinking", bname), bname + ".thinking");
    } else if (type == "redacted_thinking") {
      // Opaque to this server: nothing to render.
    } else if (type == "tool_use") {
      check_block_keys(b, bname, {"id", "name", "input"});
      ToolCall tc;
      tc.id = get_string(required(b, "id", bname), bname + ".id");
      tc.name = get_string(required(b, "name", bname), bname + ".name");
      tc.arguments = dump_json(get_object(required(b, "input", bname), bname + ".input"));
      m.tool_calls.push_back(std::move(tc));
    } else {
      bad_request(bname, "content block type '", type, "' is not supported in an assistant message (text, thinking, tool_use)");
    }
  }
  out.push_back(std::move(m));
}

std::vector<ChatMessage> parse_anthropic_messages(const OrderedJson& v) {
  std::vector<ChatMessage> out;
  for_each_message(v, [&](size_t i, size_t count, const std::string& name, const OrderedJson& m) {
    for (const auto& [key, value] : m.items())
      if (key != "role" && key != "content") bad_request(name, "unknown field '", name, ".", key, "'");
    const std::string& role = get_string(required(m, "role", name), name + ".role");
    const OrderedJson& content = required(m, "content", name);
    if (role == "user") {
      add_user_turn(content, name + ".content", out);
    } else if (role == "assistant") {
      if (i + 1 == count)
        bad_request(name, "a final assistant message (prefilling the answer) is not supported; end with a user message");
      add_assistant_turn(content, name + ".content", out);
    } else {
      bad_request(name, "'", name, ".role' must be 'user' or 'assistant' (the system prompt goes in 'system'), got '", role, "'");
    }
  });
  return out;
}

// Anthropic's tools ({name, description, input_schema}) in the chat-completions shape the template renders.
OrderedJson translate_tools(const OrderedJson& v) {
  return function_tools(v, "input_schema", true, [](const OrderedJson& t, const std::string& name) {
    if (t.contains("type") && !t["type"].is_null() && get_string(t["type"], name + ".type") != "custom")
      bad_request(name, "tool type '", t["type"].get<std::string>(), "' is not supported (server tools run at Anthropic; only client tools)");
    check_block_keys(t, name, {"name", "description", "input_schema"});
  });
}

void apply_tool_choice(const OrderedJson& v, ChatRequest& r) {
  const OrderedJson& c = get_object(v, "tool_choice");
  const std::string& type = get_string(required(c, "type", "tool_choice"), "tool_choice.type");
  for (const auto& [key, value] : c.items()) {
    if (key == "disable_parallel_tool_use") get_bool(value, "tool_choice.disable_parallel_tool_use");
    else if (key != "type" && !(key == "name" && type == "tool")) bad_request("tool_choice", "unknown field 'tool_choice.", key, "'");
  }
  if (type == "auto") {
    r.tool_choice = ToolChoice::Auto;
  } else if (type == "none") {
    r.tool_choice = ToolChoice::None;
  } else if (type == "any") {
    r.tool_choice = ToolChoice::Required;
  } else if (type == "tool") {
    r.tool_choice = ToolChoice::Named;
    r.tool_choice_name = get_string(required(c, "name", "tool_choice"), "tool_choice.name");
  } else {
    bad_request("tool_choice", "'tool_choice.type' must be auto, any, tool or none, got '", type, "'");
  }
}

void apply_thinking(const OrderedJson& v, ChatRequest& r) {
  const OrderedJson& t = get_object(v, "thinking");
  const std::string& type = get_string(required(t, "type", "thinking"), "thinking.type");
  const bool on = type == "enabled" || type == "adaptive";
  for (const auto& [key, value] : t.items()) {
    // The budget is accepted but not enforced: the model thinks until it closes its think block.
    if (key == "budget_tokens" && type == "enabled") {
      get_integer(value, "thinking.budget_tokens", 1, std::numeric_limits<int32_t>::max());
    } else if (key == "display" && on) {
      // Only a presentation choice: the thinking text is returned either way.
      if (!value.is_null() && get_string(value, "thinking.display") != "summarized" && value != "omitted")
        bad_request("thinking", "'thinking.display' must be 'summarized' or 'omitted', got ", value);
    } else if (key != "type") {
      bad_request("thinking", "unknown field 'thinking.", key, "'");
    }
  }
  if (on) {
    r.enable_thinking = true;
  } else if (type == "disabled") {
    r.enable_thinking = false;
  } else {
    bad_request("thinking", "'thinking.type' must be 'enabled', 'adaptive' or 'disabled', got '", type, "'");
  }
}

std::vector<std::string> parse_stop_sequences(const OrderedJson& v) {
  get_array(v, "stop_sequences");
  if (v.size() > kMaxStopSequences) bad_request("stop_sequences", "'stop_sequences' may hold at most ", kMaxStopSequences, " strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    out.push_back(get_string(v[i], cat("stop_sequences[", i, "]")));
    if (out.back().empty()) bad_request("stop_sequences", "'stop_sequences' strings must not be empty");
  }
  return out;
}

OrderedJson tool_input(const ToolCall& call) {
  // parse_assistant_output wrote the arguments as compact JSON; an unparsable text stays visible as a string.
  try {
    return OrderedJson::parse(call.arguments);
  } catch (const nlohmann::json::exception&) {
    return OrderedJson(call.arguments);
  }
}

OrderedJson usage(const JobOutcome& o) {
  // Anthropic counts cache reads apart from input_tokens: their sum is the whole prompt.
  OrderedJson u;
  u["input_tokens"] = o.prompt_tokens - o.cached_tokens;
  u["cache_creation_input_tokens"] = 0;
  u["cache_read_input_tokens"] = o.cached_tokens;
  u["output_tokens"] = o.completion_tokens;
  add_speculative_usage(u, o);
  return u;
}

OrderedJson stop_sequence(const JobOutcome& o, bool has_tool_calls) {
  if (has_tool_calls || o.stop_reason != StopReason::StopString) return nullptr;
  return o.stop_string;
}

class AnthropicWriter final : public ChatEventWriter {
 public:
  AnthropicWriter(ResponseMeta meta, int prompt_tokens) : meta_(std::move(meta)), prompt_tokens_(prompt_tokens) {}

  void begin(std::string& out) override {
    OrderedJson msg;
    msg["id"] = meta_.id;
    msg["type"] = "message";
    msg["role"] = "assistant";
    msg["model"] = meta_.model;
    msg["content"] = OrderedJson::array();
    msg["stop_reason"] = nullptr;
    msg["stop_sequence"] = nullptr;
    // The cache split is known only at the end: message_delta carries it; the sum is right either way.
    msg["usage"] = {{"input_tokens", prompt_tokens_},
                    {"cache_creation_input_tokens", 0},
                    {"cache_read_input_tokens", 0},
                    {"output_tokens", 0}};
    out += sse_event("message_start", {{"type", "message_start"}, {"message", std::move(msg)}});
    out += sse_event("ping", {{"type", "ping"}});
  }

  void delta(const AssistantDelta& d, std::string& out) override {
    if (!d.reasoning.empty()) {
      open(Block::Thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}, out);
      send_delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}}, out);
    }
    if (!d.content.empty()) {
      open(Block::Text, {{"type", "text"}, {"text", ""}}, out);
      send_delta({{"type", "text_delta"}, {"text", d.content}}, out);
    }
  }

  void end(const AssistantStreamSplitter::Final& last, const JobOutcome& o, std::string& out) override {
    delta(last.delta, out);
    for (const ToolCall& call : last.tool_calls) {
      open(Block::ToolUse,
           {{"type", "tool_use"}, {"id", make_response_id("toolu_")}, {"name", call.name}, {"input", OrderedJson::object()}},
           out);
      // The same input the whole message carries, as JSON: clients parse partial_json as they go.
      send_delta({{"type", "input_json_delta"}, {"partial_json", dump_json(tool_input(call))}}, out);
    }
    close(out);
    const bool tools = !last.tool_calls.empty();
    OrderedJson md;
    md["type"] = "message_delta";
    md["delta"] = {{"stop_reason", anthropic_stop_reason(o.stop_reason, tools)}, {"stop_sequence", stop_sequence(o, tools)}};
    md["usage"] = usage(o);
    out += sse_event("message_delta", md);
    out += sse_event("message_stop", {{"type", "message_stop"}});
  }

  void fail(int status, const std::string& message, std::string& out) override {
    close(out);
    const std::string body = anthropic_error_body(ApiError(status, "", "", "", message));
    out += "event: error\ndata: " + body + "\n\n";
  }

 private:
  enum class Block { None, Thinking, Text, ToolUse };

  // Starts a block of `kind` unless one is open already (a tool_use block is never continued).
  void open(Block kind, OrderedJson start, std::string& out) {
    if (open_ == kind && kind != Block::ToolUse) return;
    close(out);
    out += sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(start)}});
    open_ = kind;
  }
  void close(std::string& out) {
    if (open_ == Block::None) return;
    out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
    open_ = Block::None;
    ++index_;
  }
  void send_delta(OrderedJson delta, std::string& out) {
    out += sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
  }

  ResponseMeta meta_;
  int prompt_tokens_;
  Block open_ = Block::None;
  int index_ = 0;
};

}  // namespace

ChatRequest parse_anthropic_request(const std::string& body, int64_t n_vocab, bool count_only) {
  const OrderedJson j = parse_json_object(body);
  ChatRequest r;
  std::optional<int> max_tokens, unused;
  bool have_messages = false;
  OrderedJson tool_choice;
  std::string system;
  bool have_system = false;
  for (const auto& [key, value] : j.items()) {
    if (value.is_null() && key != "messages" && key != "max_tokens") continue;
    if (key == "model") {
      r.model = get_string(value, key);
    } else if (key == "messages") {
      r.messages = parse_anthropic_messages(value);
      have_messages = true;
    } else if (key == "system") {
      system = text_of(value, key, kTextBlock);
      have_system = true;
    } else if (key == "tools") {
      r.tools = translate_tools(value);
    } else if (key == "tool_choice") {
      tool_choice = value;
    } else if (key == "thinking") {
      apply_thinking(value, r);
    } else if (count_only) {
      unknown_field(key);
    } else if (key == "stop_sequences") {
      r.gen.stop = parse_stop_sequences(value);
    } else if (key == "temperature") {
      r.gen.sampler.temperature = static_cast<float>(get_number(value, key, 0.0, 1.0));
    } else if (key == "metadata") {
      get_object(value, key);
    } else if (key == "max_tokens" || key == "top_p" || key == "top_k" || key == "stream" || key == "service_tier" ||
               key == "speculative") {
      parse_generation_field(key, value, r.gen, n_vocab, max_tokens, unused);
    } else {
      unknown_field(key);
    }
  }
  if (!have_messages) bad_request("messages", "'messages' is required");
  if (!count_only && !max_tokens) bad_request("max_tokens", "'max_tokens' is required");
  if (have_system) r.messages.insert(r.messages.begin(), {"system", system, {}, "", "", std::nullopt});
  if (!tool_choice.is_null()) apply_tool_choice(tool_choice, r);
  check_tool_choice(r);
  finish_generation_params(r.gen, max_tokens, unused);
  return r;
}

const char* anthropic_stop_reason(StopReason reason, bool has_tool_calls) {
  if (has_tool_calls) return "tool_use";
  switch (reason) {
    case StopReason::StopString: return "stop_sequence";
    case StopReason::MaxTokens:
    case StopReason::ContextFull: return "max_tokens";
    case StopReason::EndOfGeneration:
    case StopReason::Cancelled: break;
  }
  return "end_turn";
}

OrderedJson anthropic_message_json(const ResponseMeta& meta, const AssistantOutput& answer, const JobOutcome& outcome) {
  OrderedJson content = OrderedJson::array();
  if (!answer.reasoning_content.empty())
    content.push_back({{"type", "thinking"}, {"thinking", answer.reasoning_content}, {"signature", ""}});
  if (!answer.content.empty()) content.push_back({{"type", "text"}, {"text", answer.content}});
  for (const ToolCall& call : answer.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", make_response_id("toolu_")}, {"name", call.name}, {"input", tool_input(call)}});
  const bool tools = !answer.tool_calls.empty();
  OrderedJson j;
  j["id"] = meta.id;
  j["type"] = "message";
  j["role"] = "assistant";
  j["model"] = meta.model;
  j["content"] = std::move(content);
  j["stop_reason"] = anthropic_stop_reason(outcome.stop_reason, tools);
  j["stop_sequence"] = stop_sequence(outcome, tools);
  j["usage"] = usage(outcome);
  return j;
}

std::unique_ptr<ChatEventWriter> anthropic_stream_writer(const ResponseMeta& meta, int prompt_tokens) {
  return std::make_unique<AnthropicWriter>(meta, prompt_tokens);
}

std::string anthropic_error_body(const ApiError& e) {
  const char* type = "invalid_request_error";
  switch (e.status) {
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
    default: if (e.status >= 500) type = "api_error"; break;
  }
  OrderedJson j;
  j["type"] = "error";
  j["error"] = {{"type", type}, {"message", e.what()}};
  return dump_json(j);
}

}  // namespace strata::serve
