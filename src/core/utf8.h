// UTF-8 decoding, one sequence at a time (the one decoder: corpus checks and
// the Jinja renderer's string operations use it).
#pragma once

#include <cstddef>
#include <string_view>

namespace myriad {

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

}  // namespace myriad
