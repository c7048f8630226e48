// The JSON schema -> grammar compiler and the byte matcher (grammar/json_schema.h, grammar/grammar.h):
// hand-written valid and invalid texts per keyword, refusals of what is not supported, and the
// property that every text the matcher accepts is JSON valid against the schema (checked by an
// independent validator, tests/json_schema_check.h) on random schemas.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "json_schema_check.h"
#include "strata/grammar/grammar.h"
#include "strata/grammar/json_schema.h"

using namespace strata;
using namespace strata::grammar;
using Json = nlohmann::ordered_json;

namespace {

bool accepts(const Grammar& g, const std::string& text) {
  Matcher m(g);
  return m.advance(text) && m.accepting();
}

// Whether `text` is a prefix the matcher keeps alive (it may not be complete).
bool live(const Grammar& g, const std::string& text) {
  Matcher m(g);
  return m.advance(text);
}

Grammar compile(const char* schema) { return json_schema_grammar(Json::parse(schema)); }

void expect_cases(const char* schema, std::initializer_list<const char*> good, std::initializer_list<const char*> bad) {
  const Json s = Json::parse(schema);
  const Grammar g = json_schema_grammar(s);
  for (const char* t : good) {
    EXPECT_TRUE(accepts(g, t)) << schema << " should accept " << t;
    EXPECT_TRUE(schema_check::valid(Json::parse(t), s, s)) << "test case itself invalid: " << t;
  }
  for (const char* t : bad) EXPECT_FALSE(accepts(g, t)) << schema << " should refuse " << t;
}

std::string refusal(const char* schema) {
  try {
    json_schema_grammar(Json::parse(schema));
  } catch (const SchemaError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(JsonGrammar, Scalars) {
  expect_cases(R"({"type":"integer"})", {"0", "-7", "123456"}, {"01", "1.5", "-", "\"1\"", " 1", "1 ", "+1"});
  expect_cases(R"({"type":"number"})", {"0", "-0.5", "1e10", "2.25E-3", "7"}, {".5", "1.", "1e", "--1", "NaN"});
  expect_cases(R"({"type":"boolean"})", {"true", "false"}, {"True", "1", "null"});
  expect_cases(R"({"type":"null"})", {"null"}, {"nul", "\"null\"", "0"});
  expect_cases(R"({"type":"string"})", {R"("")", R"("a b")", R"("q\"\\\n\u00e9")", "\"caf\xc3\xa9\""},
               {R"("a)", "\"a\nb\"", R"("\x")", R"("\ud800")", "\"\xc3\"", "\"\xc0\x80\"", "a"});
}

TEST(JsonGrammar, NumbersAreBounded) {
  const Grammar g = compile(R"({"type":"integer"})");
  EXPECT_TRUE(live(g, std::string(19, '1')));
  EXPECT_FALSE(live(g, std::string(20, '1')));  // a model cannot write digits forever
}

TEST(JsonGrammar, StringLength) {
  expect_cases(R"({"type":"string","minLength":2,"maxLength":3})", {R"("ab")", R"("abc")", "\"\xc3\xa9\xc3\xa9\"", R"("\n\t")"},
               {R"("a")", R"("abcd")", "\"\xc3\xa9\""});
}

TEST(JsonGrammar, TypeArraysAndNullable) {
  expect_cases(R"({"type":["integer","null"]})", {"5", "null"}, {"\"5\"", "true"});
  expect_cases(R"({"type":"string","nullable":true})", {R"("x")", "null"}, {"1"});
}

TEST(JsonGrammar, EnumAndConst) {
  expect_cases(R"({"enum":["red","green",1,null,{"a":[1]}]})", {R"("red")", R"("green")", "1", "null", R"({"a":[1]})"},
               {R"("blue")", R"("re")", "2", "true"});
  expect_cases(R"({"type":"string","enum":["a",1]})", {R"("a")"}, {"1"});  // type filters the values
  expect_cases(R"({"const":"only"})", {R"("only")"}, {R"("other")", R"("onl")"});
}

TEST(JsonGrammar, Objects) {
  const char* s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["b"],"additionalProperties":false})";
  expect_cases(s, {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({ "a" : 1 , "b" : "x" })", "{\n  \"b\": \"\"\n}"},
               {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x","c":1})", R"({"b":1})", R"({"b":"x",})"});
  // Whitespace between tokens is bounded.
  auto spaced = [](size_t n) {
    std::string t(n + 1, ' ');
    t[0] = '{';
    return t.append(R"("b":"x"})");
  };
  EXPECT_FALSE(accepts(compile(s), spaced(13)));
  EXPECT_TRUE(accepts(compile(s), spaced(12)));
}

