#include "core/checked_size.h"

#include <gtest/gtest.h>

namespace myriad {
namespace {

using S = CheckedSize;

TEST(CheckedSize, ProductsAndSumsKeepTheKeysThatDecideThem) {
  const S a = S::Key("model.d_model", 1 << 20), b = S::Key("model.vocab_size", 1 << 30);
  const S one = S::Key("model.mtp_depth", 1);
  const S p = a * b * one;
  EXPECT_FALSE(p.overflow());
  EXPECT_EQ(p.value(), int64_t{1} << 50);
  EXPECT_EQ(p.KeyList(), "model.d_model, model.vocab_size");  // a factor 1 grows nothing
  const S sum = p + S::Key("model.n_layers", 3);
  EXPECT_EQ(sum.value(), (int64_t{1} << 50) + 3);
  EXPECT_EQ(sum.KeyList(), "model.d_model, model.vocab_size");  // the larger term's keys
  EXPECT_TRUE((S(16) * sum).Check("x").ok());
}

TEST(CheckedSize, OverflowAndLimitsNameTheKeys) {
  const S a = S::Key("model.d_model", int64_t{1} << 40), b = S::Key("model.vocab_size", int64_t{1} << 30);
  const S p = a * b;  // 2^70
  EXPECT_TRUE(p.overflow());
  // Overflow sticks, with the keys of the product that overflowed.
  const S later = p * S::Key("model.n_layers", 2) + S(5);
  EXPECT_TRUE(later.overflow());
  const Status s = later.Check("the embedding's size");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(),
            "the embedding's size overflows 64-bit integers (it grows with model.d_model, model.vocab_size; "
            "hint: lower them)");
  const S sum = S::Key("a", INT64_MAX) + S::Key("b", INT64_MAX);
  EXPECT_TRUE(sum.overflow());
  EXPECT_EQ(sum.KeyList(), "a, b");
  const Status lim = (S::Key("parallel.dp", 4096) * S::Key("parallel.tp", 512)).Check("ranks", 1 << 20);
  EXPECT_NE(lim.message().find("ranks = 2097152 exceeds 1048576 (it grows with parallel.dp, parallel.tp"),
            std::string::npos)
      << lim.message();
}

}  // namespace
}  // namespace myriad
