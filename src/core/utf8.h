// UTF-8, one sequence at a time: the one decoder and encoder (corpus checks,
// the tokenizers, the Jinja renderer's string operations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace myriad {

inline constexpr char kUtf8ReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed UTF-8 sequence that starts at s[i], with its
// code point in *cp; 0 when the bytes there are malformed (a stray
// continuation byte, a truncated sequence, an overlong form, a surrogate,
// or a value past U+10FFFF). Requires i < s.size().
inline size_t Utf8SequenceLength(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n;
  char32_t v;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    v = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    v = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    v = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  static constexpr char32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return n;
}


// Length of the well-formed UTF-8 character at s[i], or 0 when the byte there
// does not start one (malformed, truncated, overlong or surrogate).
inline size_t Utf8CharLength(std::string_view s, size_t i) {
  char32_t cp;
  return Utf8SequenceLength(s, i, &cp);
}

// The code point of the well-formed character of `len` bytes at s[i]
// (len from Utf8CharLength, > 0).
inline uint32_t Utf8Decode(std::string_view s, size_t i, size_t len) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  if (len == 1) return b(0);
  uint32_t cp = b(0) & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (b(k) & 0x3F);
  return cp;
}

// Appends the UTF-8 encoding of code point `cp` (<= 0x10FFFF) to `out`.
template <typename String>
void Utf8Append(uint32_t cp, String* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace myriad