TEST(JsonGrammar, AdditionalProperties) {
  // Absent with properties: only the declared ones are generated (a subset of what the schema admits).
  expect_cases(R"({"type":"object","properties":{"a":{"type":"integer"}}})", {"{}", R"({"a":1})"}, {R"({"b":1})"});
  // A schema: extra keys take it, and never repeat a declared name.
  expect_cases(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
               {R"({"a":1,"b":true})", R"({"ab":false})", R"({"a":2,"":true})", "{\"\xc3\xa9\":true}"},
               {R"({"b":1})", R"({"a":1,"a":true})", R"({"a":true})"});
  expect_cases(R"({"type":"object"})", {"{}", R"({"x":[1,{"y":null}],"z":"s"})"}, {"[]", R"({"x"})"});
  expect_cases(R"({"type":"object","required":["k"],"additionalProperties":{"type":"string"}})", {R"({"k":"v"})"}, {"{}", R"({"k":1})"});
}

TEST(JsonGrammar, Arrays) {
  expect_cases(R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})", {"[1]", "[1,2,3]", "[ 1 , 2 ]"},
               {"[]", "[1,2,3,4]", "[1,]", R"(["a"])"});
  expect_cases(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],"items":false})",
               {"[]", R"(["a"])", R"(["a",1])"}, {R"(["a",1,2])", R"([1])"});
  expect_cases(R"({"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"null"},"minItems":2})",
               {R"(["a",null])", R"(["a",null,null])"}, {R"(["a"])", R"(["a",1])"});
  expect_cases(R"({"type":"array"})", {"[]", R"([1,"a",[true]])"}, {"[1 2]"});
}

TEST(JsonGrammar, AnyOfOneOfAllOf) {
  expect_cases(R"({"anyOf":[{"type":"integer"},{"type":"number"}]})", {"1", "1.5"}, {"\"1\""});
  expect_cases(R"({"oneOf":[{"type":"string"},{"type":"boolean"}]})", {R"("s")", "true"}, {"1"});
  expect_cases(R"({"allOf":[{"type":"boolean"}]})", {"false"}, {"0"});
}

