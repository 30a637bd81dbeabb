// The check characters against identifiers whose validity is published or
// worked by hand from the standards' formulas, and one-character changes.
#include "edge/checksums.h"

#include <gtest/gtest.h>

namespace myriad::edge {
namespace {

TEST(Checksums, ResidentIdKnownValues) {
  // The example ID of GB 11643-1999's annex: 11010519491231002X.
  EXPECT_EQ(ResidentIdCheckChar("11010519491231002"), 'X');
  EXPECT_TRUE(ResidentIdCheckValid("11010519491231002X"));
  EXPECT_TRUE(ResidentIdCheckValid("11010519491231002x"));
  // By hand: 44030019900101001 -> weighted sum 4*7+4*9+0*10+3*5+0*8+0*4+1*2+9*1+9*6+0*3+0*7+1*9+0*10+1*5+0*8+0*4+1*2
  // = 28+36+15+2+9+54+9+5+2 = 160, 160 mod 11 = 6 -> "10X98765432"[6] = '6'.
  EXPECT_EQ(ResidentIdCheckChar("44030019900101001"), '6');
  EXPECT_TRUE(ResidentIdCheckValid("440300199001010016"));
  EXPECT_FALSE(ResidentIdCheckValid("440300199001010015"));
  EXPECT_FALSE(ResidentIdCheckValid("11010519491231002"));
  EXPECT_FALSE(ResidentIdCheckChar("1101051949123100A").has_value());
}

TEST(Checksums, Luhn) {
  EXPECT_TRUE(LuhnValid("4111111111111111"));  // the well-known Visa test number
  EXPECT_TRUE(LuhnValid("79927398713"));       // the textbook example
  EXPECT_EQ(LuhnCheckDigit("7992739871"), '3');
  EXPECT_FALSE(LuhnValid("4111111111111112"));
  EXPECT_FALSE(LuhnValid("79927398710"));
  EXPECT_FALSE(LuhnCheckDigit("12a4").has_value());
}

TEST(Checksums, CreditCode) {
  // By hand: 91350100M00010000 -> values 9,1,3,5,0,1,0,0,M=21,0,0,0,1,0,0,0,0 with
  // weights 1,3,9,27,19,26,16,17,20,29,25,13,8,24,10,30,28:
  // 9+3+27+135+0+26+0+0+420+0+0+0+8+0+0+0+0 = 628, 628 mod 31 = 8, 31-8 = 23 -> 'P'.
  EXPECT_EQ(CreditCodeCheckChar("91350100M00010000"), 'P');
  EXPECT_TRUE(CreditCodeCheckValid("91350100M00010000P"));
  EXPECT_FALSE(CreditCodeCheckValid("91350100M00010000Q"));
  EXPECT_FALSE(CreditCodeCheckChar("91350100I00010000").has_value());  // I is not in the alphabet
  // A remainder of 0 gives check value 0: 00000000000000000 -> '0'.
  EXPECT_EQ(CreditCodeCheckChar("00000000000000000"), '0');
}

}  // namespace
}  // namespace myriad::edge
