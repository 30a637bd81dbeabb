// Jinja's operators, filters, tests and the methods of str, dict and list,
// with the semantics of Python Jinja in transformers' environment (an
// ImmutableSandboxedEnvironment whose |tojson is json.dumps with
// ensure_ascii=False): the renderer (data/jinja_render.cc) calls these.
//
// Contract: everything throws TemplateError (no position) where Python
// Jinja raises, and also for what this subset refuses; it never returns a
// result that differs from Python's.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "data/jinja_value.h"

namespace myriad::jinja {

enum class Support { kSupported, kNotSupported, kUnknown };
// kNotSupported: Jinja has it, this subset does not; kUnknown: Jinja has
// no filter (test) of that name either.
Support FilterSupport(const std::string& name);
Support TestSupport(const std::string& name);

Value ApplyFilter(const std::string& name, const Value& operand, const CallArgs& args);
bool ApplyTest(const std::string& name, const Value& operand, const CallArgs& args);

// x.name (Python Jinja tries the attribute first, then the item) and
// x[key] (the item first, then the attribute). A missing one is an
// undefined value carrying Python Jinja's hint; `undefined.x` throws.
Value GetAttr(const Value& object, const std::string& name);
Value GetItem(const Value& object, const Value& key);
// x[start:stop:step] of a list or string; empty bounds are None.
Value SliceOf(const Value& object, const Value& start, const Value& stop, const Value& step);

// + - * / // % ** of Python.
Value BinaryOp(const std::string& op, const Value& a, const Value& b);
Value Negate(const Value& v);
// `item in container`.
bool Contains(const Value& container, const Value& item);

// Binds `args` to the parameters `params` of builtin `function` as Python
// does (positional first, then keywords); a parameter not given is empty.
// Too many arguments, or an unknown or repeated keyword, throws.
std::vector<std::optional<Value>> BindArgs(const std::string& function, const CallArgs& args,
                                           std::initializer_list<const char*> params);

}  // namespace myriad::jinja
