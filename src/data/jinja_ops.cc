// Operators, attribute and item access, and the methods of str, dict and
// list (declared in data/jinja_builtins.h).
#include <cmath>
#include <limits>

#include "data/jinja_builtins.h"
#include "data/jinja_text.h"

namespace myriad::jinja {

namespace {

// Python Jinja's object_type_repr, as its undefined hints write it.
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  return TypeName(v) + " object";
}

Value MissingAttribute(const Value& object, const std::string& name) {
  return Value::Undefined("'" + ObjectTypeRepr(object) + "' has no attribute '" + name + "'");
}

[[noreturn]] void Refused(const std::string& type, const std::string& method) {
  throw TemplateError(type + "." + method +
                      "() is refused: transformers renders chat templates in Jinja's immutable sandbox");
}

Value Method(const std::string& name, std::function<Value(const CallArgs&)> fn) {
  return Value::MakeCallable(name, std::move(fn));
}

std::optional<std::string> OptionalString(const std::optional<Value>& v, const char* what) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) throw TemplateError(std::string(what) + " must be None or a string, not " + TypeName(*v));
  return v->str();
}

int64_t IntArg(const std::optional<Value>& v, int64_t fallback, const char* what) {
  if (!v || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool()) {
    throw TemplateError(std::string(what) + " must be an integer, not " + TypeName(*v));
  }
  return v->as_int();
}

// str.startswith / str.endswith with a string or a tuple of strings.
bool AffixMatch(const std::string& s, const Value& affix, bool prefix, const char* method) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) {
      throw TemplateError(std::string(method) + " first arg must be str or a tuple of str, not " + TypeName(a));
    }
    const std::string& x = a.str();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.list()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

