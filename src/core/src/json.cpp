#include "ds/core/json.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <unordered_set>


namespace ds {

double JsonNode::as_double() const {
  switch (kind) {
    case Kind::Int: return static_cast<double>(int_value);
    case Kind::UInt: return static_cast<double>(uint_value);
    case Kind::Double: return double_value;
    default: return 0.0;
  }
}

const JsonNode::Member* JsonNode::find(std::string_view key) const {
  for (const auto& m : members) {
    if (m.key == key) return &m;
  }
  return nullptr;
}

namespace {

class Reader {
 public:
  // `take`, when given, receives the root object's members instead of the tree (parse_json_members).
  Reader(std::string_view text, const std::string& source, int max_depth, JsonSyntax syntax,
         const MemberSink* take = nullptr)
      : t_(text), source_(source), max_depth_(max_depth), strict_(syntax == JsonSyntax::Strict), take_(take) {}

  JsonNode parse_document() {
    // A UTF-8 byte-order mark is not part of the document.
    if (t_.substr(0, 3) == "\xEF\xBB\xBF") p_ = 3;
    skip_ws();
    if (eof()) fail(here(), "empty document: expected a JSON object");
    JsonNode root = parse_value(0);
    skip_ws();
    if (!eof()) fail(here(), "unexpected " + char_desc() + " after the end of the JSON document");
    return root;
  }

 private:
  std::string_view t_;
  const std::string& source_;
  int max_depth_;
  bool strict_;  // JSON alone: no comments, no trailing commas
  const MemberSink* take_;
  size_t p_ = 0;
  int line_ = 1, col_ = 1;
  std::vector<std::string> path_;  // key path to the value being read, for duplicate-key errors

  bool eof() const { return p_ >= t_.size(); }
  char peek(size_t ahead = 0) const { return p_ + ahead < t_.size() ? t_[p_ + ahead] : '\0'; }
  SourcePos here() const { return SourcePos{line_, col_}; }

  void advance() {
    const unsigned char c = static_cast<unsigned char>(t_[p_++]);
    if (c == '\n') {
      ++line_;
      col_ = 1;
    } else if ((c & 0xC0) != 0x80) {  // a UTF-8 continuation byte does not start a character
      ++col_;
    }
  }

  [[noreturn]] void fail(SourcePos at, const std::string& message,
                         JsonError::Kind kind = JsonError::Kind::Syntax, const std::string& key = {},
                         bool in_root = false) const {
    throw JsonError(kind, source_, at, message, key, in_root);
  }
  void refuse_in_strict(const char* what) const {
    if (strict_) fail(here(), std::string(what) + " (not JSON)");
  }

  std::string char_desc() const {
    if (eof()) return "end of input";
    const unsigned char c = static_cast<unsigned char>(peek());
    if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
    char buf[16];
    std::snprintf(buf, sizeof buf, "byte 0x%02X", c);
    return buf;
  }

  std::string path_string() const {
    std::string s;
    for (const auto& part : path_) {
      if (!s.empty() && part[0] != '[') s += '.';
      s += part;
    }
    return s;
  }

  void skip_ws() {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance();
      } else if (c == '#' || (c == '/' && peek(1) == '/')) {
        refuse_in_strict("a comment");
        while (!eof() && peek() != '\n') advance();
      } else if (c == '/' && peek(1) == '*') {
        refuse_in_strict("a comment");
        const SourcePos start = here();
        advance();
        advance();
        while (!(peek() == '*' && peek(1) == '/')) {
          if (eof()) fail(start, "unterminated /* comment");
          advance();
        }
        advance();
        advance();
      } else {
        return;
      }
    }
  }

