// Filters and tests (declared in data/jinja_builtins.h).
#include "data/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "data/jinja_text.h"

namespace myriad::jinja {

namespace {

const std::set<std::string>& SupportedFilters() {
  static const std::set<std::string> kNames = {
      "abs",   "capitalize", "count",   "d",       "default", "first",      "float",  "indent",
      "int",   "items",      "join",    "last",    "length",  "list",       "lower",  "map",
      "reject", "rejectattr", "replace", "reverse", "safe",    "select",     "selectattr", "sort",
      "string", "title",     "tojson",  "trim",    "unique",  "upper"};
  return kNames;
}

// Python Jinja 3.1's other builtin filters: named in "not supported" errors.
const std::set<std::string>& OtherJinjaFilters() {
  static const std::set<std::string> kNames = {
      "attr",   "batch",  "center",   "dictsort", "e",        "escape",  "filesizeformat", "forceescape",
      "format", "groupby", "max",     "min",      "pprint",   "random",  "round",          "slice",
      "striptags", "sum",  "truncate", "urlencode", "urlize", "wordcount", "wordwrap",     "xmlattr"};
  return kNames;
}

const std::set<std::string>& SupportedTests() {
  static const std::set<std::string> kNames = {
      "boolean", "callable", "defined", "divisibleby", "eq",      "equalto", "even",     "false",
      "float",   "ge",       "greaterthan", "gt",      "in",      "integer", "iterable", "le",
      "lessthan", "lower",   "lt",      "mapping",     "ne",      "none",    "number",   "odd",
      "sameas",  "sequence", "string",  "true",        "undefined", "upper"};
  return kNames;
}

// The attribute path of map/sort/unique/selectattr: "a.b.0" as Jinja's
// make_attrgetter walks it (integer parts index lists).
Value AttributePath(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    v = GetItem(v, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Python's int(str): whitespace around, an optional sign, digits with single
// underscores between them.
std::optional<int64_t> ParsePyInt(const std::string& text, int base) {
  const std::string s = PyStrip(text, std::nullopt, StripSide::kBoth);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return std::nullopt;
  __int128 v = 0;
  bool digit_before = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_' && digit_before && i + 1 < s.size() && s[i + 1] != '_') {
      digit_before = false;
      continue;
    }
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'z') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'Z') d = c - 'A' + 10;
    if (d < 0 || d >= base) return std::nullopt;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) throw TemplateError("integer " + s + " is too large");
    digit_before = true;
  }
  if (!digit_before) return std::nullopt;
  v = negative ? -v : v;
  if (v > INT64_MAX) throw TemplateError("integer " + s + " is too large");
  return static_cast<int64_t>(v);
}

// Python's float(str) for decimal literals, inf and nan.
std::optional<double> ParsePyFloat(const std::string& text) {
  std::string s;
  for (char c : PyStrip(text, std::nullopt, StripSide::kBoth)) {
    if (c != '_') s.push_back(c);
  }
  if (s.empty() || s.find_first_of("xXpP") != std::string::npos) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return v;
}

Value IntFilter(const Value& v, const CallArgs& args) {
  auto p = BindArgs("int", args, {"default", "base"});
  const Value fallback = p[0] ? *p[0] : Value(int64_t{0});
  const int base = p[1] ? static_cast<int>(p[1]->as_int()) : 10;
  if (v.is_undefined()) FailUndefined(v);
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  auto from_float = [&](double f) -> Value {
    if (std::isnan(f)) return fallback;
    if (std::isinf(f)) throw TemplateError("cannot convert float infinity to integer");
    if (std::fabs(f) >= 9.2e18) throw TemplateError("integer overflow converting a float");
    return Value(static_cast<int64_t>(f));
  };
  if (v.is_float()) return from_float(v.as_float());
  if (v.is_string()) {
    if (auto i = ParsePyInt(v.str(), base)) return Value(*i);
    if (auto f = ParsePyFloat(v.str())) return from_float(*f);
  }
  return fallback;
}

Value FloatFilter(const Value& v, const CallArgs& args) {
  auto p = BindArgs("float", args, {"default"});
  const Value fallback = p[0] ? *p[0] : Value(0.0);
  if (v.is_undefined()) FailUndefined(v);
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    if (auto f = ParsePyFloat(v.str())) return Value(*f);
  }
  return fallback;
}