Value StringMethod(const std::string& s, const std::string& name) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const StripSide side = name == "strip" ? StripSide::kBoth : (name == "lstrip" ? StripSide::kLeft : StripSide::kRight);
    return Method(name, [s, name, side](const CallArgs& a) {
      auto p = BindArgs(name, a, {"chars"});
      return Value(PyStrip(s, OptionalString(p[0], "chars"), side));
    });
  }
  if (name == "split") {
    return Method(name, [s](const CallArgs& a) {
      auto p = BindArgs("split", a, {"sep", "maxsplit"});
      const auto sep = OptionalString(p[0], "sep");
      if (sep && sep->empty()) throw TemplateError("empty separator");
      List parts;
      for (auto& part : PySplit(s, sep, IntArg(p[1], -1, "maxsplit"))) parts.emplace_back(std::move(part));
      return Value::MakeList(std::move(parts));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return Method(name, [s, name](const CallArgs& a) {
      auto p = BindArgs(name, a, {"affix"});
      if (!p[0]) throw TemplateError(name + "() takes at least 1 argument (0 given)");
      return Value(AffixMatch(s, *p[0], name == "startswith", name.c_str()));
    });
  }
  if (name == "replace") {
    return Method(name, [s](const CallArgs& a) {
      auto p = BindArgs("replace", a, {"old", "new", "count"});
      if (!p[0] || !p[1] || !p[0]->is_string() || !p[1]->is_string()) {
        throw TemplateError("replace() takes two strings");
      }
      return Value(PyReplace(s, p[0]->str(), p[1]->str(), IntArg(p[2], -1, "count")));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return Method(name, [s, name](const CallArgs& a) {
      BindArgs(name, a, {});
      if (name == "upper") return Value(PyUpper(s));
      if (name == "lower") return Value(PyLower(s));
      if (name == "title") return Value(PyTitle(s));
      return Value(PyCapitalize(s));
    });
  }
  if (name == "join") {
    return Method(name, [s](const CallArgs& a) {
      auto p = BindArgs("join", a, {"iterable"});
      if (!p[0]) throw TemplateError("join() takes exactly one argument (0 given)");
      std::string out;
      bool first = true;
      for (const Value& item : Iterate(*p[0])) {
        if (!item.is_string()) throw TemplateError("sequence item: expected str instance, " + TypeName(item) + " found");
        if (!first) out += s;
        out += item.str();
        first = false;
      }
      return Value(std::move(out));
    });
  }
  if (name == "find" || name == "count") {
    return Method(name, [s, name](const CallArgs& a) {
      auto p = BindArgs(name, a, {"sub"});
      if (!p[0] || !p[0]->is_string()) throw TemplateError(name + "() takes a string");
      const std::string& sub = p[0]->str();
      if (name == "find") {
        const size_t at = s.find(sub);
        return Value(at == std::string::npos ? int64_t{-1} : CodePointCount(std::string_view(s).substr(0, at)));
      }
      if (sub.empty()) return Value(CodePointCount(s) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value(n);
    });
  }
  static const char* kOtherStrMethods[] = {
      "casefold", "center", "encode", "expandtabs", "format", "format_map", "index", "isalnum", "isalpha",
      "isascii", "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace",
      "istitle", "isupper", "ljust", "maketrans", "partition", "removeprefix", "removesuffix", "rfind",
      "rindex", "rjust", "rpartition", "rsplit", "splitlines", "swapcase", "translate", "zfill"};
  for (const char* m : kOtherStrMethods) {
    if (name == m) {
      return Method(name, [name](const CallArgs&) -> Value {
        throw TemplateError("str." + name + "() is not supported");
      });
    }
  }
  return Value::Undefined("'str object' has no attribute '" + name + "'");
}

// A dict's methods, or nothing when `name` is not one.
std::optional<Value> DictMethod(const Value& d, const std::string& name) {
  if (name == "get") {
    return Method(name, [d](const CallArgs& a) {
      auto p = BindArgs("get", a, {"key", "default"});
      if (!p[0]) throw TemplateError("get expected at least 1 argument, got 0");
      if (p[0]->is_string()) {
        if (const Value* v = d.dict().Find(p[0]->str())) return *v;
      }
      return p[1] ? *p[1] : Value::None();
    });
  }
  if (name == "items" || name == "keys" || name == "values") {
    return Method(name, [d, name](const CallArgs& a) {
      BindArgs(name, a, {});
      List out;
      for (const auto& [k, v] : d.dict().items) {
        if (name == "items") out.push_back(Value::MakeList({Value(k), v}));
        else if (name == "keys") out.emplace_back(k);
        else out.push_back(v);
      }
      return Value::MakeList(std::move(out));
    });
  }
  if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update") {
    return Method(name, [name](const CallArgs&) -> Value { Refused("dict", name); });
  }
  if (name == "copy" || name == "fromkeys") {
    return Method(name, [name](const CallArgs&) -> Value { throw TemplateError("dict." + name + "() is not supported"); });
  }
  return std::nullopt;
}

std::optional<Value> ListMethod(const std::string& name) {
  if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
      name == "reverse" || name == "sort" || name == "clear") {
    return Method(name, [name](const CallArgs&) -> Value { Refused("list", name); });
  }
  if (name == "index" || name == "count" || name == "copy") {
    return Method(name, [name](const CallArgs&) -> Value { throw TemplateError("list." + name + "() is not supported"); });
  }
  return std::nullopt;
}

// CPython's PySlice_AdjustIndices: the indices a slice visits.
std::vector<int64_t> SliceIndices(int64_t length, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto bound = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) {
      throw TemplateError(std::string("slice ") + what + " must be an integer or None, not " + TypeName(v));
    }
    return v.as_int();
  };
  const int64_t step = bound(step_v, "step").value_or(1);
  if (step == 0) throw TemplateError("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> v, int64_t lower, int64_t upper, int64_t fallback) {
    if (!v) return fallback;
    int64_t x = *v;
    if (x < 0) {
      x += length;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  const int64_t lower = step < 0 ? -1 : 0;
  const int64_t upper = step < 0 ? length - 1 : length;
  const int64_t start = adjust(bound(start_v, "start"), lower, upper, step < 0 ? upper : lower);
  const int64_t stop = adjust(bound(stop_v, "stop"), lower, upper, step < 0 ? lower : upper);
  std::vector<int64_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
  return out;
}

void CheckOverflow(bool overflow) {
  if (overflow) throw TemplateError("integer overflow (Python's integers are unbounded, these are 64-bit)");
}

[[noreturn]] void BadOperands(const std::string& op, const Value& a, const Value& b) {
  throw TemplateError("unsupported operand type(s) for " + op + ": '" + TypeName(a) + "' and '" + TypeName(b) + "'");
}

Value Repeat(const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    if (static_cast<double>(seq.str().size()) * static_cast<double>(times) > 1e8) {
      throw TemplateError("string repetition is too large");
    }
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value(std::move(out));
  }
  if (static_cast<double>(seq.list().size()) * static_cast<double>(times) > 1e7) {
    throw TemplateError("list repetition is too large");
  }
  List out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return Value::MakeList(std::move(out));
}

double FloorMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// CPython's float floor division (float_floor_div).
double FloorDiv(double x, double y) {
  double mod = std::fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, x / y);
  double floordiv = std::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return floordiv;
}

}  // namespace

std::vector<std::optional<Value>> BindArgs(const std::string& function, const CallArgs& args,
                                           std::initializer_list<const char*> params) {
  std::vector<std::optional<Value>> out(params.size());
  if (args.positional.size() > params.size()) {
    throw TemplateError(function + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
                        std::to_string(args.positional.size()) + " given)");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (const char* p : params) {
      if (key == p) break;
      ++i;
    }
    if (i == params.size()) throw TemplateError(function + "() got an unexpected keyword argument '" + key + "'");
    if (out[i]) throw TemplateError(function + "() got multiple values for argument '" + key + "'");
    out[i] = value;
  }
  return out;
}