  JsonNode parse_value(int depth) {
    skip_ws();
    if (eof()) fail(here(), "unexpected end of input: expected a value");
    const char c = peek();
    if (c == '{') return parse_object(depth + 1);
    if (c == '[') return parse_array(depth + 1);
    if (c == '"') {
      JsonNode n;
      n.kind = JsonNode::Kind::String;
      n.pos = here();
      n.str = parse_string();
      return n;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (c == '\'') fail(here(), "strings must be in double quotes (\"...\"), not single quotes");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return parse_word();
    fail(here(), "unexpected " + char_desc() + ": expected a value");
  }

  JsonNode parse_word() {
    JsonNode n;
    n.pos = here();
    const size_t start = p_;
    while (!eof() && ((peek() >= 'a' && peek() <= 'z') || (peek() >= 'A' && peek() <= 'Z') ||
                      (peek() >= '0' && peek() <= '9') || peek() == '_')) {
      advance();
    }
    const std::string_view w = t_.substr(start, p_ - start);
    if (w == "true" || w == "false") {
      n.kind = JsonNode::Kind::Bool;
      n.boolean = (w == "true");
    } else if (w == "null") {
      n.kind = JsonNode::Kind::Null;
    } else if (w == "NaN" || w == "Infinity") {
      fail(n.pos, "NaN and Infinity are not valid JSON numbers");
    } else if (w == "True" || w == "False" || w == "None") {
      fail(n.pos, "unexpected word '" + std::string(w) + "' (JSON spells these true, false, null)");
    } else {
      fail(n.pos, "unexpected word '" + std::string(w.substr(0, 40)) +
                      "': expected a value (strings must be in double quotes)");
    }
    return n;
  }

  JsonNode parse_number() {
    JsonNode n;
    n.pos = here();
    const size_t start = p_;
    auto digits = [&] {
      const size_t s = p_;
      while (!eof() && peek() >= '0' && peek() <= '9') advance();
      return p_ - s;
    };
    if (peek() == '-') advance();
    if (peek() == '0') {
      advance();
      if (peek() >= '0' && peek() <= '9') fail(n.pos, "numbers must not have leading zeros");
    } else if (digits() == 0) {
      fail(here(), "expected a digit after '-'");
    }
    bool is_float = false;
    if (peek() == '.') {
      is_float = true;
      advance();
      if (digits() == 0) fail(here(), "expected a digit after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      is_float = true;
      advance();
      if (peek() == '+' || peek() == '-') advance();
      if (digits() == 0) fail(here(), "expected a digit in the exponent");
    }
    const char* b = t_.data() + start;
    const char* e = t_.data() + p_;
    if (!is_float) {
      std::int64_t v = 0;
      auto r = std::from_chars(b, e, v);
      if (r.ec == std::errc() && r.ptr == e) {
        n.kind = JsonNode::Kind::Int;
        n.int_value = v;
        return n;
      }
      std::uint64_t u = 0;
      r = std::from_chars(b, e, u);
      if (r.ec == std::errc() && r.ptr == e) {
        n.kind = JsonNode::Kind::UInt;
        n.uint_value = u;
        return n;
      }
      // Larger integers fall through to double, as Python's json would keep them exactly but
      // nothing in a config needs more than 64 bits.
    }
    double d = 0;
    auto r = std::from_chars(b, e, d);
    if (r.ec == std::errc::result_out_of_range) {
      // Underflow to zero is harmless; overflow to infinity is not a usable config value.
      if (std::abs(std::strtod(std::string(b, e).c_str(), nullptr)) > 1.0) {
        fail(n.pos, "number " + std::string(b, e).substr(0, 40) + " is out of range");
      }
      d = 0.0;
    } else if (r.ec != std::errc() || r.ptr != e) {
      fail(n.pos, "malformed number");
    }
    n.kind = JsonNode::Kind::Double;
    n.double_value = d;
    return n;
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::uint32_t parse_hex4() {
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = peek();
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else fail(here(), "expected 4 hex digits after \\u");
      v = v * 16 + static_cast<std::uint32_t>(d);
      advance();
    }
    return v;
  }

  // Copies one raw UTF-8 character, checking it is well formed (nlohmann::json refuses to
  // write invalid UTF-8, and the resolved config is written back out).
  void copy_utf8_char(std::string& out) {
    const SourcePos at = here();
    const unsigned char c0 = static_cast<unsigned char>(peek());
    int len;
    std::uint32_t cp;
    if (c0 >= 0xC2 && c0 <= 0xDF) { len = 2; cp = c0 & 0x1F; }
    else if (c0 >= 0xE0 && c0 <= 0xEF) { len = 3; cp = c0 & 0x0F; }
    else if (c0 >= 0xF0 && c0 <= 0xF4) { len = 4; cp = c0 & 0x07; }
    else fail(at, "invalid UTF-8 in string");
    for (int i = 1; i < len; ++i) {
      const unsigned char c = static_cast<unsigned char>(peek(static_cast<size_t>(i)));
      if ((c & 0xC0) != 0x80) fail(at, "invalid UTF-8 in string");
      cp = (cp << 6) | (c & 0x3F);
    }
    const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail(at, "invalid UTF-8 in string");
    for (int i = 0; i < len; ++i) {
      out += peek();
      advance();
    }
  }

  std::string parse_string() {
    const SourcePos start = here();
    advance();  // opening quote
    std::string out;
    for (;;) {
      if (eof()) fail(start, "unterminated string");
      const unsigned char c = static_cast<unsigned char>(peek());
      if (c == '"') {
        advance();
        return out;
      }
      if (c == '\n') fail(start, "unterminated string (newline before the closing quote)");
      if (c < 0x20) fail(here(), "control character in string (write it as an escape such as \\t)");
      if (c == '\\') {
        advance();
        const char e = peek();
        if (eof()) fail(start, "unterminated string");
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            const SourcePos esc = here();
            advance();
            std::uint32_t cp = parse_hex4();
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (peek() != '\\' || peek(1) != 'u') fail(esc, "unpaired UTF-16 surrogate in \\u escape");
              advance();
              advance();
              const std::uint32_t lo = parse_hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) fail(esc, "unpaired UTF-16 surrogate in \\u escape");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
              fail(esc, "unpaired UTF-16 surrogate in \\u escape");
            }
            append_utf8(out, cp);
            continue;  // parse_hex4 already consumed the digits
          }
          default: fail(here(), "invalid escape \\" + std::string(1, e) + " in string");
        }
        advance();
        continue;
      }
      if (c < 0x80) {
        out += static_cast<char>(c);
        advance();
      } else {
        copy_utf8_char(out);
      }
    }
  }

  void check_depth(int depth, SourcePos at) const {
    if (depth > max_depth_)
      fail(at, "nesting deeper than " + std::to_string(max_depth_) + " levels", JsonError::Kind::TooDeep);
  }

  JsonNode parse_array(int depth) {
    JsonNode n;
    n.kind = JsonNode::Kind::Array;
    n.pos = here();
    check_depth(depth, n.pos);
    advance();  // [
    skip_ws();
    if (peek() == ']') {
      advance();
      return n;
    }
    for (;;) {
      // Appended, not "[" + to_string(..): GCC 12's libstdc++ reports a false -Wrestrict on
      // operator+(const char*, string&&) here.
      std::string index = std::to_string(n.items.size());
      index.insert(index.begin(), '[');
      index.push_back(']');
      path_.push_back(std::move(index));
      n.items.push_back(parse_value(depth));
      path_.pop_back();
      skip_ws();
      if (peek() == ',') {
        advance();
        skip_ws();
        if (peek() == ']') {  // trailing comma (hjson allows it)
          refuse_in_strict("a trailing comma");
          advance();
          return n;
        }
        continue;
      }
      if (peek() == ']') {
        advance();
        return n;
      }
      if (eof()) fail(n.pos, "unterminated array: missing ']'");
      fail(here(), "expected ',' or ']' after an array element, got " + char_desc());
    }
  }

  // A repeated root key in parse_json_members: the first one's place is found by reading the
  // text again up to it (the reader keeps no root keys there; an error path only).
  [[noreturn]] void fail_repeated_root_key(const JsonNode::Member& m) const {
    struct Found {
      SourcePos pos;
    };
    const MemberSink find = [&](JsonNode::Member& earlier) -> bool {
      if (earlier.key == m.key) throw Found{earlier.key_pos};
      return true;
    };
    SourcePos first;
    try {
      Reader(t_, source_, max_depth_, strict_ ? JsonSyntax::Strict : JsonSyntax::Relaxed, &find).parse_document();
    } catch (const Found& found) {
      first = found.pos;
    }
    fail(m.key_pos,
         "duplicate key \"" + m.key + "\" (first at line " + std::to_string(first.line) + ", column " +
             std::to_string(first.column) + ")",
         JsonError::Kind::DuplicateKey, m.key, true);
  }

  JsonNode parse_object(int depth) {
    JsonNode n;
    n.kind = JsonNode::Kind::Object;
    n.pos = here();
    check_depth(depth, n.pos);
    advance();  // {
    const bool to_sink = take_ != nullptr && depth == 1;
    std::unordered_set<std::string> seen;
    std::string last_key;
    bool after_comma = false;
    for (;;) {
      skip_ws();
      if (peek() == '}') {  // empty object, or a trailing comma (hjson allows it)
        if (after_comma) refuse_in_strict("a trailing comma");
        advance();
        return n;
      }
      if (eof()) fail(n.pos, "unterminated object: missing '}'");
      if (peek() != '"') {
        if (peek() == '\'') fail(here(), "keys must be in double quotes, not single quotes");
        if (std::isalpha(static_cast<unsigned char>(peek())) || peek() == '_') {
          fail(here(), "keys must be in double quotes");
        }
        fail(here(), "expected a quoted key or '}', got " + char_desc());
      }
      JsonNode::Member m;
      m.key_pos = here();
      m.key = parse_string();
      skip_ws();
      if (peek() != ':') fail(here(), "expected ':' after key \"" + m.key + "\", got " + char_desc());
      advance();
      path_.push_back(m.key);
      if (!to_sink && !seen.insert(m.key).second) {
        const JsonNode::Member* first = n.find(m.key);
        fail(m.key_pos,
             "duplicate key \"" + path_string() + "\" (first at line " + std::to_string(first->key_pos.line) +
                 ", column " + std::to_string(first->key_pos.column) + ")",
             JsonError::Kind::DuplicateKey, m.key, depth == 1);
      }
      m.value = parse_value(depth);
      path_.pop_back();
      if (to_sink) {
        if (!(*take_)(m)) fail_repeated_root_key(m);
        last_key = std::move(m.key);
      } else {
        last_key = m.key;
        n.members.push_back(std::move(m));
      }
      skip_ws();
      if (peek() == ',') {
        advance();
        after_comma = true;
        continue;
      }
      if (peek() == '}') {
        advance();
        return n;
      }
      if (eof()) fail(n.pos, "unterminated object: missing '}'");
      fail(here(), "expected ',' or '}' after the value of \"" + last_key + "\", got " + char_desc());
    }
  }
};

}  // namespace

