// The client-state tree saved in checkpoints: what DeepSpeed's `client_state` dict holds,
// restricted to types that round-trip exactly through HDF5 and that h5py can read.
//
//   StateValue v;                          // default: an empty map
//   v["step"] = std::int64_t(10);          // any integer -> int64, float/double -> double
//   v["sampler"]["epoch"] = 3;             // operator[] on a map inserts an empty map
//   v["lrs"] = StateValue::list({0.1, 0.2});
//   v["rng"] = FloatTensor{{2, 3}, {...}};
//   std::int64_t step = v.at("step").as_int();
//
// Kinds: null, bool, int64, double, string, list, map, float tensor (shape + fp32 values).
// Maps are ordered by key (std::map): iteration, equality and the HDF5 layout use key
// order, so two trees with the same entries are equal however they were built.
// Integers and doubles are distinct kinds: int64 10 != double 10.0 (they round-trip as
// written). Equality is exact; a double or tensor holding NaN never compares equal.
// Accessing the wrong kind throws ds::Error naming the expected and the actual kind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace ds::io {

// A dense fp32 tensor, row-major. numel(shape) == data.size() (checked on save).
struct FloatTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> data;
  bool operator==(const FloatTensor&) const = default;
};

class StateValue {
 public:
  enum class Kind : std::uint8_t { Null, Bool, Int, Double, String, List, Map, Tensor };
  using List = std::vector<StateValue>;
  using Map = std::map<std::string, StateValue, std::less<>>;

  StateValue() : v_(Map{}) {}  // an empty map
  StateValue(std::nullptr_t) : v_(std::monostate{}) {}
  StateValue(bool b) : v_(b) {}
  template <typename I, std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>, int> = 0>
  StateValue(I i) : v_(static_cast<std::int64_t>(i)) {}
  StateValue(double d) : v_(d) {}
  StateValue(float f) : v_(static_cast<double>(f)) {}
  StateValue(const char* s) : v_(std::string(s)) {}
  StateValue(std::string s) : v_(std::move(s)) {}
  StateValue(std::string_view s) : v_(std::string(s)) {}
  StateValue(List l) : v_(std::move(l)) {}
  StateValue(Map m) : v_(std::move(m)) {}
  StateValue(FloatTensor t) : v_(std::move(t)) {}

  static StateValue null() { return StateValue(nullptr); }
  static StateValue map() { return StateValue(Map{}); }
  static StateValue list(std::initializer_list<StateValue> items = {}) { return StateValue(List(items)); }
  static StateValue tensor(std::vector<std::int64_t> shape, std::vector<float> data) {
    return StateValue(FloatTensor{std::move(shape), std::move(data)});
  }

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_null() const { return kind() == Kind::Null; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_double() const { return kind() == Kind::Double; }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_map() const { return kind() == Kind::Map; }
  bool is_tensor() const { return kind() == Kind::Tensor; }

  // Typed access; throws ds::Error on the wrong kind.
  bool as_bool() const;
  std::int64_t as_int() const;
  double as_double() const;  // exact kind Double only (no int -> double conversion)
  const std::string& as_string() const;
  const List& as_list() const;
  List& as_list();
  const Map& as_map() const;
  Map& as_map();
  const FloatTensor& as_tensor() const;
  FloatTensor& as_tensor();

  // Map access. operator[] inserts an empty map for a missing key (the value must be a map);
  // at() throws ds::Error naming the key when it is missing.
  StateValue& operator[](std::string_view key);
  const StateValue& at(std::string_view key) const;
  StateValue& at(std::string_view key);
  bool contains(std::string_view key) const;

  // List access (bounds-checked).
  StateValue& operator[](std::size_t i);
  const StateValue& at(std::size_t i) const;
  void push_back(StateValue v);

  // Entries of a map or list, elements of a tensor; 0 for scalars and null.
  std::size_t size() const;

  bool operator==(const StateValue& o) const { return v_ == o.v_; }

  // Debug rendering (JSON-like; tensors as shape + first values).
  std::string to_string() const;

 private:
  std::variant<std::monostate, bool, std::int64_t, double, std::string, List, Map, FloatTensor> v_;
};

std::string_view kind_name(StateValue::Kind k);

}  // namespace ds::io