Value GetAttr(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined: FailUndefined(object);
    case Value::Kind::kString: return StringMethod(object.str(), name);
    case Value::Kind::kDict: {
      if (auto m = DictMethod(object, name)) return *m;
      if (const Value* v = object.dict().Find(name)) return *v;
      return MissingAttribute(object, name);
    }
    case Value::Kind::kList:
      if (auto m = ListMethod(name)) return *m;
      return MissingAttribute(object, name);
    case Value::Kind::kNamespace:
      if (const Value* v = object.dict().Find(name)) return *v;
      return MissingAttribute(object, name);
    default: return MissingAttribute(object, name);
  }
}

Value GetItem(const Value& object, const Value& key) {
  if (object.is_undefined()) FailUndefined(object);
  if (key.is_undefined()) FailUndefined(key);
  if (object.is_dict() && key.is_string()) {
    if (const Value* v = object.dict().Find(key.str())) return *v;
  }
  if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t n = object.is_list() ? static_cast<int64_t>(object.list().size()) : CodePointCount(object.str());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (object.is_list()) return object.list()[static_cast<size_t>(i)];
      std::string ch;
      AppendUtf8(DecodeUtf8(object.str())[static_cast<size_t>(i)], &ch);
      return Value(std::move(ch));
    }
  }
  if (key.is_string()) return GetAttr(object, key.str());
  return Value::Undefined(ObjectTypeRepr(object) + " has no element " + ToStr(key));
}

Value SliceOf(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) FailUndefined(object);
  if (object.is_list()) {
    const List& items = object.list();
    List out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(items.size()), start, stop, step)) {
      out.push_back(items[static_cast<size_t>(i)]);
    }
    return Value::MakeList(std::move(out));
  }
  if (object.is_string()) {
    const std::vector<char32_t> cps = DecodeUtf8(object.str());
    std::string out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(cps.size()), start, stop, step)) {
      AppendUtf8(cps[static_cast<size_t>(i)], &out);
    }
    return Value(std::move(out));
  }
  throw TemplateError("cannot slice a " + TypeName(object));
}

Value Negate(const Value& v) {
  if (v.is_undefined()) FailUndefined(v);
  if (v.is_float()) return Value(-v.as_float());
  if (v.is_int() || v.is_bool()) {
    int64_t r = 0;
    CheckOverflow(__builtin_sub_overflow(int64_t{0}, v.as_int(), &r));
    return Value(r);
  }
  throw TemplateError("bad operand type for unary -: '" + TypeName(v) + "'");
}

Value BinaryOp(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  if (op == "+") {
    if (floats) return Value(a.as_float() + b.as_float());
    int64_t r = 0;
    if (numbers) {
      CheckOverflow(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if (a.is_string() && b.is_string()) return Value(a.str() + b.str());
    if (a.is_list() && b.is_list()) {
      List out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return Value::MakeList(std::move(out));
    }
    if (a.is_string() || b.is_string()) {
      throw TemplateError("can only concatenate str (not \"" + TypeName(a.is_string() ? b : a) +
                          "\") to str (hint: use ~ or |string)");
    }
    BadOperands(op, a, b);
  }
  if (op == "-") {
    if (floats) return Value(a.as_float() - b.as_float());
    int64_t r = 0;
    if (numbers) {
      CheckOverflow(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    BadOperands(op, a, b);
  }
  if (op == "*") {
    if (floats) return Value(a.as_float() * b.as_float());
    int64_t r = 0;
    if (numbers) {
      CheckOverflow(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
      return Value(r);
    }
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return Repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return Repeat(b, a.as_int());
    BadOperands(op, a, b);
  }
  if (op == "/" || op == "//" || op == "%") {
    if (!numbers) {
      if (op == "%" && a.is_string()) throw TemplateError("string formatting with % is not supported");
      BadOperands(op, a, b);
    }
    if (b.as_float() == 0) {
      throw TemplateError(op == "%" ? "integer modulo by zero" : "division by zero");
    }
    if (op == "/") return Value(a.as_float() / b.as_float());
    if (floats) {
      const double x = a.as_float(), y = b.as_float();
      if (op == "%") return Value(FloorMod(x, y));
      return Value(FloorDiv(x, y));
    }
    const int64_t x = a.as_int(), y = b.as_int();
    if (x == std::numeric_limits<int64_t>::min() && y == -1) CheckOverflow(true);
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    return Value(op == "%" ? m : q);
  }
  if (op == "**") {
    if (!numbers) BadOperands(op, a, b);
    if (!floats && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {
        if (e & 1) CheckOverflow(__builtin_mul_overflow(result, base, &result));
        if (e > 1) CheckOverflow(__builtin_mul_overflow(base, base, &base));
      }
      return Value(result);
    }
    if (a.as_float() == 0 && b.as_float() < 0) throw TemplateError("0.0 cannot be raised to a negative power");
    const double r = std::pow(a.as_float(), b.as_float());
    if (std::isnan(r)) throw TemplateError("a negative number cannot be raised to a fractional power");
    return Value(r);
  }
  throw TemplateError("unknown operator " + op);
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw TemplateError("'in <string>' requires string as left operand, not " + TypeName(item));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.list()) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    default: throw TemplateError("argument of type '" + TypeName(container) + "' is not iterable");
  }
}

}  // namespace myriad::jinja