Value TojsonFilter(const Value& v, const CallArgs& args) {
  // transformers' signature: tojson(x, ensure_ascii=False, indent=None,
  // separators=None, sort_keys=False).
  auto p = BindArgs("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = p[0] && Truthy(*p[0]);
  if (p[1] && !p[1]->is_none()) {
    if (p[1]->is_string()) {
      o.indent = p[1]->str();
    } else if (p[1]->is_int()) {
      o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, p[1]->as_int())), ' ');
    } else {
      throw TemplateError("tojson indent must be an integer or a string");
    }
    o.item_separator = ",";
  }
  if (p[2] && !p[2]->is_none()) {
    if (!p[2]->is_list() || p[2]->list().size() != 2 || !p[2]->list()[0].is_string() ||
        !p[2]->list()[1].is_string()) {
      throw TemplateError("tojson separators must be a pair of strings");
    }
    o.item_separator = p[2]->list()[0].str();
    o.key_separator = p[2]->list()[1].str();
  }
  o.sort_keys = p[3] && Truthy(*p[3]);
  return Value(ToJson(v, o));
}

Value IndentFilter(const Value& v, const CallArgs& args) {
  auto p = BindArgs("indent", args, {"width", "first", "blank"});
  std::string indention = "    ";
  if (p[0]) {
    if (p[0]->is_string()) indention = p[0]->str();
    else indention = std::string(static_cast<size_t>(std::max<int64_t>(0, p[0]->as_int())), ' ');
  }
  const bool first = p[1] && Truthy(*p[1]);
  const bool blank = p[2] && Truthy(*p[2]);
  // Jinja appends a newline so that splitlines keeps a trailing empty line.
  const std::vector<std::string> lines = PySplitLines(ToStr(v) + "\n");
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += "\n";
    if (i > 0 && (blank || !lines[i].empty())) rv += indention;
    rv += lines[i];
  }
  if (first) rv = indention + rv;
  return Value(std::move(rv));
}

Value JoinFilter(const Value& v, const CallArgs& args) {
  auto p = BindArgs("join", args, {"d", "attribute"});
  const std::string sep = p[0] ? ToStr(*p[0]) : "";
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(v)) {
    if (!first) out += sep;
    out += ToStr(p[1] && !p[1]->is_none() ? AttributePath(item, ToStr(*p[1])) : item);
    first = false;
  }
  return Value(std::move(out));
}

// A sort key: the item or its attribute, lower-cased unless case-sensitive.
Value SortKey(const Value& item, const std::optional<Value>& attribute, bool case_sensitive) {
  Value key = attribute && !attribute->is_none() ? AttributePath(item, ToStr(*attribute)) : item;
  if (!case_sensitive && key.is_string()) key = Value(PyLower(key.str()));
  return key;
}

Value SortFilter(const Value& v, const CallArgs& args) {
  auto p = BindArgs("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = p[0] && Truthy(*p[0]);
  const bool case_sensitive = p[1] && Truthy(*p[1]);
  List items = Iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) keyed.emplace_back(SortKey(item, p[2], case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? Compare(b.first, a.first, "<") < 0 : Compare(a.first, b.first, "<") < 0;
  });
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::MakeList(std::move(out));
}

