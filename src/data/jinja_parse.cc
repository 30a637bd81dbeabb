#include "data/jinja_parse.h"

#include <algorithm>

#include "data/jinja_builtins.h"
#include "data/jinja_lex.h"
#include "data/jinja_text.h"

namespace myriad::jinja {

namespace {

// Recursive descent over the tokens, with Python Jinja's grammar and
// operator precedence (loosest first): conditional expression, or, and,
// not, comparisons and `in`, + -, ~, * / // %, **, unary - +, then
// postfix (.attr [key] (call)), filters and tests.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  std::vector<NodePtr> ParseAll() {
    std::string end;
    return ParseBody({}, &end, SourcePos{}, "");
  }

 private:
  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool IsOp(const char* op) const { return Cur().type == Tok::kOp && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().type == Tok::kName && Cur().text == name; }
  const Token& Next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }

  [[noreturn]] void Fail(const SourcePos& pos, std::string message) const {
    throw PositionedError{pos, std::move(message)};
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Tok::kBlockEnd: return "'%}'";
      case Tok::kVarEnd: return "'}}'";
      case Tok::kEof: return "the end of the template";
      case Tok::kString: return "string " + EscapeForMessage(t.text, 30);
      case Tok::kText: return "text " + EscapeForMessage(t.text, 30);
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void Unexpected(const char* wanted) const {
    Fail(Cur().pos, std::string("expected ") + wanted + ", got " + Describe(Cur()));
  }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Unexpected((std::string("'") + op + "'").c_str());
    Next();
  }
  void ExpectBlockEnd() {
    if (Cur().type != Tok::kBlockEnd) Unexpected("'%}'");
    Next();
  }
  std::string ExpectName(const char* what) {
    if (Cur().type != Tok::kName) Unexpected(what);
    return Next().text;
  }

  // Bounds the recursion (the parser's and then the renderer's), so that a
  // hostile template fails with a message instead of overflowing the stack.
  struct Nesting {
    static constexpr int kMax = 200;
    explicit Nesting(Parser* p) : p_(p) {
      if (++p_->depth_ > kMax) p_->Fail(p_->Cur().pos, "expressions or blocks nested deeper than 200");
    }
    ~Nesting() { --p_->depth_; }
    Parser* p_;
  };

  NodePtr Make(NodeKind kind, SourcePos pos) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->pos = pos;
    return n;
  }

  // Statements up to one of `end_tags` (consumed with its name; the caller
  // reads the rest of that tag). `which` says which one ended the body.
  std::vector<NodePtr> ParseBody(const std::vector<std::string>& end_tags, std::string* which,
                                 SourcePos open_pos, const char* open_tag) {
    Nesting guard(this);
    std::vector<NodePtr> body;
    for (;;) {
      const Token& t = Cur();
      switch (t.type) {
        case Tok::kText: {
          auto n = Make(NodeKind::kText, t.pos);
          n->name = t.text;
          body.push_back(std::move(n));
          Next();
          break;
        }
        case Tok::kVarBegin: {
          auto n = Make(NodeKind::kOutput, t.pos);
          Next();
          n->kids.push_back(ParseTuple());
          if (Cur().type != Tok::kVarEnd) Unexpected("'}}'");
          Next();
          body.push_back(std::move(n));
          break;
        }
        case Tok::kBlockBegin: {
          const Token& name = Peek();
          if (name.type == Tok::kName &&
              std::find(end_tags.begin(), end_tags.end(), name.text) != end_tags.end()) {
            *which = name.text;
            Next();
            Next();
            return body;
          }
          ParseStatement(&body);
          break;
        }
        case Tok::kEof:
          if (!end_tags.empty()) {
            std::string wanted;
            for (const auto& e : end_tags) wanted += (wanted.empty() ? "" : " or ") + ("{% " + e + " %}");
            Fail(open_pos, std::string("{% ") + open_tag + " %} is not closed (expected " + wanted + ")");
          }
          return body;
        default: Unexpected("text, {{ or {%");
      }
    }
  }

  void ParseStatement(std::vector<NodePtr>* out) {
    const SourcePos pos = Next().pos;  // {%
    if (Cur().type != Tok::kName) Unexpected("a tag name");
    const std::string tag = Next().text;
    std::string end;
    if (tag == "if") {
      out->push_back(ParseIf(pos));
    } else if (tag == "for") {
      out->push_back(ParseFor(pos));
    } else if (tag == "set") {
      out->push_back(ParseSet(pos));
    } else if (tag == "macro") {
      out->push_back(ParseMacro(pos));
    } else if (tag == "filter") {
      auto n = Make(NodeKind::kFilterBlock, pos);
      ParseFilterChain(&n->kids, /*leading_pipe=*/false);
      ExpectBlockEnd();
      n->body = ParseBody({"endfilter"}, &end, pos, "filter");
      ExpectBlockEnd();
      out->push_back(std::move(n));
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) Fail(pos, "{% " + tag + " %} outside a for loop");
      ExpectBlockEnd();
      out->push_back(Make(tag == "break" ? NodeKind::kBreak : NodeKind::kContinue, pos));
    } else if (tag == "generation") {
      // transformers' {% generation %} marks the assistant's text for
      // training masks; it renders its body unchanged.
      // Like Python's (a call block), its body has a scope of its own.
      ExpectBlockEnd();
      auto n = Make(NodeKind::kFilterBlock, pos);
      const int saved_loops = loop_depth_;
      loop_depth_ = 0;
      n->body = ParseBody({"endgeneration"}, &end, pos, "generation");
      loop_depth_ = saved_loops;
      ExpectBlockEnd();
      out->push_back(std::move(n));
    } else if (tag == "call" || tag == "include" || tag == "import" || tag == "from" ||
               tag == "extends" || tag == "block" || tag == "with" || tag == "autoescape" ||
               tag == "do" || tag == "trans") {
      Fail(pos, "{% " + tag + " %} is not supported");
    } else if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else") {
      Fail(pos, "unexpected {% " + tag + " %}");
    } else {
      Fail(pos, "unknown tag '" + tag + "'");
    }
  }

  NodePtr ParseIf(SourcePos pos) {
    auto n = Make(NodeKind::kIf, pos);
    n->a = ParseTuple();
    ExpectBlockEnd();
    std::string end;
    n->body = ParseBody({"elif", "else", "endif"}, &end, pos, "if");
    if (end == "elif") {
      n->else_body.push_back(ParseIf(t_[i_ - 2].pos));
    } else if (end == "else") {
      ExpectBlockEnd();
      n->else_body = ParseBody({"endif"}, &end, pos, "if");
      ExpectBlockEnd();
    } else {
      ExpectBlockEnd();
    }
    return n;
  }

  // Names of an assignment target: `x`, `a, b` or `(a, b)`.
  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    const bool parens = IsOp("(");
    if (parens) Next();
    for (;;) {
      names.push_back(ExpectName("a variable name"));
      if (!IsOp(",")) break;
      Next();
      if (parens && IsOp(")")) break;
    }
    if (parens) ExpectOp(")");
    return names;
  }

  NodePtr ParseFor(SourcePos pos) {
    auto n = Make(NodeKind::kFor, pos);
    n->names = ParseTargets();
    if (!IsName("in")) Unexpected("'in'");
    Next();
    n->a = ParseTuple(/*with_condexpr=*/false);
    if (IsName("if")) {
      Next();
      n->b = ParseExpression();
    }
    if (IsName("recursive")) Fail(Cur().pos, "recursive for loops are not supported");
    ExpectBlockEnd();
    std::string end;
    ++loop_depth_;
    n->body = ParseBody({"endfor", "else"}, &end, pos, "for");
    --loop_depth_;
    if (end == "else") {
      ExpectBlockEnd();
      n->else_body = ParseBody({"endfor"}, &end, pos, "for");
    }
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseSet(SourcePos pos) {
    if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == ".") {
      auto n = Make(NodeKind::kSetAttr, pos);
      n->name = Next().text;
      Next();
      n->names.push_back(ExpectName("an attribute name"));
      ExpectOp("=");
      n->a = ParseTuple();
      ExpectBlockEnd();
      return n;
    }
    std::vector<std::string> targets = ParseTargets();
    if (IsOp("=")) {
      Next();
      auto n = Make(NodeKind::kSet, pos);
      n->names = std::move(targets);
      n->a = ParseTuple();
      ExpectBlockEnd();
      return n;
    }
    if (targets.size() != 1) Unexpected("'='");
    auto n = Make(NodeKind::kSetBlock, pos);
    n->name = targets[0];
    if (IsOp("|")) ParseFilterChain(&n->kids, /*leading_pipe=*/true);
    ExpectBlockEnd();
    std::string end;
    n->body = ParseBody({"endset"}, &end, pos, "set");
    ExpectBlockEnd();
    return n;
  }

  NodePtr ParseMacro(SourcePos pos) {
    auto n = Make(NodeKind::kMacro, pos);
    n->name = ExpectName("a macro name");
    ExpectOp("(");
    while (!IsOp(")")) {
      if (!n->names.empty()) ExpectOp(",");
      if (IsOp(")")) break;
      n->names.push_back(ExpectName("a parameter name"));
      if (IsOp("=")) {
        Next();
        n->kids.push_back(ParseExpression());
      } else {
        if (!n->kids.empty() && n->kids.back() != nullptr) {
          Fail(t_[i_ - 1].pos, "parameter without a default after one with a default");
        }
        n->kids.push_back(nullptr);
      }
    }
    Next();
    ExpectBlockEnd();
    std::string end;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    n->body = ParseBody({"endmacro"}, &end, pos, "macro");
    loop_depth_ = saved_loops;
    if (Cur().type == Tok::kName) Next();  // {% endmacro name %}
    ExpectBlockEnd();
    return n;
  }

  // `name(args) | name ...` of a filter block or block set.
  void ParseFilterChain(std::vector<NodePtr>* filters, bool leading_pipe) {
    bool first = true;
    while (first ? (!leading_pipe || IsOp("|")) : IsOp("|")) {
      if (leading_pipe || !first) Next();
      first = false;
      filters->push_back(ParseFilter(nullptr));
    }
  }

  NodePtr ParseTuple(bool with_condexpr = true) {
    const SourcePos pos = Cur().pos;
    NodePtr first = ParseExpression(with_condexpr);
    if (!IsOp(",")) return first;
    auto n = Make(NodeKind::kListLit, pos);
    n->kids.push_back(std::move(first));
    while (IsOp(",")) {
      Next();
      if (Cur().type == Tok::kBlockEnd || Cur().type == Tok::kVarEnd || IsOp(")")) break;
      n->kids.push_back(ParseExpression(with_condexpr));
    }
    return n;
  }

  NodePtr ParseExpression(bool with_condexpr = true) {
    Nesting guard(this);
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  NodePtr ParseCondExpr() {
    NodePtr expr = ParseOr();
    while (IsName("if")) {
      auto n = Make(NodeKind::kCondExpr, Next().pos);
      n->a = ParseOr();
      if (IsName("else")) {
        Next();
        n->c = ParseCondExpr();
      }
      n->b = std::move(expr);
      expr = std::move(n);
    }
    return expr;
  }

  NodePtr Binary(NodeKind kind, NodePtr left, NodePtr right, SourcePos pos, std::string op = "") {
    auto n = Make(kind, pos);
    n->name = std::move(op);
    n->kids.push_back(std::move(left));
    n->kids.push_back(std::move(right));
    return n;
  }

  // `next (word next)*`, left-associative: `or` over `and` over `not`.
  NodePtr ParseLogical(const char* word, NodeKind kind, NodePtr (Parser::*next)()) {
    NodePtr left = (this->*next)();
    while (IsName(word)) {
      const SourcePos pos = Next().pos;
      left = Binary(kind, std::move(left), (this->*next)(), pos);
    }
    return left;
  }
  NodePtr ParseOr() { return ParseLogical("or", NodeKind::kOr, &Parser::ParseAnd); }
  NodePtr ParseAnd() { return ParseLogical("and", NodeKind::kAnd, &Parser::ParseNot); }

  NodePtr ParseNot() {
    if (IsName("not")) {
      auto n = Make(NodeKind::kNot, Next().pos);
      n->kids.push_back(ParseNot());
      return n;
    }
    return ParseCompare();
  }

  NodePtr ParseCompare() {
    const SourcePos pos = Cur().pos;
    NodePtr first = ParseMath1();
    std::vector<std::string> ops;
    std::vector<NodePtr> operands;
    for (;;) {
      std::string op;
      if (Cur().type == Tok::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                     Cur().text == ">" || Cur().text == "<=" || Cur().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && Peek().type == Tok::kName && Peek().text == "in") {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(ParseMath1());
    }
    if (ops.empty()) return first;
    auto n = Make(NodeKind::kCompare, pos);
    n->kids.push_back(std::move(first));
    for (auto& o : operands) n->kids.push_back(std::move(o));
    n->names = std::move(ops);
    return n;
  }

  NodePtr ParseMath1() {
    NodePtr left = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      const Token& op = Next();
      const std::string text = op.text;
      left = Binary(NodeKind::kBinary, std::move(left), ParseConcat(), op.pos, text);
    }
    return left;
  }

  NodePtr ParseConcat() {
    const SourcePos pos = Cur().pos;
    NodePtr first = ParseMath2();
    if (!IsOp("~")) return first;
    auto n = Make(NodeKind::kConcat, pos);
    n->kids.push_back(std::move(first));
    while (IsOp("~")) {
      Next();
      n->kids.push_back(ParseMath2());
    }
    return n;
  }

  NodePtr ParseMath2() {
    NodePtr left = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& op = Next();
      const std::string text = op.text;
      left = Binary(NodeKind::kBinary, std::move(left), ParsePow(), op.pos, text);
    }
    return left;
  }

  NodePtr ParsePow() {
    NodePtr left = ParseUnary(true);
    while (IsOp("**")) {
      const SourcePos pos = Next().pos;
      left = Binary(NodeKind::kBinary, std::move(left), ParseUnary(true), pos, "**");
    }
    return left;
  }

  NodePtr ParseUnary(bool with_filter) {
    NodePtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& op = Next();
      node = Make(op.text == "-" ? NodeKind::kNeg : NodeKind::kPos, op.pos);
      node->kids.push_back(ParseUnary(false));
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(std::move(node));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  NodePtr Constant(Value v, SourcePos pos) {
    auto n = Make(NodeKind::kConst, pos);
    n->constant = std::move(v);
    return n;
  }

  NodePtr ParsePrimary() {
    const Token& t = Cur();
    const SourcePos pos = t.pos;
    switch (t.type) {
      case Tok::kName: {
        const std::string name = Next().text;
        if (name == "true" || name == "True") return Constant(Value(true), pos);
        if (name == "false" || name == "False") return Constant(Value(false), pos);
        if (name == "none" || name == "None") return Constant(Value::None(), pos);
        auto n = Make(NodeKind::kName, pos);
        n->name = name;
        return n;
      }
      case Tok::kString: {
        std::string s = Next().text;
        while (Cur().type == Tok::kString) s += Next().text;
        return Constant(Value(std::move(s)), pos);
      }
      case Tok::kInt:
      case Tok::kFloat: return Constant(Next().number, pos);
      case Tok::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return Make(NodeKind::kListLit, pos);  // ()
          }
          NodePtr inner = ParseTuple();
          ExpectOp(")");
          return inner;
        }
        if (t.text == "[") {
          Next();
          auto n = Make(NodeKind::kListLit, pos);
          while (!IsOp("]")) {
            if (!n->kids.empty()) ExpectOp(",");
            if (IsOp("]")) break;
            n->kids.push_back(ParseExpression());
          }
          Next();
          return n;
        }
        if (t.text == "{") {
          Next();
          auto n = Make(NodeKind::kDictLit, pos);
          while (!IsOp("}")) {
            if (!n->kids.empty()) ExpectOp(",");
            if (IsOp("}")) break;
            n->kids.push_back(ParseExpression());
            ExpectOp(":");
            n->kids.push_back(ParseExpression());
          }
          Next();
          return n;
        }
        break;
      default: break;
    }
    Unexpected("an expression");
  }

  NodePtr ParsePostfix(NodePtr node) {
    for (;;) {
      if (IsOp(".")) {
        Next();
        const SourcePos pos = node->pos;  // errors point at the start of `x.name`
        if (Cur().type == Tok::kName) {
          auto n = Make(NodeKind::kGetAttr, pos);
          n->name = Next().text;
          n->kids.push_back(std::move(node));
          node = std::move(n);
        } else if (Cur().type == Tok::kInt) {
          auto n = Make(NodeKind::kGetItem, pos);
          n->a = Constant(Cur().number, Cur().pos);
          Next();
          n->kids.push_back(std::move(node));
          node = std::move(n);
        } else {
          Unexpected("an attribute name after '.'");
        }
      } else if (IsOp("[")) {
        node = ParseSubscript(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  NodePtr ParseSubscript(NodePtr object) {
    Next();  // [
    const SourcePos pos = object->pos;
    NodePtr start;
    if (!IsOp(":")) {
      start = ParseExpression();
      if (IsOp("]")) {
        Next();
        auto n = Make(NodeKind::kGetItem, pos);
        n->a = std::move(start);
        n->kids.push_back(std::move(object));
        return n;
      }
      if (!IsOp(":")) Unexpected("']' or ':'");
    }
    auto n = Make(NodeKind::kSlice, pos);
    n->kids.push_back(std::move(object));
    n->a = std::move(start);
    Next();  // :
    if (!IsOp("]") && !IsOp(":")) n->b = ParseExpression();
    if (IsOp(":")) {
      Next();
      if (!IsOp("]")) n->c = ParseExpression();
    }
    ExpectOp("]");
    return n;
  }

  void ParseArgs(std::vector<Arg>* args) {
    ExpectOp("(");
    bool keyword_seen = false;
    while (!IsOp(")")) {
      if (!args->empty()) ExpectOp(",");
      if (IsOp(")")) break;
      if (IsOp("*") || IsOp("**")) Fail(Cur().pos, "argument unpacking (* and **) is not supported");
      Arg arg;
      if (Cur().type == Tok::kName && Peek().type == Tok::kOp && Peek().text == "=") {
        arg.name = Next().text;
        Next();
        keyword_seen = true;
      } else if (keyword_seen) {
        Fail(Cur().pos, "positional argument after a keyword argument");
      }
      arg.value = ParseExpression();
      args->push_back(std::move(arg));
    }
    Next();
  }

  NodePtr ParseCall(NodePtr callee) {
    auto n = Make(NodeKind::kCall, callee->pos);
    ParseArgs(&n->args);
    n->kids.push_back(std::move(callee));
    return n;
  }

  NodePtr ParseFilterExpr(NodePtr node) {
    for (;;) {
      if (IsOp("|")) {
        Next();
        node = ParseFilter(std::move(node));
      } else if (IsName("is")) {
        node = ParseTest(std::move(node));
      } else if (IsOp("(")) {
        node = ParseCall(std::move(node));
      } else {
        return node;
      }
    }
  }

  NodePtr ParseFilter(NodePtr operand) {
    const SourcePos pos = Cur().pos;
    const std::string name = ExpectName("a filter name");
    switch (FilterSupport(name)) {
      case Support::kSupported: break;
      case Support::kNotSupported: Fail(pos, "filter '" + name + "' is not supported");
      case Support::kUnknown: Fail(pos, "no filter named '" + name + "'");
    }
    auto n = Make(NodeKind::kFilter, pos);
    n->name = name;
    n->kids.push_back(std::move(operand));
    if (IsOp("(")) ParseArgs(&n->args);
    return n;
  }

  NodePtr ParseTest(NodePtr operand) {
    auto n = Make(NodeKind::kTest, Next().pos);  // is
    if (IsName("not")) {
      Next();
      n->negated = true;
    }
    const SourcePos pos = Cur().pos;
    n->name = ExpectName("a test name");
    switch (TestSupport(n->name)) {
      case Support::kSupported: break;
      case Support::kNotSupported: Fail(pos, "test '" + n->name + "' is not supported");
      case Support::kUnknown: Fail(pos, "no test named '" + n->name + "'");
    }
    n->kids.push_back(std::move(operand));
    if (IsOp("(")) {
      ParseArgs(&n->args);
    } else if ((Cur().type == Tok::kName && !IsName("else") && !IsName("or") && !IsName("and")) ||
               Cur().type == Tok::kString || Cur().type == Tok::kInt || Cur().type == Tok::kFloat ||
               IsOp("(") || IsOp("[") || IsOp("{")) {
      // `x is equalto 3`: one argument without parentheses.
      Arg arg;
      arg.value = ParsePostfix(ParsePrimary());
      n->args.push_back(std::move(arg));
    }
    return n;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

std::vector<NodePtr> ParseTemplate(std::string_view source) {
  Parser parser(Tokenize(source));
  return parser.ParseAll();
}

}  // namespace myriad::jinja
