// UTF-8 helpers shared by the tokenizers (internal to src/data).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace myriad {

inline constexpr char kUtf8ReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 character at s[i], or 0 when the byte there
// does not start one (malformed, truncated, overlong or surrogate).
inline size_t Utf8CharLength(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
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
