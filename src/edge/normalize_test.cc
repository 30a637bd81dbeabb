// Normalisation and its map back to the original code points, against
// hand-written expectations.
#include "edge/normalize.h"

#include <gtest/gtest.h>

namespace myriad::edge {
namespace {

TEST(Normalize, FullWidthAndSpaces) {
  const Normalized n = Normalize(U"１３８Ａｂ！\u3000～x");
  EXPECT_EQ(n.text, U"138Ab! ~x");
  EXPECT_EQ(n.origin, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(Normalize, ZeroWidthRemovedAndMapped) {
  // a ZWSP b ZWNJ ZWJ c WJ BOM d
  const Normalized n = Normalize(U"a\u200Bb\u200C\u200Dc\u2060\uFEFFd");
  EXPECT_EQ(n.text, U"abcd");
  EXPECT_EQ(n.origin, (std::vector<int64_t>{0, 2, 5, 8, 9}));
  // "bc" in the normalised text is [1, 3); in the original it covers b, the two joiners and c.
  const Span s = n.ToOriginal(1, 3);
  EXPECT_EQ(s.start, 2);
  EXPECT_EQ(s.end, 6);
}

TEST(Normalize, OtherTextUntouched) {
  const std::u32string s = U"中文，。【】０";  // the full-width comma U+FF0C is in the block
  const Normalized n = Normalize(s);
  EXPECT_EQ(n.text, U"中文,。【】0");
  EXPECT_EQ(NormalizeChar(U'\u00A0'), U' ');
  EXPECT_EQ(NormalizeChar(U'\uFF5F'), U'\uFF5F');  // past the full-width ASCII block
  EXPECT_EQ(NormalizeChar(U'\uFF00'), U'\uFF00');
  EXPECT_EQ(NormalizeChar(U'\0'), U'\0');
}

}  // namespace
}  // namespace myriad::edge
