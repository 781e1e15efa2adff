#include "ds/io/state_value.h"

#include <sstream>

#include "ds/core/error.h"

namespace ds::io {

std::string_view kind_name(StateValue::Kind k) {
  switch (k) {
    case StateValue::Kind::Null: return "null";
    case StateValue::Kind::Bool: return "bool";
    case StateValue::Kind::Int: return "int64";
    case StateValue::Kind::Double: return "double";
    case StateValue::Kind::String: return "string";
    case StateValue::Kind::List: return "list";
    case StateValue::Kind::Map: return "map";
    case StateValue::Kind::Tensor: return "tensor";
  }
  return "?";
}

namespace {
template <typename T, typename V>
auto& get_kind(V& v, StateValue::Kind want, StateValue::Kind have) {
  auto* p = std::get_if<T>(&v);
  if (!p) DS_THROW("StateValue: expected " << kind_name(want) << ", found " << kind_name(have));
  return *p;
}
}  // namespace

#define DS_SV_GET(T, K) get_kind<T>(v_, Kind::K, kind())
bool StateValue::as_bool() const { return DS_SV_GET(bool, Bool); }
std::int64_t StateValue::as_int() const { return DS_SV_GET(std::int64_t, Int); }
double StateValue::as_double() const { return DS_SV_GET(double, Double); }
const std::string& StateValue::as_string() const { return DS_SV_GET(std::string, String); }
const StateValue::List& StateValue::as_list() const { return DS_SV_GET(List, List); }
StateValue::List& StateValue::as_list() { return DS_SV_GET(List, List); }
const StateValue::Map& StateValue::as_map() const { return DS_SV_GET(Map, Map); }
StateValue::Map& StateValue::as_map() { return DS_SV_GET(Map, Map); }
const FloatTensor& StateValue::as_tensor() const { return DS_SV_GET(FloatTensor, Tensor); }
FloatTensor& StateValue::as_tensor() { return DS_SV_GET(FloatTensor, Tensor); }
#undef DS_SV_GET

StateValue& StateValue::operator[](std::string_view key) {
  Map& m = as_map();
  auto it = m.find(key);
  if (it == m.end()) it = m.emplace(std::string(key), StateValue::map()).first;
  return it->second;
}

const StateValue& StateValue::at(std::string_view key) const {
  const Map& m = as_map();
  auto it = m.find(key);
  DS_CHECK(it != m.end(), "StateValue: no key '" << key << "' in map");
  return it->second;
}

StateValue& StateValue::at(std::string_view key) {
  return const_cast<StateValue&>(static_cast<const StateValue&>(*this).at(key));
}

bool StateValue::contains(std::string_view key) const {
  const Map& m = as_map();
  return m.find(key) != m.end();
}

StateValue& StateValue::operator[](std::size_t i) {
  List& l = as_list();
  DS_CHECK(i < l.size(), "StateValue: list index " << i << " out of range (size " << l.size() << ")");
  return l[i];
}

const StateValue& StateValue::at(std::size_t i) const {
  const List& l = as_list();
  DS_CHECK(i < l.size(), "StateValue: list index " << i << " out of range (size " << l.size() << ")");
  return l[i];
}

void StateValue::push_back(StateValue v) { as_list().push_back(std::move(v)); }

std::size_t StateValue::size() const {
  switch (kind()) {
    case Kind::List: return as_list().size();
    case Kind::Map: return as_map().size();
    case Kind::Tensor: return as_tensor().data.size();
    default: return 0;
  }
}

namespace {
void render(const StateValue& v, std::ostringstream& os) {
  using K = StateValue::Kind;
  switch (v.kind()) {
    case K::Null: os << "null"; break;
    case K::Bool: os << (v.as_bool() ? "true" : "false"); break;
    case K::Int: os << v.as_int(); break;
    case K::Double: os << v.as_double() << "d"; break;
    case K::String: os << '"' << v.as_string() << '"'; break;
    case K::List: {
      os << '[';
      bool first = true;
      for (const auto& e : v.as_list()) { if (!first) os << ", "; first = false; render(e, os); }
      os << ']';
      break;
    }
    case K::Map: {
      os << '{';
      bool first = true;
      for (const auto& [k, e] : v.as_map()) {
        if (!first) os << ", ";
        first = false;
        os << '"' << k << "\": ";
        render(e, os);
      }
      os << '}';
      break;
    }
    case K::Tensor: {
      const auto& t = v.as_tensor();
      os << "tensor(shape=[";
      for (std::size_t i = 0; i < t.shape.size(); ++i) os << (i ? "," : "") << t.shape[i];
      os << "], data=[";
      for (std::size_t i = 0; i < t.data.size() && i < 4; ++i) os << (i ? "," : "") << t.data[i];
      if (t.data.size() > 4) os << ",...";
      os << "])";
      break;
    }
  }
}
}  // namespace

std::string StateValue::to_string() const {
  std::ostringstream os;
  render(*this, os);
  return os.str();
}

}  // namespace ds::io
