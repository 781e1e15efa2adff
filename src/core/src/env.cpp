// Strict, typed reads of the registered environment variables (see ds/core/env.h).
#include "ds/core/env.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ds/core/cpu_features.h"
#include "ds/core/error.h"

namespace ds::env {

namespace {

std::string quoted(std::string_view name, std::string_view value) {
  return "environment variable " + std::string(name) + "='" + std::string(value) + "'";
}

const Var& typed(std::string_view name, Type want, Type also = Type(-1)) {
  const Var& v = find(name);
  DS_CHECK(v.type == want || v.type == also,
           "environment variable " << name << " is read with the wrong type (registry row says otherwise)");
  return v;
}

// The value to parse: the variable when set, else the default (empty when there is none).
std::string value_of(const Var& v) {
  if (auto r = raw(v.name)) return *r;
  return v.default_value;
}

bool in_choices(std::string_view choices, std::string_view value) {
  std::size_t start = 0;
  while (start <= choices.size()) {
    const std::size_t bar = choices.find('|', start);
    const std::string_view item = choices.substr(start, bar == std::string_view::npos ? bar : bar - start);
    if (item == value) return true;
    if (bar == std::string_view::npos) break;
    start = bar + 1;
  }
  return false;
}

}  // namespace

const char* class_name(Class c) { return c == Class::System ? "system" : "debug"; }

const char* type_name(Type t) {
  switch (t) {
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Size: return "size";
    case Type::Seconds: return "seconds";
    case Type::String: return "string";
    case Type::Choice: return "choice";
  }
  return "?";
}

std::string accepted(const Var& v) {
  switch (v.type) {
    case Type::Bool: return "0 or 1";
    case Type::Int: return std::to_string(v.min) + " to " + std::to_string(v.max);
    case Type::Size: return "N, NK, NM or NG bytes";
    case Type::Seconds: return "a decimal number";
    case Type::String: return "any text";
    case Type::Choice: return std::string("one of ") + v.choices;
  }
  return "";
}

const Var& find(std::string_view name) {
  for (const Var& v : table())
    if (name == v.name) return v;
  DS_THROW("environment variable " << name << " is not in the registry (src/core/src/env_table.cpp)");
}

std::optional<std::string> raw(std::string_view name) {
  const Var& v = find(name);
  const char* s = std::getenv(v.name);
  if (!s || !*s) return std::nullopt;
  return std::string(s);
}

bool is_set(std::string_view name) { return raw(name).has_value(); }

bool parse_bool(std::string_view t, std::string_view what) {
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  DS_THROW(what << ": expected 0 or 1 (or true/false, yes/no, on/off)");
}

std::size_t parse_size(std::string_view t, std::string_view what) {
  const std::string s(t);
  if (s.empty() || s[0] < '0' || s[0] > '9') DS_THROW(what << ": expected a size (N, NK, NM or NG bytes)");
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(s.c_str(), &end, 10);
  int shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, ++end;
  else if (*end == 'M' || *end == 'm') shift = 20, ++end;
  else if (*end == 'G' || *end == 'g') shift = 30, ++end;
  if (*end != '\0' || errno == ERANGE || (shift && x > (~0ull >> shift)))
    DS_THROW(what << ": expected a size (N, NK, NM or NG bytes)");
  return static_cast<std::size_t>(x << shift);
}

bool get_bool(std::string_view name) {
  const Var& v = typed(name, Type::Bool);
  const std::string s = value_of(v);
  return parse_bool(s, quoted(name, s));
}

long long get_int(std::string_view name) {
  const Var& v = typed(name, Type::Int);
  const std::string s = value_of(v);
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || x < v.min || x > v.max)
    DS_THROW(quoted(name, s) << ": expected an integer from " << v.min << " to " << v.max);
  return x;
}

std::size_t get_size(std::string_view name) {
  const Var& v = typed(name, Type::Size);
  const std::string s = value_of(v);
  return parse_size(s, quoted(name, s));
}

double get_seconds(std::string_view name) {
  const Var& v = typed(name, Type::Seconds);
  const std::string s = value_of(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(x) || x < 0 || x > 1e9)
    DS_THROW(quoted(name, s) << ": expected a number of seconds (0 = no limit)");
  return x;
}

std::string get_string(std::string_view name) {
  const Var& v = typed(name, Type::String, Type::Choice);
  const std::string s = value_of(v);
  if (v.type == Type::Choice && !in_choices(v.choices, s))
    DS_THROW(quoted(name, s) << ": expected one of " << v.choices);
  return s;
}

void check_all() {
  for (const Var& v : table()) {
    if (!is_set(v.name)) continue;
    switch (v.type) {
      case Type::Bool: get_bool(v.name); break;
      case Type::Int: get_int(v.name); break;
      case Type::Size: get_size(v.name); break;
      case Type::Seconds: get_seconds(v.name); break;
      case Type::String: case Type::Choice: get_string(v.name); break;
    }
  }
  // A kernel set this CPU lacks is as much a bad value as a misspelt one.
  if (is_set("DS_CPU_ISA")) (void)cpu_isa();
}

std::optional<std::string> external(const char* name) {
  DS_CHECK(std::strncmp(name, "DS_", 3) != 0,
           "environment variable " << name << " is dstrain's own: register it in the env table");
  const char* s = std::getenv(name);
  if (!s) return std::nullopt;
  return std::string(s);
}

}  // namespace ds::env
