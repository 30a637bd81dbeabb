// The values a Jinja template computes with (data/jinja.h), with Python's
// semantics, because chat templates are written for Python Jinja as
// transformers runs it: str() of None is "None", 1 == 1.0, lists and dicts
// compare by content, an undefined name is a value that prints as nothing
// and fails when used as anything else.
//
// Lists, dicts and namespaces are shared references, as in Python: copying
// a Value copies the reference. Dicts keep insertion order (Python 3.7+).
//
// Contract: operations that Python would refuse throw TemplateError with a
// one-line message and no position; the renderer adds the template's line
// and column. TemplateError never escapes data/jinja.h's API.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace myriad::jinja {

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Value;
using List = std::vector<Value>;

// An ordered string-keyed map: a Python dict from JSON, a dict literal, or
// the attributes of a namespace().
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value value);
};

// Arguments of a call: positional, then keyword ones in the written order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;  // for messages: "strip", "macro 'tool_block'"
  std::function<Value(const CallArgs&)> fn;
};

struct UndefinedValue {
  std::string hint;  // why, as Python Jinja says it: "'x' is undefined"
};
struct NoneValue {};
struct NamespaceTag {};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable
  };

  Value() : v_(UndefinedValue{}) {}
  static Value Undefined(std::string hint) { return Value(UndefinedValue{std::move(hint)}); }
  static Value None() { return Value(NoneValue{}); }
  Value(bool b) : v_(b) {}                           // NOLINT: implicit by design
  Value(int64_t i) : v_(i) {}                        // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}      // NOLINT
  Value(double f) : v_(f) {}                         // NOLINT
  Value(std::string s) : v_(std::move(s)) {}         // NOLINT
  Value(const char* s) : v_(std::string(s)) {}       // NOLINT
  static Value MakeList(List items = {});
  static Value MakeDict(Dict dict = {});
  static Value MakeNamespace(Dict attributes = {});
  static Value MakeCallable(std::string name, std::function<Value(const CallArgs&)> fn);

  Kind kind() const;
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // int, float or bool (a bool is a Python int).
  bool is_number() const { return is_int() || is_float() || is_bool(); }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;  // int or bool
  double as_float() const;  // any number
  const std::string& str() const { return std::get<std::string>(v_); }
  const List& list() const { return *std::get<std::shared_ptr<List>>(v_); }
  const Dict& dict() const;  // a dict or a namespace's attributes
  Dict& mutable_namespace() const { return *std::get<NamespaceHolder>(v_).attrs; }
  const Callable& callable() const { return *std::get<std::shared_ptr<Callable>>(v_); }
  const std::string& undefined_hint() const { return std::get<UndefinedValue>(v_).hint; }
  // The same list, dict or namespace object (Python `is`).
  bool SameObject(const Value& other) const;

 private:
  struct NamespaceHolder {
    std::shared_ptr<Dict> attrs;
  };
  template <typename T>
  explicit Value(T v, int) : v_(std::move(v)) {}
  explicit Value(UndefinedValue u) : v_(std::move(u)) {}
  explicit Value(NoneValue n) : v_(n) {}

  std::variant<UndefinedValue, NoneValue, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>, NamespaceHolder, std::shared_ptr<Callable>>
      v_;
};

// Python's type name of a value, for messages: str, int, float, bool,
// NoneType, list, dict, Namespace, function, undefined.
std::string TypeName(const Value& v);

// Python truthiness (undefined and empty containers are false).
bool Truthy(const Value& v);

// Throws the error Python Jinja raises when an undefined value is used.
[[noreturn]] void FailUndefined(const Value& v);

// str(v) as Python writes it, for {{ }} and ~: undefined is "", None is
// "None", True is "True", floats as repr(). A list, dict or namespace throws:
// Python writes its repr, @huggingface/jinja writes JSON, and a chat template
// has no business printing either (use |tojson).
std::string ToStr(const Value& v);

struct JsonOptions {
  std::optional<std::string> indent;  // per level; nullopt = one line
  bool ensure_ascii = false;
  std::string item_separator = ", ";  // "," when indenting, as json.dumps
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(v, ...) as Python writes it (transformers' |tojson): floats as
// repr(), non-ASCII kept unless ensure_ascii. Undefined, namespaces and
// callables throw, as json.dumps does.
std::string ToJson(const Value& v, const JsonOptions& options);

// Python ==.
bool Equal(const Value& a, const Value& b);
// Python <, for numbers, strings and lists: -1, 0 or 1; other pairs throw.
int Compare(const Value& a, const Value& b, const char* op);
// What a for loop iterates: list items, dict keys, string characters;
// undefined is empty; anything else throws.
List Iterate(const Value& v);

// The value of a JSON document (objects keep their key order when J is
// nlohmann::ordered_json; nlohmann::json has already sorted them).
template <typename J>
Value FromJson(const J& j) {
  switch (j.type()) {
    case J::value_t::null: return Value::None();
    case J::value_t::boolean: return Value(j.template get<bool>());
    case J::value_t::number_integer: return Value(j.template get<int64_t>());
    case J::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case J::value_t::number_float: return Value(j.template get<double>());
    case J::value_t::string: return Value(j.template get<std::string>());
    case J::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(FromJson(x));
      return Value::MakeList(std::move(items));
    }
    case J::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), FromJson(it.value()));
      return Value::MakeDict(std::move(d));
    }
    default: throw TemplateError("binary JSON values are not supported");
  }
}

}  // namespace myriad::jinja
