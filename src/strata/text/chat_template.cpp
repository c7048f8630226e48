// Rendering follows Qwen3's chat template (tokenizer_config.json "chat_template") statement by
// statement; the comments quote the template condition each branch implements.
#include "strata/text/chat_template.h"

#include "strata/base/error.h"
#include "strata/text/tokenizer.h"

namespace strata {
namespace {

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view strip_newlines(std::string_view s) { return rstrip_newlines(lstrip_newlines(s)); }

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// Python's s.split(sep)[0] and s.split(sep)[-1].
std::string_view before_first(std::string_view s, std::string_view sep) {
  const size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}

void dump_python(const OrderedJson& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      out += OrderedJson(it.key()).dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
      out += ": ";
      dump_python(it.value(), out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      dump_python(v[i], out);
    }
    out += ']';
  } else {
    out += v.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
  }
}

}  // namespace

std::string python_json_dumps(const OrderedJson& value) {
  std::string out;
  dump_python(value, out);
  return out;
}

ChatFamily detect_chat_family(std::string_view chat_template, bool force_chatml) {
  if (chat_template.find("<|im_start|>") != std::string_view::npos) return ChatFamily::ChatML;
  if (force_chatml) return ChatFamily::ChatML;
  if (chat_template.empty()) {
    fail("the model has no chat template (tokenizer.chat_template); force ChatML to use the Qwen format");
  }
  fail("unsupported chat template (it does not use ChatML's <|im_start|>); force ChatML to use the Qwen format "
       "anyway. Template begins: ",
       std::string(chat_template.substr(0, 120)));
}

namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";

// The rendered text with the places where the template itself writes a control token.
struct MarkedText {
  RenderedChat chat;
  void operator+=(std::string_view s) { chat.text += s; }
  void special(std::string_view token) {
    chat.special_spans.push_back({chat.text.size(), token.size()});
    chat.text += token;
  }
};

}  // namespace

