#include "data/jinja_lex.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "data/jinja_text.h"

namespace myriad::jinja {

namespace {

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

}  // namespace

std::vector<Token> Tokenize(std::string_view source) {
  Lexer lexer(source);
  return lexer.Run();
}

}  // namespace myriad::jinja
