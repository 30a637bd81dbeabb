#include "data/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "data/jinja_text.h"

namespace myriad::jinja {

const Value* Dict::Find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value Value::MakeList(List items) { return Value(std::make_shared<List>(std::move(items)), 0); }
Value Value::MakeDict(Dict dict) { return Value(std::make_shared<Dict>(std::move(dict)), 0); }
Value Value::MakeNamespace(Dict attributes) {
  return Value(NamespaceHolder{std::make_shared<Dict>(std::move(attributes))}, 0);
}
Value Value::MakeCallable(std::string name, std::function<Value(const CallArgs&)> fn) {
  return Value(std::make_shared<Callable>(Callable{std::move(name), std::move(fn)}), 0);
}

Value::Kind Value::kind() const { return static_cast<Kind>(v_.index()); }

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

const Dict& Value::dict() const {
  if (is_namespace()) return *std::get<NamespaceHolder>(v_).attrs;
  return *std::get<std::shared_ptr<Dict>>(v_);
}

bool Value::SameObject(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kList: return std::get<std::shared_ptr<List>>(v_) == std::get<std::shared_ptr<List>>(other.v_);
    case Kind::kDict: return std::get<std::shared_ptr<Dict>>(v_) == std::get<std::shared_ptr<Dict>>(other.v_);
    case Kind::kNamespace:
      return std::get<NamespaceHolder>(v_).attrs == std::get<NamespaceHolder>(other.v_).attrs;
    case Kind::kCallable:
      return std::get<std::shared_ptr<Callable>>(v_) == std::get<std::shared_ptr<Callable>>(other.v_);
    default: return false;
  }
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
  }
  return "?";
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return false;
    case Value::Kind::kBool: return v.as_bool();
    case Value::Kind::kInt: return v.as_int() != 0;
    case Value::Kind::kFloat: return v.as_float() != 0.0;
    case Value::Kind::kString: return !v.str().empty();
    case Value::Kind::kList: return !v.list().empty();
    case Value::Kind::kDict: return !v.dict().items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kCallable: return true;
  }
  return false;
}

void FailUndefined(const Value& v) { throw TemplateError(v.undefined_hint()); }

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return PyFloatRepr(v.as_float());
    case Value::Kind::kString: return v.str();
    default:
      throw TemplateError("cannot write a " + TypeName(v) +
                          " as text (Python Jinja writes its repr, @huggingface/jinja JSON; use |tojson)");
  }
}

namespace {

void AppendJsonString(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"': out->append("\\\""); continue;
      case '\\': out->append("\\\\"); continue;
      case '\n': out->append("\\n"); continue;
      case '\r': out->append("\\r"); continue;
      case '\t': out->append("\\t"); continue;
      case '\b': out->append("\\b"); continue;
      case '\f': out->append("\\f"); continue;
      default: break;
    }
    char buf[16];
    if (c < 0x20) {
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out->append(buf);
    } else if (c < 0x80 || !ensure_ascii) {
      out->push_back(static_cast<char>(c));
    } else {
      // One whole code point, as \uXXXX (a surrogate pair above U+FFFF).
      size_t j = i + 1;
      while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) ++j;
      for (char32_t cp : DecodeUtf8(std::string_view(s).substr(i, j - i))) {
        if (cp >= 0x10000) {
          const char32_t v = cp - 0x10000;
          std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                        static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
        } else {
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
        }
        out->append(buf);
      }
      i = j - 1;
    }
  }
  out->push_back('"');
}

void AppendJson(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  auto newline = [&](int d) {
    out->push_back('\n');
    for (int k = 0; k < d; ++k) out->append(*o.indent);
  };
  switch (v.kind()) {
    case Value::Kind::kNone: out->append("null"); return;
    case Value::Kind::kBool: out->append(v.as_bool() ? "true" : "false"); return;
    case Value::Kind::kInt: out->append(std::to_string(v.as_int())); return;
    case Value::Kind::kFloat: {
      const double f = v.as_float();
      if (std::isnan(f)) out->append("NaN");
      else if (std::isinf(f)) out->append(f < 0 ? "-Infinity" : "Infinity");
      else out->append(PyFloatRepr(f));
      return;
    }
    case Value::Kind::kString: AppendJsonString(v.str(), o.ensure_ascii, out); return;
    case Value::Kind::kList: {
      const List& items = v.list();
      if (items.empty()) {
        out->append("[]");
        return;
      }
      out->push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(o.item_separator);
        if (o.indent) newline(depth + 1);
        AppendJson(items[i], o, depth + 1, out);
      }
      if (o.indent) newline(depth);
      out->push_back(']');
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict().items) items.push_back(&kv);
      if (items.empty()) {
        out->append("{}");
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out->append(o.item_separator);
        if (o.indent) newline(depth + 1);
        AppendJsonString(items[i]->first, o.ensure_ascii, out);
        out->append(o.key_separator);
        AppendJson(items[i]->second, o, depth + 1, out);
      }
      if (o.indent) newline(depth);
      out->push_back('}');
      return;
    }
    case Value::Kind::kUndefined:
      throw TemplateError("Object of type Undefined is not JSON serializable (" + v.undefined_hint() + ")");
    default:
      throw TemplateError("Object of type " + TypeName(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  AppendJson(v, options, 0, &out);
  return out;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList: {
      const List &x = a.list(), &y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equal(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    default: return a.SameObject(b);
  }
}

int Compare(const Value& a, const Value& b, const char* op) {
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order, Python's string order.
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list()) {
    const List &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw TemplateError(std::string("'") + op + "' not supported between instances of '" + TypeName(a) +
                      "' and '" + TypeName(b) + "'");
}

List Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& kv : v.dict().items) keys.emplace_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t c : DecodeUtf8(v.str())) {
        std::string s;
        AppendUtf8(c, &s);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default: throw TemplateError("'" + TypeName(v) + "' object is not iterable");
  }
}

}  // namespace myriad::jinja