JsonNode parse_json(std::string_view text, const std::string& source, int max_depth, JsonSyntax syntax) {
  Reader r(text, source, max_depth, syntax);
  return r.parse_document();
}

JsonNode parse_json_members(std::string_view text, const std::string& source, const MemberSink& take, int max_depth) {
  Reader r(text, source, max_depth, JsonSyntax::Relaxed, &take);
  return r.parse_document();
}

nlohmann::json to_nlohmann(const JsonNode& node) {
  using K = JsonNode::Kind;
  switch (node.kind) {
    case K::Null: return nullptr;
    case K::Bool: return node.boolean;
    case K::Int:  // as nlohmann's parser types it: non-negative integers are unsigned
      return node.int_value >= 0 ? nlohmann::json(std::uint64_t(node.int_value)) : nlohmann::json(node.int_value);
    case K::UInt: return node.uint_value;
    case K::Double: return node.double_value;
    case K::String: return node.str;
    case K::Array: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& item : node.items) a.push_back(to_nlohmann(item));
      return a;
    }
    case K::Object: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& m : node.members) o[m.key] = to_nlohmann(m.value);
      return o;
    }
  }
  return nullptr;
}

JsonNode from_nlohmann(const nlohmann::json& value) {
  using K = JsonNode::Kind;
  JsonNode n;
  switch (value.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded: n.kind = K::Null; break;
    case nlohmann::json::value_t::boolean: n.kind = K::Bool; n.boolean = value.get<bool>(); break;
    case nlohmann::json::value_t::number_integer:
      n.kind = K::Int;
      n.int_value = value.get<std::int64_t>();
      break;
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = value.get<std::uint64_t>();
      if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        n.kind = K::Int;
        n.int_value = static_cast<std::int64_t>(u);
      } else {
        n.kind = K::UInt;
        n.uint_value = u;
      }
      break;
    }
    case nlohmann::json::value_t::number_float: n.kind = K::Double; n.double_value = value.get<double>(); break;
    case nlohmann::json::value_t::string: n.kind = K::String; n.str = value.get<std::string>(); break;
    case nlohmann::json::value_t::array:
      n.kind = K::Array;
      for (const auto& item : value) n.items.push_back(from_nlohmann(item));
      break;
    case nlohmann::json::value_t::object:
      n.kind = K::Object;
      for (auto it = value.begin(); it != value.end(); ++it) {
        n.members.push_back(JsonNode::Member{it.key(), SourcePos{}, from_nlohmann(it.value())});
      }
      break;
    case nlohmann::json::value_t::binary: DS_THROW("binary values cannot appear in a config");
  }
  return n;
}

std::string describe(const JsonNode& node) {
  using K = JsonNode::Kind;
  switch (node.kind) {
    case K::Null: return "null";
    case K::Bool: return node.boolean ? "true" : "false";
    case K::Int: return std::to_string(node.int_value);
    case K::UInt: return std::to_string(node.uint_value);
    case K::Double: return nlohmann::json(node.double_value).dump();
    case K::String: {
      std::string s = node.str.size() > 40 ? node.str.substr(0, 40) + "..." : node.str;
      // error_handler::replace: a cut through a multi-byte character must not throw here.
      return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    case K::Array: return "an array";
    case K::Object: return "an object";
  }
  return "?";
}

}  // namespace ds
