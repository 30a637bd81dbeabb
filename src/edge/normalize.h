// Normalisation before detection: full-width ASCII forms (U+FF01..U+FF5E) to
// ASCII, the ideographic space and no-break space to a space, zero-width
// characters (U+200B..U+200D, U+2060, U+FEFF) removed. The detectors run on
// the normalised text; `origin` maps each of its code points back to the
// original, so a span over "１３８\u200B0013 8000" covers exactly those
// original characters.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "edge/entity.h"

namespace myriad::edge {

struct Normalized {
  std::u32string text;          // normalised code points
  std::vector<int64_t> origin;  // origin[i]: index in the original of text[i]; size text.size() + 1,
                                // the last entry is the original's length
  // The original [start, end) behind the normalised [s, e): from the first
  // character's origin to just past the last's, so characters removed in
  // between (zero-width) are covered too. Requires s < e <= text.size().
  Span ToOriginal(int64_t s, int64_t e) const {
    return Span{origin[s], origin[e - 1] + 1};
  }
};

// A code point that normalisation removes (NormalizeChar's answer).
inline constexpr char32_t kRemovedChar = 0xFFFFFFFF;
// One code point's normal form; kRemovedChar for one that is removed.
char32_t NormalizeChar(char32_t c);
Normalized Normalize(std::u32string_view original);

}  // namespace myriad::edge
