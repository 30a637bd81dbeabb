#include "data/jinja_text.h"

#include <locale.h>
#include <wctype.h>

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/utf8.h"

namespace myriad::jinja {

namespace {

locale_t Utf8Locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    return l;
  }();
  return loc;
}

char32_t ToUpper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c >= 0xDC80 && c <= 0xDCFF) return c;  // an escaped malformed byte
  locale_t l = Utf8Locale();
  return l ? static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), l)) : c;
}

char32_t ToLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xDC80 && c <= 0xDCFF) return c;
  locale_t l = Utf8Locale();
  return l ? static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), l)) : c;
}

bool IsCased(char32_t c) { return ToUpper(c) != c || ToLower(c) != c; }

void AppendUpper(char32_t c, std::string* out) {
  if (c == 0xDF) {  // German sharp s: Python's full case mapping gives "SS"
    out->append("SS");
    return;
  }
  AppendUtf8(ToUpper(c), out);
}

bool InChars(char32_t c, const std::vector<char32_t>& chars) {
  for (char32_t x : chars) {
    if (x == c) return true;
  }
  return false;
}

}  // namespace

std::vector<char32_t> DecodeUtf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const size_t n = Utf8SequenceLength(s, i, &cp);
    if (n == 0) {
      out.push_back(0xDC00 + static_cast<unsigned char>(s[i]));  // surrogateescape
      ++i;
    } else {
      out.push_back(cp);
      i += n;
    }
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {  // surrogateescape: the original byte
    out->push_back(static_cast<char>(cp - 0xDC00));
  } else {
    Utf8Append(static_cast<uint32_t>(cp), out);
  }
}

std::string EncodeUtf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) AppendUtf8(c, &out);
  return out;
}

int64_t CodePointCount(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const size_t len = Utf8SequenceLength(s, i, &cp);
    i += len == 0 ? 1 : len;
    ++n;
  }
  return n;
}

bool IsPyWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  std::vector<char32_t> set;
  if (chars) set = DecodeUtf8(*chars);
  auto strip_it = [&](char32_t c) { return chars ? InChars(c, set) : IsPyWhitespace(c); };
  size_t b = 0, e = cps.size();
  if (side != StripSide::kRight) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (side != StripSide::kLeft) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  return EncodeUtf8(std::vector<char32_t>(cps.begin() + b, cps.begin() + e));
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  const std::vector<char32_t> cps = DecodeUtf8(s);
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && IsPyWhitespace(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      // The rest, with its trailing whitespace removed, is the last part.
      size_t e = cps.size();
      while (e > i && IsPyWhitespace(cps[e - 1])) --e;
      out.push_back(EncodeUtf8(std::vector<char32_t>(cps.begin() + i, cps.begin() + e)));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !IsPyWhitespace(cps[j])) ++j;
    out.push_back(EncodeUtf8(std::vector<char32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return out;
}

std::vector<std::string> PySplitLines(std::string_view s) {
  const std::vector<char32_t> cps = DecodeUtf8(s);
  std::vector<std::string> out;
  std::string line;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const bool boundary = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C ||
                          c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!boundary) {
      AppendUtf8(c, &line);
      continue;
    }
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    out.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) out.push_back(std::move(line));
  return out;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    const std::vector<char32_t> cps = DecodeUtf8(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out.append(repl);
        ++done;
      }
      if (i < cps.size()) AppendUtf8(cps[i], &out);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    out.append(repl);
    start = at + old.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

std::string PyUpper(std::string_view s) {
  std::string out;
  for (char32_t c : DecodeUtf8(s)) AppendUpper(c, &out);
  return out;
}

std::string PyLower(std::string_view s) {
  std::string out;
  for (char32_t c : DecodeUtf8(s)) AppendUtf8(ToLower(c), &out);
  return out;
}

std::string PyCapitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (char32_t c : DecodeUtf8(s)) {
    if (first) {
      AppendUpper(c, &out);
      first = false;
    } else {
      AppendUtf8(ToLower(c), &out);
    }
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (previous_cased) {
      AppendUtf8(ToLower(c), &out);
    } else {
      AppendUpper(c, &out);
    }
    previous_cased = IsCased(c);
  }
  return out;
}

std::string JinjaTitle(std::string_view s) {
  std::string out;
  bool word_start = true;
  for (char32_t c : DecodeUtf8(s)) {
    const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPyWhitespace(c);
    if (separator) {
      AppendUtf8(c, &out);
      word_start = true;
    } else if (word_start) {
      AppendUpper(c, &out);
      word_start = false;
    } else {
      AppendUtf8(ToLower(c), &out);
    }
  }
  return out;
}

namespace {

// str.islower() / str.isupper(): some cased letter, and every cased letter
// already what `to_case` makes it.
bool AllCasedAre(std::string_view s, char32_t (*to_case)(char32_t)) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (!IsCased(c)) continue;
    if (to_case(c) != c) return false;
    cased = true;
  }
  return cased;
}

}  // namespace

bool PyIsLower(std::string_view s) { return AllCasedAre(s, ToLower); }
bool PyIsUpper(std::string_view s) { return AllCasedAre(s, ToUpper); }

std::string PyFloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  // Shortest digits that read back as v, in scientific form "d.ddde+XX".
  auto res = std::to_chars(buf, buf + sizeof(buf), std::fabs(v), std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_at = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_at; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exponent = std::stoi(sci.substr(e_at + 1));
  const int decpt = exponent + 1;  // digits are 0.d1d2... x 10^decpt
  std::string out = std::signbit(v) ? "-" : "";
  const int n = static_cast<int>(digits.size());
  if (decpt > 16 || decpt < -3) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += e;
  } else if (decpt <= 0) {
    out += "0." + std::string(-decpt, '0') + digits;
  } else if (decpt >= n) {
    out += digits + std::string(decpt - n, '0') + ".0";
  } else {
    out += digits.substr(0, decpt) + "." + digits.substr(decpt);
  }
  return out;
}

std::string EscapeForMessage(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  size_t count = 0;
  for (char32_t c : DecodeUtf8(s)) {
    if (count++ == max_chars) {
      out += "...";
      break;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      case '"': out += "\\\""; break;
      default:
        if (c < 0x20 || c == 0x7F || (c >= 0xDC80 && c <= 0xDCFF)) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\x%02x", static_cast<unsigned>(c >= 0xDC80 ? c - 0xDC00 : c));
          out += b;
        } else {
          AppendUtf8(c, &out);
        }
    }
  }
  if (count <= max_chars) out += "\"";
  return out;
}

}  // namespace myriad::jinja
