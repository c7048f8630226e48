// JSON schema -> grammar (grammar/grammar.h): the grammar matches JSON text whose value is valid
// against the schema. It is a subset of the valid texts, chosen so a model cannot run forever on
// filler: at most `max_ws` whitespace bytes between two tokens, no whitespace before or after the
// value, numbers of bounded length (19 integer digits, 17 fraction digits, 2 exponent digits),
// property names the schema does not declare of at most 64 characters, and the declared properties
// in the schema's order.
//
// Supported: type (one or an array), enum, const, properties, required, additionalProperties
// (absent = no other properties when `properties` is given, any when not), items, prefixItems,
// minItems, maxItems, minLength, maxLength, anyOf / oneOf (read as anyOf; a value valid against two
// branches passes oneOf's "exactly one" only if the schema makes them exclusive), allOf of one schema,
// $ref to the schema itself or anything under it ($defs, definitions; recursion allowed), nullable
// (OpenAPI). Annotations (title, description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly) and `format` are ignored: format is an annotation in JSON Schema 2020-12.
// Everything else (pattern, minimum, maximum, multipleOf, uniqueItems, not, if/then/else, ...) is
// refused with a SchemaError naming the keyword and where it is, never ignored.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "strata/base/error.h"
#include "strata/grammar/grammar.h"

namespace strata::grammar {

using Json = nlohmann::ordered_json;

// A schema the compiler cannot or will not turn into a grammar; the message names the keyword and
// its place ("#/properties/age").
class SchemaError : public Error {
 public:
  using Error::Error;
};

struct JsonGrammarOptions {
  uint32_t max_ws = 12;  // whitespace bytes allowed between two JSON tokens
};

// Adds the rules for JSON values to a grammar; several schemas (each with its own $refs) may go into
// one grammar, with literal text around them.
class JsonRules {
 public:
  explicit JsonRules(Grammar& g, JsonGrammarOptions options = {});
  ~JsonRules();
  JsonRules(const JsonRules&) = delete;
  JsonRules& operator=(const JsonRules&) = delete;

  // A rule matching the values valid against `schema` ($refs resolve inside it). Throws SchemaError.
  uint32_t schema(const Json& schema);
  uint32_t any_value();
  uint32_t any_object();
  // Whitespace between two tokens (an element to append), or nothing when max_ws is 0.
  void append_ws(Sequence& seq);

 private:
  struct Impl;
  Impl* impl_;
};

// A finished grammar for one JSON value valid against `schema` (throws SchemaError).
Grammar json_schema_grammar(const Json& schema, JsonGrammarOptions options = {});
// A finished grammar for any JSON object (response_format json_object).
Grammar json_object_grammar(JsonGrammarOptions options = {});

}  // namespace strata::grammar
