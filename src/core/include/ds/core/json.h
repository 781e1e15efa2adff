// The one strict JSON reader: a tree that remembers where every value and key came from.
//
// nlohmann::json can neither report the line:column of a key nor detect duplicate keys, and
// both are what a user needs to fix a file. The config, tokenizer.json and safetensors
// headers and indexes are read with it. Keys and strings must be double-quoted and a key may
// appear once per object. JsonSyntax::Relaxed (the config, tokenizer files) also takes what
// DeepSpeed's hjson reader takes and users actually write: // and /* */ and # comments and
// trailing commas; JsonSyntax::Strict takes JSON alone. Errors (JsonError, a ds::Error) read
// "source:line:column: message"; columns count characters (UTF-8 code points) from 1.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"

namespace ds {

struct SourcePos {
  int line = 0;    // 1-based; 0: unknown (a document that did not come from text)
  int column = 0;  // 1-based, in characters
  bool known() const { return line > 0; }
};

struct JsonNode {
  enum class Kind { Null, Bool, Int, UInt, Double, String, Array, Object };
  struct Member;

  Kind kind = Kind::Null;
  SourcePos pos;               // where the value starts
  bool boolean = false;        // Bool
  std::int64_t int_value = 0;  // Int (fits int64)
  std::uint64_t uint_value = 0;  // UInt (above INT64_MAX)
  double double_value = 0.0;   // Double
  std::string str;             // String (valid UTF-8)
  std::vector<JsonNode> items;   // Array
  std::vector<Member> members;   // Object, in document order, keys unique

  bool is_number() const { return kind == Kind::Int || kind == Kind::UInt || kind == Kind::Double; }
  double as_double() const;  // any number kind
  const Member* find(std::string_view key) const;  // Object only; nullptr when absent
};

struct JsonNode::Member {
  std::string key;
  SourcePos key_pos;
  JsonNode value;
};

enum class JsonSyntax { Relaxed, Strict };

// A parse error, with what it is about for callers that word it their own way (the
// safetensors reader names "the header" or "the index").
class JsonError : public Error {
 public:
  enum class Kind { Syntax, TooDeep, DuplicateKey };
  // what(): "source:line:column: reason".
  JsonError(Kind kind, const std::string& source, SourcePos pos, std::string reason, std::string key, bool in_root)
      : Error(source + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column) + ": " + reason),
        kind(kind), pos(pos), reason(std::move(reason)), key(std::move(key)), in_root(in_root) {}
  Kind kind;
  SourcePos pos;
  std::string reason;    // the message without its place
  std::string key;       // DuplicateKey: the repeated key
  bool in_root = false;  // DuplicateKey: in the root object (else in a nested one)
};

// Parses text into a positioned tree. Nesting deeper than max_depth is an error (the reader
// is recursive; the limit keeps hostile input from exhausting the stack).
JsonNode parse_json(std::string_view text, const std::string& source, int max_depth = 128,
                    JsonSyntax syntax = JsonSyntax::Relaxed);

// Receives one member of the root object (parse_json_members); false: its key repeats an
// earlier one.
using MemberSink = std::function<bool(JsonNode::Member&)>;

// Parses like parse_json without keeping the root object's members: each is handed to `take`
// as soon as it is read, so memory is that of one member, not of the tree (~170 bytes a
// member: 1 GB for a 3-million-entry vocab.json). The reader keeps no root keys either: `take`
// says when a key repeats, and the reader then throws parse_json's duplicate-key error (the
// first key's place found by reading the text again). Returns the root without its members,
// or, when the root is not an object, the whole value.
JsonNode parse_json_members(std::string_view text, const std::string& source, const MemberSink& take,
                            int max_depth = 128);

// Conversions to and from nlohmann::json (positions are lost / unknown). Numbers take the
// types nlohmann's own parser gives them (a non-negative integer is unsigned).
nlohmann::json to_nlohmann(const JsonNode& node);
JsonNode from_nlohmann(const nlohmann::json& value);

// A short human description of a value for "got ..." in messages: "abc" in quotes for
// strings (truncated), numbers as written, true/false/null, "an object", "an array".
std::string describe(const JsonNode& node);

}  // namespace ds
