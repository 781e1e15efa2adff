// The positioned JSON reader: comments, positions, duplicate keys, malformed input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/json.h"

namespace {

using ds::JsonNode;
using ds::parse_json;

std::string error_of(const std::string& text) {
  try {
    parse_json(text, "ds.json");
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string error_of_members(const std::string& text, const ds::MemberSink& take) {
  try {
    (void)ds::parse_json_members(text, "v.json", take);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "in: " << (hay)

TEST(JsonReader, CommentsAndTrailingCommas) {
  const JsonNode n = parse_json(
      "// leading comment\n{\n  \"a\": 1, // line\n  /* block\n  comment */ \"b\": [1, 2,],\n  # hash\n  \"c\": {\"d\": true,},\n}\n",
      "x");
  ASSERT_EQ(n.kind, JsonNode::Kind::Object);
  ASSERT_EQ(n.members.size(), 3u);
  EXPECT_EQ(n.members[0].key, "a");
  EXPECT_EQ(n.members[1].value.items.size(), 2u);
  EXPECT_TRUE(n.members[2].value.find("d")->value.boolean);
}

TEST(JsonReader, PositionsOfKeysAndValues) {
  const JsonNode n = parse_json("{\n  \"fp16\": {\n    \"loss_scale\": 128\n  }\n}", "x");
  const auto* fp16 = n.find("fp16");
  ASSERT_NE(fp16, nullptr);
  EXPECT_EQ(fp16->key_pos.line, 2);
  EXPECT_EQ(fp16->key_pos.column, 3);
  const auto* ls = fp16->value.find("loss_scale");
  EXPECT_EQ(ls->key_pos.line, 3);
  EXPECT_EQ(ls->key_pos.column, 5);
  EXPECT_EQ(ls->value.pos.column, 19);
  // Columns count characters, not bytes: "é" is one column.
  const JsonNode u = parse_json("{\"é\": 1, \"k\": 2}", "x");
  EXPECT_EQ(u.find("k")->key_pos.column, 10);
}

TEST(JsonReader, Numbers) {
  const JsonNode n = parse_json("[0, -5, 18446744073709551615, 1.5e-3, 5e8, -0.0, 1e-400]", "x");
  using K = JsonNode::Kind;
  EXPECT_EQ(n.items[0].kind, K::Int);
  EXPECT_EQ(n.items[1].int_value, -5);
  EXPECT_EQ(n.items[2].kind, K::UInt);
  EXPECT_EQ(n.items[2].uint_value, 18446744073709551615ull);
  EXPECT_DOUBLE_EQ(n.items[3].double_value, 1.5e-3);
  EXPECT_EQ(n.items[4].kind, K::Double);
  EXPECT_EQ(n.items[6].double_value, 0.0);
  EXPECT_HAS(error_of("{\"a\": 01}"), "ds.json:1:7: numbers must not have leading zeros");
  EXPECT_HAS(error_of("{\"a\": 1.}"), "ds.json:1:9: expected a digit after '.'");
  EXPECT_HAS(error_of("{\"a\": -}"), "expected a digit after '-'");
  EXPECT_HAS(error_of("{\"a\": 1e999}"), "out of range");
  EXPECT_HAS(error_of("{\"a\": NaN}"), "NaN and Infinity are not valid JSON");
}

TEST(JsonReader, StringsAndEscapes) {
  const JsonNode n = parse_json(R"(["a\"b\\\/\n\t", "\u00e9\ud83d\ude00"])", "x");
  EXPECT_EQ(n.items[0].str, "a\"b\\/\n\t");
  EXPECT_EQ(n.items[1].str, "\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_HAS(error_of("{\"a\": \"x\\q\"}"), "invalid escape \\q");
  EXPECT_HAS(error_of("{\"a\": \"\\ud800\"}"), "unpaired UTF-16 surrogate");
  EXPECT_HAS(error_of("{\"a\": \"\xC3\x28\"}"), "ds.json:1:8: invalid UTF-8 in string");
  EXPECT_HAS(error_of("{\"a\": \"abc\n\"}"), "ds.json:1:7: unterminated string");
  EXPECT_HAS(error_of("{\"a\": 'x'}"), "double quotes");
}

TEST(JsonReader, SyntaxErrorsNameLineAndColumn) {
  EXPECT_HAS(error_of("{\n  \"a\": 1\n  \"b\": 2\n}"), "ds.json:3:3: expected ',' or '}' after the value of \"a\"");
  EXPECT_HAS(error_of("{\n  \"a\" 1\n}"), "ds.json:2:7: expected ':' after key \"a\"");
  EXPECT_HAS(error_of("{\n  a: 1\n}"), "ds.json:2:3: keys must be in double quotes");
  EXPECT_HAS(error_of("{\"a\": [1, 2}"), "ds.json:1:12: expected ',' or ']'");
  EXPECT_HAS(error_of("{\"a\": 1"), "ds.json:1:1: unterminated object");
  EXPECT_HAS(error_of("{} x"), "ds.json:1:4: unexpected 'x' after the end of the JSON document");
  EXPECT_HAS(error_of("  "), "ds.json:1:3: empty document");
  EXPECT_HAS(error_of("{/* open"), "ds.json:1:2: unterminated /* comment");
  EXPECT_HAS(error_of("{\"a\": tru}"), "ds.json:1:7: unexpected word 'tru'");
  EXPECT_HAS(error_of("{\"a\": True}"), "JSON spells these true, false, null");
}

TEST(JsonReader, DuplicateKeysAreErrorsWithPath) {
  EXPECT_HAS(error_of("{\n  \"fp16\": {\n    \"enabled\": true,\n    \"enabled\": false\n  }\n}"),
             "ds.json:4:5: duplicate key \"fp16.enabled\" (first at line 3, column 5)");
  EXPECT_HAS(error_of("{\"a\": [{\"x\": 1, \"x\": 2}]}"), "duplicate key \"a[0].x\"");
}

// parse_json_members: the root's members go to the sink in order and are not kept; the sink
// says when a key repeats and the reader names both places, as parse_json does.
TEST(JsonReader, MembersAreHandedOverNotKept) {
  std::vector<std::string> seen;
  auto take = [&](JsonNode::Member& m) {
    for (const auto& k : seen)
      if (k == m.key) return false;
    seen.push_back(m.key);
    return true;
  };
  const JsonNode root = ds::parse_json_members("{\"a\": 1,\n \"b\": {\"c\": [2]}, # x\n}", "v.json", take);
  EXPECT_EQ(root.kind, JsonNode::Kind::Object);
  EXPECT_TRUE(root.members.empty());
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));

  seen.clear();
  EXPECT_HAS(error_of_members("{\"a\": 1,\n  \"b\": 2,\n  \"a\": 3}", take),
             "v.json:3:3: duplicate key \"a\" (first at line 1, column 2)");
  seen.clear();
  EXPECT_HAS(error_of_members("{\"a\": {\"x\": 1, \"x\": 2}}", take), "v.json:1:16: duplicate key \"a.x\"");
  seen.clear();
  EXPECT_HAS(error_of_members("{\"a\": 1 \"b\": 2}", take), "v.json:1:9: expected ',' or '}' after the value of \"a\"");
  const JsonNode array = ds::parse_json_members("[1, 2]", "v.json", take);
  EXPECT_EQ(array.kind, JsonNode::Kind::Array);
  EXPECT_EQ(array.items.size(), 2u);
}

TEST(JsonReader, DepthLimitAndBom) {
  std::string deep(1000, '[');
  EXPECT_HAS(error_of(deep), "nesting deeper than");
  const JsonNode n = parse_json("\xEF\xBB\xBF{\"a\": 1}", "x");
  EXPECT_EQ(n.find("a")->key_pos.column, 2);
}

TEST(JsonReader, RoundTripThroughNlohmann) {
  const JsonNode n = parse_json(R"({"a": [1, -2, 2.5, "s", null, true], "b": {"c": 18446744073709551615}})", "x");
  const nlohmann::json j = ds::to_nlohmann(n);
  EXPECT_EQ(j["a"][2], 2.5);
  EXPECT_EQ(j["b"]["c"].get<std::uint64_t>(), 18446744073709551615ull);
  EXPECT_EQ(ds::to_nlohmann(ds::from_nlohmann(j)), j);
}

// JsonSyntax::Strict (safetensors headers and indexes) takes JSON alone; errors say what they
// are about (JsonError) so a caller can word them, and numbers convert as nlohmann parses them.
TEST(JsonReader, StrictSyntaxAndErrorKinds) {
  auto strict_error = [](const std::string& text) -> ds::JsonError {
    try {
      parse_json(text, "h.json", 4, ds::JsonSyntax::Strict);
    } catch (const ds::JsonError& e) {
      return e;
    }
    return ds::JsonError(ds::JsonError::Kind::Syntax, "h.json", {}, "<no error>", "", false);
  };
  EXPECT_EQ(parse_json("{\"a\": [1, 2]}", "h.json", 4, ds::JsonSyntax::Strict).members.size(), 1u);
  EXPECT_EQ(std::string(strict_error("{} # x").what()), "h.json:1:4: a comment (not JSON)");
  EXPECT_EQ(strict_error("{\"a\": 1, /* x */ \"b\": 2}").reason, "a comment (not JSON)");
  EXPECT_EQ(strict_error("[1, 2,]").reason, "a trailing comma (not JSON)");
  EXPECT_EQ(strict_error("{\"a\": 1,}").pos.column, 9);
  EXPECT_EQ(strict_error("{\"a\": {\"b\": [[[1]]]}}").kind, ds::JsonError::Kind::TooDeep);
  const ds::JsonError root = strict_error("{\"a\": 1,\n \"a\": 2}");
  EXPECT_EQ(root.kind, ds::JsonError::Kind::DuplicateKey);
  EXPECT_EQ(root.key, "a");
  EXPECT_TRUE(root.in_root);
  EXPECT_EQ(root.pos.line, 2);
  EXPECT_FALSE(strict_error("{\"a\": {\"b\": 1, \"b\": 2}}").in_root);
  // Relaxed (the default) still takes both.
  EXPECT_EQ(parse_json("{\"a\": [1, 2,], # x\n}", "c.json").members.size(), 1u);
  EXPECT_TRUE(ds::to_nlohmann(parse_json("[5, -5]", "n.json"))[0].is_number_unsigned());
  EXPECT_TRUE(ds::to_nlohmann(parse_json("[5, -5]", "n.json"))[1].is_number_integer());
}

}  // namespace
