#include "strata/serve/structured_output.h"

#include "strata/grammar/json_schema.h"
#include "strata/serve/api_error.h"

namespace strata::serve {

namespace {

std::shared_ptr<const grammar::Grammar> finished(grammar::Grammar g, const std::string& param) {
  try {
    g.finish();
  } catch (const Error& e) {
    bad_request(param, e.what());
  }
  return std::make_shared<const grammar::Grammar>(std::move(g));
}

}  // namespace

std::shared_ptr<const grammar::Grammar> response_format_grammar(const OrderedJson& rf) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad_request("response_format", "'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  for (const auto& [key, v] : rf.items()) {
    if (key != "type" && !(key == "json_schema" && type == "json_schema"))
      bad_request("response_format", "unknown field 'response_format.", key, "' for type '", type, "'");
  }
  if (type == "text") return nullptr;
  if (type == "json_object") return std::make_shared<const grammar::Grammar>(grammar::json_object_grammar());
  if (type != "json_schema")
    bad_request("response_format.type", "'response_format.type' must be 'text', 'json_object' or 'json_schema', got '", type, "'");
  if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
    bad_request("response_format.json_schema", "'response_format.json_schema' must be an object with 'name' and 'schema'");
  const OrderedJson& js = rf["json_schema"];
  for (const auto& [key, v] : js.items()) {
    if (key == "name" || key == "description") {
      if (!v.is_string()) bad_request("response_format.json_schema." + key, "'response_format.json_schema.", key, "' must be a string");
    } else if (key == "strict") {
      if (!v.is_boolean() && !v.is_null()) bad_request("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
    } else if (key != "schema") {
      bad_request("response_format.json_schema", "unknown field 'response_format.json_schema.", key, "'");
    }
  }
  if (!js.contains("name")) bad_request("response_format.json_schema.name", "'response_format.json_schema.name' is required");
  // No schema: any JSON value, as OpenAI reads it. The output is always decoded under the grammar,
  // whatever 'strict' says.
  const OrderedJson schema = js.contains("schema") ? js["schema"] : OrderedJson::object();
  try {
    return std::make_shared<const grammar::Grammar>(grammar::json_schema_grammar(schema));
  } catch (const grammar::SchemaError& e) {
    bad_request("response_format.json_schema.schema", e.what());
  }
}

std::shared_ptr<const grammar::Grammar> tool_call_grammar(const OrderedJson& tools, const std::string& name) {
  grammar::Grammar g;
  grammar::JsonRules json(g);
  const uint32_t root = g.add_rule("tool-call");
  for (size_t i = 0; i < tools.size(); ++i) {
    const OrderedJson& fn = tools[i]["function"];
    const std::string fn_name = fn["name"].get<std::string>();
    if (!name.empty() && fn_name != name) continue;
    const std::string param = cat("tools[", i, "].function.parameters");
    uint32_t args;
    try {
      args = fn.contains("parameters") && !fn["parameters"].is_null() ? json.schema(fn["parameters"]) : json.any_object();
    } catch (const grammar::SchemaError& e) {
      bad_request(param, e.what());
    }
    // The template's format, as the forced start writes it (python json.dumps separators).
    grammar::Sequence s;
    if (name.empty()) g.append_literal(s, "{\"name\": " + python_json_dumps(OrderedJson(fn_name)) + ", \"arguments\": ");
    s.push_back(grammar::Grammar::call(args));
    g.append_literal(s, "}\n</tool_call>");
    g.add_alt(root, std::move(s));
  }
  g.set_root(root);
  return finished(std::move(g), "tools");
}

}  // namespace strata::serve
