#include "data/jinja_parse.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "data/jinja_builtins.h"
#include "data/jinja_text.h"

namespace myriad::jinja {

namespace {

enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string text;  // the text, name, string value or operator
  SourcePos pos;
  Value number;
};

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Python Jinja reads the source with newlines normalised and, without
// keep_trailing_newline, one trailing newline dropped.
std::string NormalizeSource(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else {
      out.push_back(in[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(NormalizeSource(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos < n) {
      size_t at = pos;
      for (;;) {
        at = src_.find('{', at);
        if (at == std::string::npos || at + 1 >= n) {
          at = std::string::npos;
          break;
        }
        const char k = src_[at + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++at;
      }
      std::string text = src_.substr(pos, (at == std::string::npos ? n : at) - pos);
      if (at == std::string::npos) {
        Emit(Tok::kText, std::move(text), pos);
        break;
      }
      const char kind = src_[at + 1];
      char sign = at + 2 < n ? src_[at + 2] : 0;
      if (sign != '-' && sign != '+') sign = 0;
      if (sign == '-') {
        text = PyStrip(text, std::nullopt, StripSide::kRight);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only spaces and tabs between the line start and the tag.
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) &&
            text.find_first_not_of(" \t", l_pos) == std::string::npos) {
          text.resize(l_pos);
        }
      }
      Emit(Tok::kText, std::move(text), pos);
      size_t p = at + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        const size_t e = src_.find("#}", p);
        if (e == std::string::npos) Fail(at, "comment {# is not closed (expected #})");
        size_t after = e + 2;
        if (e > p && src_[e - 1] == '-') {
          after = SkipWhitespace(after);
        } else if (e > p && src_[e - 1] == '+') {
          // keep what follows
        } else if (after < n && src_[after] == '\n') {
          ++after;  // trim_blocks
        }
        line_starting = after > 0 && src_[after - 1] == '\n';
        pos = after;
        continue;
      }
      const bool block = kind == '%';
      const size_t first_token = tokens_.size() + 1;
      Emit(block ? Tok::kBlockBegin : Tok::kVarBegin, block ? "{%" : "{{", at);
      p = LexTag(block, at, p);
      if (block && tokens_.size() > first_token && tokens_[first_token].type == Tok::kName &&
          tokens_[first_token].text == "raw") {
        Fail(at, "{% raw %} blocks are not supported");
      }
      line_starting = p > 0 && src_[p - 1] == '\n';
      pos = p;
    }
    tokens_.push_back(Token{Tok::kEof, "end of template", PosAt(n), Value()});
    return std::move(tokens_);
  }

 private:
  SourcePos PosAt(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    const size_t start = line_starts_[line - 1];
    const auto col = CodePointCount(std::string_view(src_).substr(start, offset - start));
    return SourcePos{static_cast<int>(line), static_cast<int>(col) + 1};
  }

  [[noreturn]] void Fail(size_t offset, std::string message) const {
    throw PositionedError{PosAt(offset), std::move(message)};
  }

  void Emit(Tok type, std::string text, size_t offset) {
    if (type == Tok::kText && text.empty()) return;
    tokens_.push_back(Token{type, std::move(text), PosAt(offset), Value()});
  }

  size_t SkipWhitespace(size_t p) const {
    while (p < src_.size()) {
      size_t len = 1;
      char32_t c = static_cast<unsigned char>(src_[p]);
      if (c >= 0x80) {
        const std::vector<char32_t> cps = DecodeUtf8(std::string_view(src_).substr(p, 4));
        c = cps.empty() ? 0 : cps[0];
        std::string enc;
        AppendUtf8(c, &enc);
        len = enc.size();
      }
      if (!IsPyWhitespace(c)) break;
      p += len;
    }
    return p;
  }

  bool At(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  // Lexes the inside of a {{ }} or {% %} tag opened at `begin`, from `p`;
  // returns the offset after the closing tag (and what the tag's whitespace
  // control removes after it).
  size_t LexTag(bool block, size_t begin, size_t p) {
    int depth = 0;  // open ( [ {: a closing tag only counts outside them
    const size_t n = src_.size();
    for (;;) {
      p = SkipWhitespace(p);
      if (p >= n) Fail(begin, block ? "{% is not closed (expected %})" : "{{ is not closed (expected }})");
      if (depth == 0) {
        const char* close = block ? "%}" : "}}";
        if (src_[p] == '-' && At(p + 1, close)) {
          Emit(block ? Tok::kBlockEnd : Tok::kVarEnd, close, p);
          return SkipWhitespace(p + 3);
        }
        if (src_[p] == '+' && At(p + 1, close)) {
          Emit(block ? Tok::kBlockEnd : Tok::kVarEnd, close, p);
          return p + 3;
        }
        if (At(p, close)) {
          Emit(block ? Tok::kBlockEnd : Tok::kVarEnd, close, p);
          p += 2;
          if (block && p < n && src_[p] == '\n') ++p;  // trim_blocks
          return p;
        }
      }
      const char c = src_[p];
      if (IsNameStart(c)) {
        size_t e = p;
        while (e < n && IsNameChar(src_[e])) ++e;
        Emit(Tok::kName, src_.substr(p, e - p), p);
        p = e;
      } else if (IsDigit(c)) {
        p = LexNumber(p);
      } else if (c == '\'' || c == '"') {
        p = LexString(p);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*", "/", "%", "~",
                                     "<",  ">",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|",
                                     "=",  ";"};
        const char* op = nullptr;
        for (const char* o : kOps) {
          if (At(p, o)) {
            op = o;
            break;
          }
        }
        if (op == nullptr) {
          std::string ch;
          AppendUtf8(DecodeUtf8(std::string_view(src_).substr(p, 4))[0], &ch);
          Fail(p, "unexpected character '" + ch + "'");
        }
        if (*op == '(' || *op == '[' || *op == '{') ++depth;
        if (*op == ')' || *op == ']' || *op == '}') {
          if (depth == 0) Fail(p, std::string("unexpected '") + op + "'");
          --depth;
        }
        Emit(Tok::kOp, op, p);
        p += std::string_view(op).size();
      }
    }
  }

  size_t Digits(size_t p) const {  // \d+(_\d+)*
    const size_t n = src_.size();
    while (p < n && IsDigit(src_[p])) {
      ++p;
      if (p + 1 < n && src_[p] == '_' && IsDigit(src_[p + 1])) ++p;
    }
    return p;
  }

  size_t LexNumber(size_t p) {
    const size_t n = src_.size();
    size_t e = Digits(p);
    bool is_float = false;
    // A number right after '.' is an attribute index (x.0.1), never a float.
    const bool after_dot = !tokens_.empty() && tokens_.back().type == Tok::kOp && tokens_.back().text == ".";
    if (!after_dot && e + 1 < n && src_[e] == '.' && IsDigit(src_[e + 1])) {
      e = Digits(e + 1);
      is_float = true;
    }
    if (!after_dot && e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < n && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < n && IsDigit(src_[x])) {
        e = Digits(x);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = p; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, PosAt(p), Value()};
    if (is_float) {
      t.number = Value(std::strtod(text.c_str(), nullptr));
    } else {
      int64_t v = 0;
      const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (r.ec != std::errc()) Fail(p, "integer " + text + " is too large");
      t.number = Value(v);
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  static int HexValue(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A string literal with Python's escapes (unicode-escape, as Jinja
  // decodes them): an unknown escape such as \q stays as written.
  size_t LexString(size_t p) {
    const char quote = src_[p];
    const size_t n = src_.size();
    std::string value;
    size_t i = p + 1;
    for (;;) {
      if (i >= n) Fail(p, "string literal is not closed");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= n) Fail(p, "string literal is not closed");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case 'a': value.push_back('\a'); break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case '\n': break;  // a line continuation
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          char32_t cp = 0;
          for (int k = 0; k < digits; ++k) {
            const int h = i < n ? HexValue(src_[i]) : -1;
            if (h < 0) Fail(i - 2 - k, std::string("truncated \\") + e + " escape in string literal");
            cp = cp * 16 + static_cast<char32_t>(h);
            ++i;
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            Fail(i - digits - 2, "escape in string literal is not a Unicode scalar value");
          }
          AppendUtf8(cp, &value);
          break;
        }
        case 'N': Fail(i - 2, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < n && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + static_cast<char32_t>(src_[i++] - '0');
            }
            AppendUtf8(cp, &value);
          } else {
            value.push_back('\\');
            value.push_back(e);
          }
      }
    }
    tokens_.push_back(Token{Tok::kString, std::move(value), PosAt(p), Value()});
    return i + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

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
      ExpectBlockEnd();
      for (auto& n : ParseBody({"endgeneration"}, &end, pos, "generation")) out->push_back(std::move(n));
      ExpectBlockEnd();
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

  NodePtr ParseOr() {
    NodePtr left = ParseAnd();
    while (IsName("or")) {
      const SourcePos pos = Next().pos;
      left = Binary(NodeKind::kOr, std::move(left), ParseAnd(), pos);
    }
    return left;
  }

  NodePtr ParseAnd() {
    NodePtr left = ParseNot();
    while (IsName("and")) {
      const SourcePos pos = Next().pos;
      left = Binary(NodeKind::kAnd, std::move(left), ParseNot(), pos);
    }
    return left;
  }

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
        const SourcePos pos = Next().pos;
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
    const SourcePos pos = Next().pos;  // [
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
    auto n = Make(NodeKind::kCall, Cur().pos);
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
};

}  // namespace

std::vector<NodePtr> ParseTemplate(std::string_view source) {
  Lexer lexer(source);
  Parser parser(lexer.Run());
  return parser.ParseAll();
}

}  // namespace myriad::jinja