Value UniqueFilter(const Value& v, const CallArgs& args) {
  auto p = BindArgs("unique", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = p[0] && Truthy(*p[0]);
  List out, seen;
  for (const Value& item : Iterate(v)) {
    const Value key = SortKey(item, p[1], case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equal(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeList(std::move(out));
}

CallArgs Rest(const CallArgs& args, size_t from) {
  CallArgs rest;
  rest.keyword = args.keyword;
  for (size_t i = from; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  return rest;
}

Value MapFilter(const Value& v, const CallArgs& args) {
  List out;
  const bool by_attribute =
      std::any_of(args.keyword.begin(), args.keyword.end(), [](const auto& kv) { return kv.first == "attribute"; });
  if (by_attribute) {
    auto p = BindArgs("map", args, {"attribute", "default"});
    for (const Value& item : Iterate(v)) {
      Value x = AttributePath(item, ToStr(*p[0]));
      if (x.is_undefined() && p[1]) x = *p[1];
      out.push_back(std::move(x));
    }
    return Value::MakeList(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string()) {
    throw TemplateError("map() needs a filter name or attribute=");
  }
  const std::string filter = args.positional[0].str();
  if (FilterSupport(filter) != Support::kSupported) throw TemplateError("no supported filter named '" + filter + "'");
  const CallArgs rest = Rest(args, 1);
  for (const Value& item : Iterate(v)) out.push_back(ApplyFilter(filter, item, rest));
  return Value::MakeList(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value SelectFilter(const Value& v, const CallArgs& args, bool by_attribute, bool keep_if) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      throw TemplateError("selectattr/rejectattr need an attribute name");
    }
    attribute = args.positional[next++].str();
  }
  std::string test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) throw TemplateError("the test name must be a string");
    test = args.positional[next++].str();
    if (TestSupport(test) != Support::kSupported) throw TemplateError("no supported test named '" + test + "'");
  }
  const CallArgs rest = Rest(args, next);
  List out;
  for (const Value& item : Iterate(v)) {
    const Value x = by_attribute ? AttributePath(item, attribute) : item;
    const bool pass = test.empty() ? Truthy(x) : ApplyTest(test, x, rest);
    if (pass == keep_if) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return CodePointCount(v.str());
    case Value::Kind::kList: return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict().items.size());
    default: throw TemplateError("object of type '" + TypeName(v) + "' has no len()");
  }
}

const Value& OneArg(const std::string& test, const CallArgs& args) {
  auto p = BindArgs(test, args, {"other"});
  if (!p[0]) throw TemplateError("test '" + test + "' needs an argument");
  return args.positional.empty() ? args.keyword[0].second : args.positional[0];
}

}  // namespace

Support FilterSupport(const std::string& name) {
  if (SupportedFilters().count(name)) return Support::kSupported;
  if (OtherJinjaFilters().count(name)) return Support::kNotSupported;
  return Support::kUnknown;
}

Support TestSupport(const std::string& name) {
  if (SupportedTests().count(name)) return Support::kSupported;
  if (name == "escaped" || name == "filter" || name == "test") return Support::kNotSupported;
  return Support::kUnknown;
}

Value ApplyFilter(const std::string& name, const Value& v, const CallArgs& args) {
  auto no_args = [&] { BindArgs(name, args, {}); };
  if (name == "trim") {
    auto p = BindArgs("trim", args, {"chars"});
    std::optional<std::string> chars;
    if (p[0] && !p[0]->is_none()) chars = ToStr(*p[0]);
    return Value(PyStrip(ToStr(v), chars, StripSide::kBoth));
  }
  if (name == "length" || name == "count") {
    no_args();
    return Value(Length(v));
  }
  if (name == "tojson") return TojsonFilter(v, args);
  if (name == "string" || name == "safe") {
    no_args();
    return Value(ToStr(v));
  }
  if (name == "int") return IntFilter(v, args);
  if (name == "float") return FloatFilter(v, args);
  if (name == "upper" || name == "lower" || name == "capitalize" || name == "title") {
    no_args();
    const std::string s = ToStr(v);
    if (name == "upper") return Value(PyUpper(s));
    if (name == "lower") return Value(PyLower(s));
    if (name == "capitalize") return Value(PyCapitalize(s));
    return Value(JinjaTitle(s));
  }
  if (name == "replace") {
    auto p = BindArgs("replace", args, {"old", "new", "count"});
    if (!p[0] || !p[1]) throw TemplateError("replace needs the old and the new string");
    const int64_t count = p[2] && !p[2]->is_none() ? p[2]->as_int() : -1;
    return Value(PyReplace(ToStr(v), ToStr(*p[0]), ToStr(*p[1]), count));
  }
  if (name == "join") return JoinFilter(v, args);
  if (name == "first" || name == "last") {
    no_args();
    if (v.is_undefined() && name == "last") throw TemplateError("'Undefined' object is not reversible");
    const List items = Iterate(v);
    if (items.empty()) return Value::Undefined(std::string("No ") + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "default" || name == "d") {
    auto p = BindArgs(name, args, {"default_value", "boolean"});
    const bool boolean = p[1] && Truthy(*p[1]);
    if (v.is_undefined() || (boolean && !Truthy(v))) return p[0] ? *p[0] : Value("");
    return v;
  }
  if (name == "items") {
    no_args();
    if (v.is_undefined()) return Value::MakeList();
    if (!v.is_dict()) throw TemplateError("Can only get item pairs from a mapping.");
    List out;
    for (const auto& [k, x] : v.dict().items) out.push_back(Value::MakeList({Value(k), x}));
    return Value::MakeList(std::move(out));
  }
  if (name == "list") {
    no_args();
    return Value::MakeList(Iterate(v));
  }
  if (name == "reverse") {
    no_args();
    if (v.is_string()) return SliceOf(v, Value::None(), Value::None(), Value(int64_t{-1}));
    List items = Iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "abs") {
    no_args();
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_int() || v.is_bool()) return v.as_int() < 0 ? Negate(v) : Value(v.as_int());
    if (v.is_undefined()) FailUndefined(v);
    throw TemplateError("bad operand type for abs(): '" + TypeName(v) + "'");
  }
  if (name == "indent") return IndentFilter(v, args);
  if (name == "map") return MapFilter(v, args);
  if (name == "select") return SelectFilter(v, args, false, true);
  if (name == "reject") return SelectFilter(v, args, false, false);
  if (name == "selectattr") return SelectFilter(v, args, true, true);
  if (name == "rejectattr") return SelectFilter(v, args, true, false);
  if (name == "sort") return SortFilter(v, args);
  if (name == "unique") return UniqueFilter(v, args);
  throw TemplateError("no filter named '" + name + "'");
}

bool ApplyTest(const std::string& name, const Value& v, const CallArgs& args) {
  using K = Value::Kind;
  auto no_args = [&] { BindArgs(name, args, {}); };
  if (name == "defined" || name == "undefined") {
    no_args();
    return v.is_undefined() == (name == "undefined");
  }
  if (name == "none") return no_args(), v.is_none();
  if (name == "string") return no_args(), v.is_string();
  if (name == "number") return no_args(), v.is_number();
  if (name == "integer") return no_args(), v.is_int();
  if (name == "float") return no_args(), v.is_float();
  if (name == "boolean") return no_args(), v.is_bool();
  if (name == "true" || name == "false") return no_args(), v.is_bool() && v.as_bool() == (name == "true");
  if (name == "mapping") return no_args(), v.is_dict();
  if (name == "callable") return no_args(), v.is_callable();
  if (name == "iterable" || name == "sequence") {
    no_args();
    const K k = v.kind();
    return k == K::kString || k == K::kList || k == K::kDict || k == K::kUndefined;
  }
  if (name == "lower" || name == "upper") {
    no_args();
    const std::string s = ToStr(v);
    return name == "lower" ? PyIsLower(s) : PyIsUpper(s);
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const Value divisor = name == "divisibleby" ? OneArg(name, args) : Value(int64_t{2});
    if (name != "divisibleby") no_args();
    const Value rem = BinaryOp("%", v, divisor);
    const bool zero = rem.as_float() == 0;
    return name == "odd" ? !zero : zero;
  }
  if (name == "eq" || name == "equalto") return Equal(v, OneArg(name, args));
  if (name == "ne") return !Equal(v, OneArg(name, args));
  if (name == "lt" || name == "lessthan") return Compare(v, OneArg(name, args), "<") < 0;
  if (name == "le") return Compare(v, OneArg(name, args), "<=") <= 0;
  if (name == "gt" || name == "greaterthan") return Compare(v, OneArg(name, args), ">") > 0;
  if (name == "ge") return Compare(v, OneArg(name, args), ">=") >= 0;
  if (name == "in") return Contains(OneArg(name, args), v);
  if (name == "sameas") {
    const Value& other = OneArg(name, args);
    if (v.is_none() || other.is_none()) return v.is_none() && other.is_none();
    if (v.is_bool() || other.is_bool()) return v.is_bool() && other.is_bool() && v.as_bool() == other.as_bool();
    const K k = v.kind();
    if (k == K::kList || k == K::kDict || k == K::kNamespace || k == K::kCallable) return v.SameObject(other);
    throw TemplateError("test 'sameas' is only supported for none, booleans and objects");
  }
  throw TemplateError("no test named '" + name + "'");
}

}  // namespace myriad::jinja