TEST(JsonGrammar, Refs) {
  expect_cases(R"({"$defs":{"p":{"type":"integer"}},"type":"array","items":{"$ref":"#/$defs/p"}})", {"[1,2]"}, {R"(["a"])"});
  expect_cases(R"({"definitions":{"p":{"type":"string"}},"$ref":"#/definitions/p"})", {R"("x")"}, {"1"});
  // Recursive: a linked list.
  const char* list = R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"],"additionalProperties":false}},"$ref":"#/$defs/node"})";
  expect_cases(list, {R"({"v":1,"next":null})", R"({"v":1,"next":{"v":2,"next":{"v":3,"next":null}}})"},
               {R"({"v":1})", R"({"v":1,"next":{"v":2}})"});
  expect_cases(R"({"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#"}}},"additionalProperties":false})",
               {"{}", R"({"kids":[{},{"kids":[]}]})"}, {R"({"kids":[1]})"});
}

TEST(JsonGrammar, Refusals) {
  EXPECT_NE(refusal(R"({"type":"string","pattern":"^a"})").find("keyword 'pattern'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"integer","minimum":3})").find("keyword 'minimum'"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","properties":{"a":{"not":{}}}})").find("#/properties/a"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"array","uniqueItems":true})").find("uniqueItems"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"strnig"})").find("unknown type"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"#/$defs/missing"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(refusal(R"({"$ref":"http://x/s.json"})").find("only references inside"), std::string::npos);
  EXPECT_NE(refusal(R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})").find("itself"), std::string::npos);
  EXPECT_NE(refusal("false").find("admits no value"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","minLength":5,"maxLength":2})").find("minLength"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"object","required":["a"],"additionalProperties":false})").find("required property 'a'"), std::string::npos);
  EXPECT_NE(refusal(R"({"anyOf":[{"type":"string"}],"minLength":2})").find("together with"), std::string::npos);
  EXPECT_NE(refusal(R"({"allOf":[{"type":"string"},{"maxLength":2}]})").find("exactly one"), std::string::npos);
  EXPECT_NE(refusal(R"({"type":"string","enum":[1]})").find("no value"), std::string::npos);
  EXPECT_NE(refusal("[1]").find("must be an object"), std::string::npos);
}

TEST(JsonGrammar, JsonObject) {
  const Grammar g = json_object_grammar();
  for (const char* t : {"{}", R"({"a":1})", R"({"a":{"b":[1,2,{"c":null}]},"d":"e"})"}) EXPECT_TRUE(accepts(g, t)) << t;
  for (const char* t : {"[]", "1", R"("s")", R"({"a":})", R"({"a":1}})"}) EXPECT_FALSE(accepts(g, t)) << t;
}

// Walks the matcher byte by byte at random (closing structures once past a length budget) and
// returns the text when it reached an accepting state, "" when it gave up.
std::string random_text(const Grammar& g, std::mt19937_64& rng, size_t budget) {
  Matcher m(g);
  std::string out;
  MatchState next;
  while (out.size() < 6 * budget + 200) {
    if (m.accepting() && (out.size() > budget || rng() % 8 == 0)) return out;
    std::vector<uint8_t> ok;
    for (int b = 0; b < 256; ++b) {
      m.step(m.state(), static_cast<uint8_t>(b), next);
      if (!next.dead()) ok.push_back(static_cast<uint8_t>(b));
    }
    if (ok.empty()) return m.accepting() ? out : "";
    uint8_t b = ok[rng() % ok.size()];
    if (out.size() > budget) {
      auto has = [&](uint8_t c) { return std::find(ok.begin(), ok.end(), c) != ok.end(); };
      std::vector<uint8_t> calm;
      for (uint8_t c : ok)
        if (c != ' ' && c != '\n' && c != '\t' && c != '\r' && c != ',' && c != '[' && c != '{') calm.push_back(c);
      if (has('}')) b = '}';
      else if (has(']')) b = ']';
      else if (has('"')) b = '"';
      else if (!calm.empty()) b = calm[rng() % calm.size()];
    }
    EXPECT_TRUE(m.advance(b));
    out.push_back(static_cast<char>(b));
  }
  return "";
}

TEST(JsonGrammar, RandomSchemasAcceptOnlyValidJson) {
  int finished = 0, total = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    schema_check::SchemaGen gen(seed);
    const Json schema = gen.schema();
    Grammar g;
    ASSERT_NO_THROW(g = json_schema_grammar(schema)) << schema.dump();
    std::mt19937_64 rng(seed * 7919);
    for (int k = 0; k < 10; ++k) {
      ++total;
      const std::string text = random_text(g, rng, 40 + 20 * k);
      if (text.empty()) continue;
      ++finished;
      Json v;
      ASSERT_NO_THROW(v = Json::parse(text)) << "not JSON: " << text << "\nschema " << schema.dump();
      ASSERT_TRUE(schema_check::valid(v, schema, schema)) << "invalid: " << text << "\nschema " << schema.dump();
    }
  }
  EXPECT_GT(finished, total * 3 / 4);  // most walks reach whole values (nested free values may not)
}
