// Python's string semantics on UTF-8 text, for the Jinja renderer
// (data/jinja.h): chat templates are Python Jinja, so lengths, indices and
// slices count code points, whitespace is what str.isspace() accepts, and
// strip/split/splitlines/case behave as Python's str methods.
//
// Contract: inputs are UTF-8; a malformed byte counts as one code point of
// its own and is copied unchanged (nothing here fails or rewrites bytes).
// Case mapping is Unicode's simple one-to-one mapping (glibc's C.UTF-8
// tables); Python's special cases that change length (German sharp s to
// "SS") are the one known difference.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace myriad::jinja {

// The code points of `s` (a malformed byte becomes 0xDC80 + byte, Python's
// surrogateescape, so that EncodeUtf8 gives the byte back).
std::vector<char32_t> DecodeUtf8(std::string_view s);
std::string EncodeUtf8(const std::vector<char32_t>& cps);
void AppendUtf8(char32_t cp, std::string* out);
// Number of code points (Python len()).
int64_t CodePointCount(std::string_view s);

// str.isspace() for one code point.
bool IsPyWhitespace(char32_t cp);

// str.strip / lstrip / rstrip; `chars` empty optional = whitespace.
enum class StripSide { kBoth, kLeft, kRight };
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, StripSide side);

// str.split(sep, maxsplit): sep = nullopt splits on runs of whitespace and
// drops empty ends. An empty sep is the caller's error to report.
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit);
// str.splitlines() (line boundaries \n \r \r\n \v \f \x1c-\x1e \x85 \u2028
// \u2029), without the line ends.
std::vector<std::string> PySplitLines(std::string_view s);
// str.replace(old, new, count); count < 0 = all. An empty `old` inserts
// `repl` between code points, as Python does.
std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);

std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
// str.capitalize(): first code point upper, the rest lower.
std::string PyCapitalize(std::string_view s);
// str.title(): a cased letter after an uncased one is upper, others lower.
std::string PyTitle(std::string_view s);
// Jinja's |title filter: words start after any of - ( { [ < or whitespace.
std::string JinjaTitle(std::string_view s);
// str.islower() / str.isupper().
bool PyIsLower(std::string_view s);
bool PyIsUpper(std::string_view s);

// Python's repr() of a float ("1.0", "0.1", "1e+16", "1e-05", "inf", "nan").
std::string PyFloatRepr(double v);

// A short, printable, one-line rendering of `s` for error messages: control
// characters and backslashes escaped, quotes added, cut after `max_chars`.
std::string EscapeForMessage(std::string_view s, size_t max_chars = 60);

}  // namespace myriad::jinja
