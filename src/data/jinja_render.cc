// The renderer: walks the tree of data/jinja_parse.h with Python Jinja's
// scoping (a for loop's body gets a fresh scope each iteration, so a
// {% set %} in it neither outlives the iteration nor leaks out; if blocks
// have no scope of their own; a macro sees the scope it was defined in).
//
// Errors travel as exceptions inside this file (TemplateError from value
// operations, PositionedError once a node's position is known) and leave it
// as a Status.
#include <chrono>
#include <unordered_map>

#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "data/jinja_builtins.h"
#include "data/jinja_parse.h"
#include "data/jinja_text.h"

namespace myriad::jinja {

namespace {

constexpr int kMaxMacroDepth = 64;
constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox refuses longer ranges

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* Find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

ScopePtr ChildOf(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow { kNormal, kBreak, kContinue };

std::string Strftime(const std::tm& tm, const std::string& format) {
  if (format.empty()) return "";
  std::string buf(format.size() * 4 + 64, '\0');
  for (int attempt = 0; attempt < 4; ++attempt) {
    const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
    if (n > 0) return buf.substr(0, n);
    buf.resize(buf.size() * 4);
  }
  return "";
}

class Renderer {
 public:
  explicit Renderer(const RenderOptions& options) : options_(options) {}

  ScopePtr Globals() {
    auto g = std::make_shared<Scope>();
    g->vars["range"] = Value::MakeCallable("range", [](const CallArgs& a) { return Range(a); });
    g->vars["dict"] = Value::MakeCallable("dict", [](const CallArgs& a) {
      if (!a.positional.empty()) throw TemplateError("dict() with positional arguments is not supported");
      Dict d;
      for (const auto& [k, v] : a.keyword) d.Set(k, v);
      return Value::MakeDict(std::move(d));
    });
    g->vars["namespace"] = Value::MakeCallable("namespace", [](const CallArgs& a) {
      Dict attrs;
      if (a.positional.size() > 1) throw TemplateError("namespace() takes at most one positional argument");
      if (!a.positional.empty()) {
        if (!a.positional[0].is_dict()) throw TemplateError("namespace() takes a mapping");
        attrs = a.positional[0].dict();
      }
      for (const auto& [k, v] : a.keyword) attrs.Set(k, v);
      return Value::MakeNamespace(std::move(attrs));
    });
    g->vars["raise_exception"] = Value::MakeCallable("raise_exception", [](const CallArgs& a) -> Value {
      auto p = BindArgs("raise_exception", a, {"message"});
      throw TemplateError("raise_exception: " + (p[0] ? ToStr(*p[0]) : std::string()));
    });
    g->vars["strftime_now"] = Value::MakeCallable("strftime_now", [this](const CallArgs& a) {
      auto p = BindArgs("strftime_now", a, {"format"});
      if (!p[0] || !p[0]->is_string()) throw TemplateError("strftime_now() takes a format string");
      std::tm tm{};
      if (options_.now) {
        tm = options_.now();
      } else {
        const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
        localtime_r(&t, &tm);
      }
      return Value(Strftime(tm, p[0]->str()));
    });
    return g;
  }

  Flow Exec(const std::vector<NodePtr>& body, const ScopePtr& scope, std::string* out) {
    for (const NodePtr& n : body) {
      const Flow f = ExecOne(*n, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  static Value Range(const CallArgs& a) {
    auto p = BindArgs("range", a, {"start", "stop", "step"});
    auto as_int = [](const std::optional<Value>& v) {
      if (!v->is_int() && !v->is_bool()) {
        throw TemplateError("range() takes integers, not " + TypeName(*v));
      }
      return v->as_int();
    };
    if (!p[0]) throw TemplateError("range expected at least 1 argument, got 0");
    int64_t start = 0, stop, step = 1;
    if (!p[1]) {
      stop = as_int(p[0]);
    } else {
      start = as_int(p[0]);
      stop = as_int(p[1]);
      if (p[2]) step = as_int(p[2]);
    }
    if (step == 0) throw TemplateError("range() arg 3 must not be zero");
    const double count = std::max(0.0, std::ceil((static_cast<double>(stop) - start) / step));
    if (count > kMaxRange) throw TemplateError("range too big: the sandbox allows 100000 items");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
    return Value::MakeList(std::move(out));
  }

  [[noreturn]] static void At(const Node& n, const TemplateError& e) {
    throw PositionedError{n.pos, e.what()};
  }

  void Assign(const Node& n, const std::vector<std::string>& targets, const Value& value, Scope* scope) {
    if (targets.size() == 1) {
      scope->vars[targets[0]] = value;
      return;
    }
    List items;
    try {
      items = Iterate(value);
    } catch (const TemplateError& e) {
      At(n, TemplateError(std::string("cannot unpack: ") + e.what()));
    }
    if (items.size() != targets.size()) {
      At(n, TemplateError((items.size() > targets.size() ? "too many" : "not enough") +
                          std::string(" values to unpack (expected ") + std::to_string(targets.size()) +
                          ", got " + std::to_string(items.size()) + ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scope->vars[targets[i]] = items[i];
  }

  Value ApplyFilters(const std::vector<NodePtr>& filters, Value v, const ScopePtr& scope) {
    for (const NodePtr& f : filters) {
      const CallArgs args = EvalArgs(f->args, scope);
      try {
        v = ApplyFilter(f->name, v, args);
      } catch (const TemplateError& e) {
        At(*f, e);
      }
    }
    return v;
  }

  Flow ExecOne(const Node& n, const ScopePtr& scope, std::string* out) {
    switch (n.kind) {
      case NodeKind::kText: out->append(n.name); return Flow::kNormal;
      case NodeKind::kOutput: {
        const Value v = Eval(*n.kids[0], scope);
        try {
          out->append(ToStr(v));
        } catch (const TemplateError& e) {
          At(*n.kids[0], e);
        }
        return Flow::kNormal;
      }
      case NodeKind::kIf:
        return Exec(Truthy(Eval(*n.a, scope)) ? n.body : n.else_body, scope, out);
      case NodeKind::kFor: return ExecFor(n, scope, out);
      case NodeKind::kSet: Assign(n, n.names, Eval(*n.a, scope), scope.get()); return Flow::kNormal;
      case NodeKind::kSetAttr: {
        const Value* ns = scope->Find(n.name);
        if (ns == nullptr || !ns->is_namespace()) {
          throw PositionedError{n.pos, "cannot set attribute '" + n.names[0] + "' of " +
                                           (ns == nullptr ? "undefined '" + n.name + "'" : "a " + TypeName(*ns)) +
                                           ": only a namespace() has assignable attributes"};
        }
        ns->mutable_namespace().Set(n.names[0], Eval(*n.a, scope));
        return Flow::kNormal;
      }
      case NodeKind::kSetBlock: {
        std::string text;
        Exec(n.body, ChildOf(scope), &text);
        scope->vars[n.name] = ApplyFilters(n.kids, Value(std::move(text)), scope);
        return Flow::kNormal;
      }
      case NodeKind::kFilterBlock: {
        std::string text;
        Exec(n.body, ChildOf(scope), &text);
        const Value v = ApplyFilters(n.kids, Value(std::move(text)), scope);
        try {
          out->append(ToStr(v));
        } catch (const TemplateError& e) {
          At(n, e);
        }
        return Flow::kNormal;
      }
      case NodeKind::kMacro: scope->vars[n.name] = MakeMacro(n, scope); return Flow::kNormal;
      case NodeKind::kBreak: return Flow::kBreak;
      case NodeKind::kContinue: return Flow::kContinue;
      default: throw PositionedError{n.pos, "internal error: an expression where a statement belongs"};
    }
  }

  static Value LoopObject(const List& items, size_t i, const Value& cycle) {
    const auto n = static_cast<int64_t>(items.size());
    const auto k = static_cast<int64_t>(i);
    Dict d;
    d.items = {{"index", Value(k + 1)},          {"index0", Value(k)},
               {"revindex", Value(n - k)},       {"revindex0", Value(n - k - 1)},
               {"first", Value(k == 0)},         {"last", Value(k == n - 1)},
               {"length", Value(n)},             {"depth", Value(int64_t{1})},
               {"depth0", Value(int64_t{0})},    {"cycle", cycle}};
    if (i > 0) d.items.emplace_back("previtem", items[i - 1]);
    if (i + 1 < items.size()) d.items.emplace_back("nextitem", items[i + 1]);
    return Value::MakeDict(std::move(d));
  }

  Flow ExecFor(const Node& n, const ScopePtr& scope, std::string* out) {
    const Value iterable = Eval(*n.a, scope);
    List items;
    try {
      items = Iterate(iterable);
    } catch (const TemplateError& e) {
      At(*n.a, e);
    }
    if (n.b) {
      List kept;
      for (const Value& item : items) {
        ScopePtr s = ChildOf(scope);
        Assign(n, n.names, item, s.get());
        if (Truthy(Eval(*n.b, s))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Exec(n.else_body, ChildOf(scope), out);
      return Flow::kNormal;
    }
    for (size_t i = 0; i < items.size(); ++i) {
      ScopePtr s = ChildOf(scope);
      const Value cycle = Value::MakeCallable("loop.cycle", [i](const CallArgs& a) {
        if (a.positional.empty()) throw TemplateError("no items for cycling given");
        return a.positional[i % a.positional.size()];
      });
      s->vars["loop"] = LoopObject(items, i, cycle);
      Assign(n, n.names, items[i], s.get());
      if (Exec(n.body, s, out) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Node& n, const ScopePtr& defining_scope) {
    const Node* node = &n;
    // The macro keeps its defining scope alive, and that scope holds the
    // macro: a cycle that lives until the render ends, like the scope.
    std::weak_ptr<Scope> weak = defining_scope;
    return Value::MakeCallable("macro '" + n.name + "'", [this, node, weak](const CallArgs& a) {
      ScopePtr parent = weak.lock();
      if (!parent) throw TemplateError("macro '" + node->name + "' called after its scope ended");
      if (a.positional.size() > node->names.size()) {
        throw TemplateError("macro '" + node->name + "' takes not more than " + std::to_string(node->names.size()) +
                            " argument(s)");
      }
      ScopePtr s = ChildOf(parent);
      std::vector<bool> given(node->names.size(), false);
      for (size_t i = 0; i < a.positional.size(); ++i) {
        s->vars[node->names[i]] = a.positional[i];
        given[i] = true;
      }
      for (const auto& [k, v] : a.keyword) {
        size_t i = 0;
        while (i < node->names.size() && node->names[i] != k) ++i;
        if (i == node->names.size()) throw TemplateError("macro '" + node->name + "' takes no keyword argument '" + k + "'");
        if (given[i]) throw TemplateError("macro '" + node->name + "' got multiple values for argument '" + k + "'");
        s->vars[k] = v;
        given[i] = true;
      }
      for (size_t i = 0; i < node->names.size(); ++i) {
        if (given[i]) continue;
        s->vars[node->names[i]] = node->kids[i] ? Eval(*node->kids[i], s)
                                                : Value::Undefined("parameter '" + node->names[i] + "' was not provided");
      }
      if (++macro_depth_ > kMaxMacroDepth) {
        --macro_depth_;
        throw TemplateError("macro calls nested deeper than 64");
      }
      std::string text;
      try {
        Exec(node->body, s, &text);
      } catch (...) {
        --macro_depth_;
        throw;
      }
      --macro_depth_;
      return Value(std::move(text));
    });
  }

  CallArgs EvalArgs(const std::vector<Arg>& args, const ScopePtr& scope) {
    CallArgs out;
    for (const Arg& a : args) {
      if (a.name.empty()) out.positional.push_back(Eval(*a.value, scope));
      else out.keyword.emplace_back(a.name, Eval(*a.value, scope));
    }
    return out;
  }

  bool CompareOp(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return Equal(l, r);
    if (op == "!=") return !Equal(l, r);
    if (op == "in") return Contains(r, l);
    if (op == "notin") return !Contains(r, l);
    const int c = Compare(l, r, op.c_str());
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  Value Eval(const Node& n, const ScopePtr& scope) {
    try {
      return EvalInner(n, scope);
    } catch (const TemplateError& e) {
      At(n, e);
    }
  }

  Value EvalInner(const Node& n, const ScopePtr& scope) {
    switch (n.kind) {
      case NodeKind::kConst: return n.constant;
      case NodeKind::kName: {
        const Value* v = scope->Find(n.name);
        return v ? *v : Value::Undefined("'" + n.name + "' is undefined");
      }
      case NodeKind::kListLit: {
        List items;
        for (const NodePtr& k : n.kids) items.push_back(Eval(*k, scope));
        return Value::MakeList(std::move(items));
      }
      case NodeKind::kDictLit: {
        Dict d;
        for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
          const Value key = Eval(*n.kids[i], scope);
          if (!key.is_string()) {
            throw PositionedError{n.kids[i]->pos, "dict keys must be strings, not " + TypeName(key)};
          }
          d.Set(key.str(), Eval(*n.kids[i + 1], scope));
        }
        return Value::MakeDict(std::move(d));
      }
      case NodeKind::kGetAttr: return GetAttr(Eval(*n.kids[0], scope), n.name);
      case NodeKind::kGetItem: {
        const Value object = Eval(*n.kids[0], scope);
        return GetItem(object, Eval(*n.a, scope));
      }
      case NodeKind::kSlice: {
        const Value object = Eval(*n.kids[0], scope);
        auto bound = [&](const NodePtr& p) { return p ? Eval(*p, scope) : Value::None(); };
        const Value start = bound(n.a), stop = bound(n.b), step = bound(n.c);
        return SliceOf(object, start, stop, step);
      }
      case NodeKind::kCall: {
        const Value callee = Eval(*n.kids[0], scope);
        const CallArgs args = EvalArgs(n.args, scope);
        if (callee.is_undefined()) FailUndefined(callee);
        if (!callee.is_callable()) throw TemplateError("'" + TypeName(callee) + "' object is not callable");
        return callee.callable().fn(args);
      }
      case NodeKind::kFilter: {
        const Value operand = Eval(*n.kids[0], scope);
        return ApplyFilter(n.name, operand, EvalArgs(n.args, scope));
      }
      case NodeKind::kTest: {
        const Value operand = Eval(*n.kids[0], scope);
        return Value(ApplyTest(n.name, operand, EvalArgs(n.args, scope)) != n.negated);
      }
      case NodeKind::kNeg: return Negate(Eval(*n.kids[0], scope));
      case NodeKind::kPos: {
        const Value v = Eval(*n.kids[0], scope);
        if (v.is_undefined()) FailUndefined(v);
        if (!v.is_number()) throw TemplateError("bad operand type for unary +: '" + TypeName(v) + "'");
        return v.is_float() ? v : Value(v.as_int());
      }
      case NodeKind::kNot: return Value(!Truthy(Eval(*n.kids[0], scope)));
      case NodeKind::kBinary: {
        const Value l = Eval(*n.kids[0], scope);
        const Value r = Eval(*n.kids[1], scope);
        return BinaryOp(n.name, l, r);
      }
      case NodeKind::kConcat: {
        std::string s;
        for (const NodePtr& k : n.kids) {
          const Value v = Eval(*k, scope);
          try {
            s += ToStr(v);
          } catch (const TemplateError& e) {
            At(*k, e);
          }
        }
        return Value(std::move(s));
      }
      case NodeKind::kAnd: {
        Value l = Eval(*n.kids[0], scope);
        return Truthy(l) ? Eval(*n.kids[1], scope) : l;
      }
      case NodeKind::kOr: {
        Value l = Eval(*n.kids[0], scope);
        return Truthy(l) ? l : Eval(*n.kids[1], scope);
      }
      case NodeKind::kCompare: {
        Value left = Eval(*n.kids[0], scope);
        for (size_t i = 0; i < n.names.size(); ++i) {
          Value right = Eval(*n.kids[i + 1], scope);
          if (!CompareOp(n.names[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case NodeKind::kCondExpr:
        if (Truthy(Eval(*n.a, scope))) return Eval(*n.b, scope);
        if (n.c) return Eval(*n.c, scope);
        return Value::Undefined("the inline if-expression on line " + std::to_string(n.pos.line) +
                                " evaluated to false and no else section was defined.");
      default: throw PositionedError{n.pos, "internal error: a statement where an expression belongs"};
    }
  }

  const RenderOptions& options_;
  int macro_depth_ = 0;
};

Status ToStatus(const std::string& name, const PositionedError& e) {
  // One line: a message that quotes text with newlines gets them escaped.
  std::string message;
  for (char c : e.message) {
    if (c == '\n') message += "\\n";
    else if (c == '\r') message += "\\r";
    else message.push_back(c);
  }
  return Status::Error(name + ":" + std::to_string(e.pos.line) + ":" + std::to_string(e.pos.column) + ": " + message);
}

}  // namespace

Result<Template> Template::Parse(std::string_view source, const std::string& name) {
  try {
    auto body = std::make_shared<std::vector<NodePtr>>(ParseTemplate(source));
    return Template(name, std::move(body));
  } catch (const PositionedError& e) {
    return ToStatus(name, e);
  }
}

Result<std::string> Template::Render(const Dict& variables, const RenderOptions& options) const {
  Renderer renderer(options);
  ScopePtr root = ChildOf(renderer.Globals());
  for (const auto& [k, v] : variables.items) root->vars[k] = v;
  std::string out;
  try {
    renderer.Exec(*body_, root, &out);
  } catch (const PositionedError& e) {
    return ToStatus(name_, e);
  } catch (const TemplateError& e) {
    return ToStatus(name_, PositionedError{SourcePos{}, e.what()});
  }
  return out;
}

namespace {
template <typename J>
Result<Dict> VariablesFromJson(const J& j) {
  if (!j.is_object()) return Status::Error("template variables must be a JSON object, got " + std::string(j.type_name()));
  Value v = FromJson(j);
  return v.dict();
}
}  // namespace

Result<std::string> Template::Render(const nlohmann::ordered_json& variables, const RenderOptions& options) const {
  ASSIGN_OR_RETURN(Dict d, VariablesFromJson(variables));
  return Render(d, options);
}

Result<std::string> Template::Render(const nlohmann::json& variables, const RenderOptions& options) const {
  ASSIGN_OR_RETURN(Dict d, VariablesFromJson(variables));
  return Render(d, options);
}

}  // namespace myriad::jinja
