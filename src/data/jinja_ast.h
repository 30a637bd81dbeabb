// The syntax tree of a parsed Jinja template (data/jinja_parse.h builds it,
// data/jinja_render.cc walks it). One node type for expressions and
// statements; which fields a kind uses is written beside the kind.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/jinja_value.h"

namespace myriad::jinja {

struct SourcePos {
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in code points
};

enum class NodeKind {
  // Expressions.
  kConst,      // constant
  kName,       // name
  kListLit,    // kids = items
  kDictLit,    // kids = key0, value0, key1, value1, ...
  kGetAttr,    // kids[0] = object, name = attribute       (x.name)
  kGetItem,    // kids[0] = object, a = key                (x[key], x.0)
  kSlice,      // kids[0] = object, a/b/c = start/stop/step, each may be null
  kCall,       // kids[0] = callee, args
  kFilter,     // kids[0] = operand (null inside a filter block), name, args
  kTest,       // kids[0] = operand, name, args, negated   (x is [not] name)
  kNeg,        // kids[0]
  kPos,        // kids[0]
  kNot,        // kids[0]
  kBinary,     // kids[0], kids[1], name = + - * / // % **
  kConcat,     // kids = parts                             (a ~ b ~ c)
  kAnd,        // kids[0], kids[1]
  kOr,         // kids[0], kids[1]
  kCompare,    // kids = operands, names = operators (== != < > <= >= in notin)
  kCondExpr,   // a = condition, b = value if true, c = value if false (may be null)
  // Statements.
  kText,       // name = the text
  kOutput,     // kids[0] = the expression                 ({{ x }})
  kIf,         // a = condition, body, else_body (an elif is an kIf alone in else_body)
  kFor,        // names = targets, a = iterable, b = filter condition (may be null), body, else_body
  kSet,        // names = targets, a = value               ({% set x = ... %})
  kSetAttr,    // name = namespace variable, names[0] = attribute, a = value
  kSetBlock,   // name = target, kids = filters (kFilter with no operand), body
  kMacro,      // name, names = parameters, kids = defaults (null when none), body
  kFilterBlock,  // kids = filters, body
  kBreak,
  kContinue,
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

// One argument of a call, filter or test; `name` is empty when positional.
struct Arg {
  std::string name;
  NodePtr value;
};

struct Node {
  NodeKind kind;
  SourcePos pos;
  Value constant;
  std::string name;
  std::vector<std::string> names;
  std::vector<NodePtr> kids;
  std::vector<Arg> args;
  NodePtr a, b, c;
  std::vector<NodePtr> body, else_body;
  bool negated = false;
};

}  // namespace myriad::jinja

namespace myriad::jinja {

// A syntax or render error at a place in the template (internal: the API of
// data/jinja.h turns it into a Status "name:line:column: message").
struct PositionedError {
  SourcePos pos;
  std::string message;
};

}  // namespace myriad::jinja