RenderedChat render_chat_marked(const std::vector<ChatMessage>& messages, const OrderedJson& tools,
                                const ChatOptions& options) {
  if (messages.empty()) fail("chat: no messages to render");
  for (const auto& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      fail("chat: unsupported message role '", m.role, "' (expected system, user, assistant or tool)");
    }
  }
  if (!tools.is_null() && !tools.is_array()) fail("chat: tools must be a JSON array");
  const bool has_tools = tools.is_array() && !tools.empty();
  const size_t n = messages.size();
  MarkedText out;

  // {%- if tools %} ... system block with the tool list
  if (has_tools) {
    out.special(kImStart);
    out += "system\n";
    if (messages[0].role == "system") out += messages[0].content + "\n\n";
    out += "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const auto& tool : tools) {
      out += "\n";
      out += python_json_dumps(tool);
    }
    out += "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call>";
    out.special(kImEnd);
    out += "\n";
  } else if (messages[0].role == "system") {
    out.special(kImStart);
    out += "system\n" + messages[0].content;
    out.special(kImEnd);
    out += "\n";
  }

  // ns.last_query_index: the last user message that is not just a wrapped tool response.
  size_t last_query_index = n - 1;
  for (size_t k = n; k-- > 0;) {
    const ChatMessage& m = messages[k];
    if (m.role == "user" &&
        !(starts_with(m.content, "<tool_response>") && ends_with(m.content, "</tool_response>"))) {
      last_query_index = k;
      break;
    }
  }

  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    const bool first = i == 0, last = i + 1 == n;
    if (m.role == "user" || (m.role == "system" && !first)) {
      out.special(kImStart);
      out += m.role + "\n" + m.content;
      out.special(kImEnd);
      out += "\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      std::string_view reasoning;
      if (m.reasoning_content) {
        reasoning = *m.reasoning_content;
      } else if (content.find("</think>") != std::string_view::npos) {
        const std::string_view full = m.content;
        content = lstrip_newlines(after_last(full, "</think>"));
        reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(full, "</think>")), "<think>"));
      }
      // {%- if loop.index0 > ns.last_query_index %}{%- if loop.last or reasoning_content %}
      if (i > last_query_index && (last || !reasoning.empty())) {
        out.special(kImStart);
        out += "assistant\n<think>\n";
        out += strip_newlines(reasoning);
        out += "\n</think>\n\n";
        out += lstrip_newlines(content);
      } else {
        out.special(kImStart);
        out += "assistant\n";
        out += content;
      }
      for (size_t t = 0; t < m.tool_calls.size(); ++t) {
        if ((t == 0 && !content.empty()) || t > 0) out += "\n";
        out += "<tool_call>\n{\"name\": \"" + m.tool_calls[t].name + "\", \"arguments\": ";
        out += m.tool_calls[t].arguments;  // a string: the template writes it as it is
        out += "}\n</tool_call>";
      }
      out.special(kImEnd);
      out += "\n";
    } else if (m.role == "tool") {
      if (first || messages[i - 1].role != "tool") {
        out.special(kImStart);
        out += "user";
      }
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (last || messages[i + 1].role != "tool") {
        out.special(kImEnd);
        out += "\n";
      }
    }
    // The first system message was written before the loop.
  }

  if (options.add_generation_prompt) {
    out.special(kImStart);
    out += "assistant\n";
    if (options.enable_thinking.has_value() && !*options.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return std::move(out.chat);
}


std::string render_chat(const std::vector<ChatMessage>& messages, const OrderedJson& tools, const ChatOptions& options) {
  return render_chat_marked(messages, tools, options).text;
}

std::vector<int32_t> encode_rendered_chat(const Tokenizer& tokenizer, const RenderedChat& chat, bool parse_special) {
  if (parse_special) return tokenizer.encode(chat.text, true);
  std::vector<int32_t> ids;
  size_t at = 0;
  auto plain = [&](size_t end) {
    const std::vector<int32_t> part = tokenizer.encode(std::string_view(chat.text).substr(at, end - at), false);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  for (const auto& [start, length] : chat.special_spans) {
    plain(start);
    const std::vector<int32_t> token = tokenizer.encode(std::string_view(chat.text).substr(start, length), true);
    ids.insert(ids.end(), token.begin(), token.end());
    at = start + length;
  }
  plain(chat.text.size());
  return ids;
}

AssistantOutput parse_assistant_output(std::string_view text) {
  AssistantOutput result;
  std::string_view rest = text;

  const size_t close = rest.find("</think>");
  if (close != std::string_view::npos) {
    std::string_view head = rest.substr(0, close);
    const size_t open = head.find("<think>");
    if (open != std::string_view::npos) head = head.substr(open + 7);
    result.reasoning_content = std::string(strip_newlines(head));
    rest = lstrip_newlines(rest.substr(close + 8));
  } else {
    const size_t open = rest.find("<think>");
    if (open != std::string_view::npos && rest.substr(0, open).find_first_not_of(" \t\r\n") == std::string_view::npos) {
      // Generation stopped while still thinking.
      result.reasoning_content = std::string(strip_newlines(rest.substr(open + 7)));
      return result;
    }
  }

  std::string content;
  size_t pos = 0;
  while (true) {
    const size_t start = rest.find("<tool_call>", pos);
    if (start == std::string_view::npos) break;
    const size_t body = start + 11;
    const size_t end = rest.find("</tool_call>", body);
    if (end == std::string_view::npos) break;  // unterminated: stays in the content
    const std::string_view inner = rest.substr(body, end - body);
    OrderedJson call = OrderedJson::parse(inner.begin(), inner.end(), nullptr, /*allow_exceptions=*/false);
    const bool ok = call.is_object() && call.contains("name") && call["name"].is_string() &&
                    (!call.contains("arguments") || call["arguments"].is_object() || call["arguments"].is_string());
    if (!ok) {  // malformed: keep the block as text
      content += rest.substr(pos, end + 12 - pos);
      pos = end + 12;
      continue;
    }
    content += rest.substr(pos, start - pos);
    ToolCall tc;
    tc.id = "call_" + std::to_string(result.tool_calls.size());
    tc.name = call["name"].get<std::string>();
    if (!call.contains("arguments")) {
      tc.arguments = "{}";
    } else if (call["arguments"].is_string()) {
      tc.arguments = call["arguments"].get<std::string>();
    } else {
      tc.arguments = call["arguments"].dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
    }
    result.tool_calls.push_back(std::move(tc));
    pos = end + 12;
  }
  content += rest.substr(pos);
  if (!result.tool_calls.empty()) {
    const size_t b = content.find_first_not_of(" \t\r\n");
    const size_t e = content.find_last_not_of(" \t\r\n");
    content = b == std::string::npos ? std::string() : content.substr(b, e - b + 1);
  }
  result.content = std::move(content);
  return result;
}

}  // namespace strata
