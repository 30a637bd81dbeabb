#include "edge/normalize.h"

namespace myriad::edge {

char32_t NormalizeChar(char32_t c) {
  if (c >= 0xFF01 && c <= 0xFF5E) return c - 0xFEE0;  // full-width ASCII forms
  switch (c) {
    case 0x3000:  // ideographic space
    case 0x00A0:  // no-break space
      return U' ';
    case 0x200B:  // zero-width space, non-joiner, joiner
    case 0x200C:
    case 0x200D:
    case 0x2060:  // word joiner
    case 0xFEFF:  // zero-width no-break space (BOM)
      return kRemovedChar;
    default:
      return c;
  }
}

Normalized Normalize(std::u32string_view original) {
  Normalized n;
  n.text.reserve(original.size());
  n.origin.reserve(original.size() + 1);
  for (size_t i = 0; i < original.size(); ++i) {
    const char32_t c = NormalizeChar(original[i]);
    if (c == kRemovedChar) continue;
    n.text.push_back(c);
    n.origin.push_back(static_cast<int64_t>(i));
  }
  n.origin.push_back(static_cast<int64_t>(original.size()));
  return n;
}

}  // namespace myriad::edge
