// The pattern detectors on positive forms and on decoys. Expected spans are
// written by hand (code points of the input); check characters were computed
// apart from the code under test (python3 with the standards' formulas, and
// the hand-worked values in checksums_test.cc).
#include "edge/patterns.h"

#include <gtest/gtest.h>

#include "edge/redact.h"

namespace myriad::edge {
namespace {

struct Found {
  std::string text;
  EntityType type;
  bool operator==(const Found& o) const { return text == o.text && type == o.type; }
};
std::ostream& operator<<(std::ostream& os, const Found& f) { return os << EntityTypeName(f.type) << ":" << f.text; }

// What the redactor (threshold 0.5) keeps, as (text of the span, type).
std::vector<Found> Kept(const std::string& s) {
  const std::u32string cps = DecodeUtf8(s);
  std::vector<Found> out;
  for (const Span& sp : Redactor().Detect(s))
    out.push_back(Found{EncodeUtf8(cps.substr(sp.start, sp.end - sp.start)), sp.type});
  return out;
}
std::vector<Found> One(const std::string& text, EntityType t) { return {Found{text, t}}; }

constexpr EntityType kId = EntityType::kResidentId, kPhone = EntityType::kPhone, kCard = EntityType::kBankCard;

TEST(Patterns, ResidentId) {
  // 110105199003071239: check character 9 (python3: weights 7,9,10,5,8,4,2,1,6,3,7,9,10,5,8,4,2).
  EXPECT_EQ(Kept("身份证号110105199003071239，"), One("110105199003071239", kId));
  // The GB 11643 annex example, X check character, upper and lower case.
  EXPECT_EQ(Kept("ID: 11010519491231002X."), One("11010519491231002X", kId));
  EXPECT_EQ(Kept("id 11010519491231002x"), One("11010519491231002x", kId));
  // Grouped by spaces.
  EXPECT_EQ(Kept("证件 110105 19900307 1239 号"), One("110105 19900307 1239", kId));
  // 15-digit: area, YYMMDD, 3 digits.
  EXPECT_EQ(Kept("旧证 110105900307123 号"), One("110105900307123", kId));
  // A 15-digit ID that is also a Luhn-valid 37... (American Express) number:
  // the keyword and the birth date make it an ID (python3: Luhn of
  // 370202680804022 is valid; 680804 is 1968-08-04).
  EXPECT_EQ(Kept("身份证370202680804022，另一记"), One("370202680804022", kId));
  EXPECT_EQ(Kept("| 欧阳芳 | 370202880303049 | 1"), One("370202880303049", kId));
  const auto spans = Redactor().Detect("身份证号110105199003071239");
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].start, 4);
  EXPECT_EQ(spans[0].end, 22);
  EXPECT_GT(spans[0].confidence, 0.9f);
}

TEST(Patterns, ResidentIdDecoys) {
  EXPECT_TRUE(Kept("错号110105199003071238不是").empty());       // wrong check character
  EXPECT_TRUE(Kept("110105199013071232").empty());              // valid check (python3), month 13
  EXPECT_TRUE(Kept("编号 1110105199003071239").empty());         // inside a 19-digit run
  EXPECT_TRUE(Kept("x110105199003071239").empty());              // glued to a letter
  EXPECT_TRUE(Kept("旧证 110105901307123 号").empty());          // 15 digits, month 13
}

TEST(Patterns, Mobiles) {
  for (const char* form : {"13800138000", "138 0013 8000", "138-0013-8000", "138.0013.8000", "+86 138-0013-8000",
                           "+86 13800138000", "+8613800138000", "(+86) 138 0013 8000", "(+86)13800138000", "0086 13800138000", "008613800138000"}) {
    EXPECT_EQ(Kept(std::string("电话：") + form + "。"), One(form, kPhone)) << form;
  }
  // Full-width digits and zero-width splits: the span covers the original characters.
  EXPECT_EQ(Kept("电话１３８００１３８０００好"), One("１３８００１３８０００", kPhone));
  EXPECT_EQ(Kept("电话138\u200B0013\u200B8000好"), One("138\u200B0013\u200B8000", kPhone));
  const auto spans = Redactor().Detect("电话138\u200B0013\u200B8000好");
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].start, 2);
  EXPECT_EQ(spans[0].end, 15);  // 11 digits + 2 zero-width characters
}

TEST(Patterns, MobileDecoys) {
  EXPECT_TRUE(Kept("12800138000").empty());         // 12x is not a mobile prefix
  EXPECT_TRUE(Kept("138001380001").empty());        // 12 digits
  EXPECT_TRUE(Kept("SF13800138000").empty());       // a tracking number's tail
  EXPECT_TRUE(Kept("订单号：13800138000").empty());  // order keyword lowers confidence
  EXPECT_EQ(Kept("订单号 123，电话 13800138000"), One("13800138000", kPhone));  // nearer phone keyword
  EXPECT_TRUE(Kept("SN: 13800138000").empty());
  EXPECT_EQ(Kept("snow 13800138000"), One("13800138000", kPhone));   // "sn" only as a word
  EXPECT_EQ(Kept("preference 13800138000"), One("13800138000", kPhone));  // not "ref"
}

TEST(Patterns, Landlines) {
  EXPECT_EQ(Kept("座机 010-12345678 找我"), One("010-12345678", kPhone));
  EXPECT_EQ(Kept("座机 (010) 1234 5678 找我"), One("(010) 1234 5678", kPhone));
  EXPECT_EQ(Kept("座机 0755-8888 9999。"), One("0755-8888 9999", kPhone));
  EXPECT_EQ(Kept("座机 021-66668888-123。"), One("021-66668888-123", kPhone));
  EXPECT_EQ(Kept("座机 010-12345678 转 808。"), One("010-12345678 转 808", kPhone));
  EXPECT_EQ(Kept("tel 010-12345678 ext. 12."), One("010-12345678 ext. 12", kPhone));
  EXPECT_TRUE(Kept("digits 0123456789 and 012-3456789").empty());  // no 01x area code but 010
}

TEST(Patterns, International) {
  EXPECT_EQ(Kept("call +44 20 7946 0958 now"), One("+44 20 7946 0958", kPhone));
  EXPECT_EQ(Kept("call +1 (415) 555-0132 now"), One("+1 (415) 555-0132", kPhone));
  EXPECT_EQ(Kept("call (415) 555-0132 now"), One("(415) 555-0132", kPhone));
  EXPECT_EQ(Kept("call 415-555-0132 now"), One("415-555-0132", kPhone));
  EXPECT_TRUE(Kept("call 115-555-0132 now").empty());  // area code cannot start with 1
}

TEST(Patterns, BankCards) {
  // 6222021234567890128: UnionPay, Luhn completed by python3; 4111111111111111 the Visa test number.
  EXPECT_EQ(Kept("卡号 6222 0212 3456 7890 128 。"), One("6222 0212 3456 7890 128", kCard));
  EXPECT_EQ(Kept("卡号6222021234567890128。"), One("6222021234567890128", kCard));
  EXPECT_EQ(Kept("card 4111-1111-1111-1111."), One("4111-1111-1111-1111", kCard));
  EXPECT_EQ(Kept("卡号 6222021234567890 。"), One("6222021234567890", kCard));  // UnionPay without Luhn
  EXPECT_EQ(Kept("amex 3793 545081 62306"), One("3793 545081 62306", kCard));   // 4-6-5, Luhn by python3
  EXPECT_TRUE(Kept("card 4111111111111112").empty());   // Luhn fails, not UnionPay
  EXPECT_TRUE(Kept("发票 4111111111111111").empty());    // invoice keyword
  EXPECT_TRUE(Kept("订单号 6222021234567890128").empty());
  EXPECT_TRUE(Kept("卡 62220212345678").empty());         // UnionPay needs 16-19 digits
}

TEST(Patterns, TimestampsAndAmountsAreDecoys) {
  EXPECT_TRUE(Kept("时间 20231105143015 到").empty());
  EXPECT_TRUE(Kept("时间 2023-11-05 14:30:15 到").empty());
  EXPECT_TRUE(Kept("金额 ¥13,800.00 元，合计 138001.38").empty());
  EXPECT_TRUE(Kept("流水号 2023110514301512").empty());
  EXPECT_TRUE(Kept("合计 138001380.00，").empty());               // a decimal fraction
  EXPECT_TRUE(Kept("付款 ¥13800138000 和 $ 6222021234567890128").empty());  // currency before
  EXPECT_TRUE(Kept("付款 13800138000 元，USD 4111111111111111").empty());   // currency after / code
  EXPECT_EQ(Kept("付款 ¥100，电话 13800138000"), One("13800138000", kPhone));
  EXPECT_TRUE(Kept("invoice INV-2023-0001 ref 20231105-0042").empty());
}

TEST(Patterns, EmailUrlIp) {
  EXPECT_EQ(Kept("写信给 Alice.Smith+x@Example.COM。"), One("Alice.Smith+x@Example.COM", EntityType::kEmail));
  EXPECT_EQ(Kept("see https://example.com/a?b=1)."), One("https://example.com/a?b=1", EntityType::kUrl));
  EXPECT_EQ(Kept("（见 www.foo.cn/x）"), One("www.foo.cn/x", EntityType::kUrl));
  EXPECT_EQ(Kept("host 192.168.1.255, ok"), One("192.168.1.255", EntityType::kIp));
  EXPECT_EQ(Kept("v6 2001:db8::8a2e:370:7334 ok"), One("2001:db8::8a2e:370:7334", EntityType::kIp));
  EXPECT_EQ(Kept("v6 2001:0db8:0000:0000:0000:ff00:0042:8329."), One("2001:0db8:0000:0000:0000:ff00:0042:8329", EntityType::kIp));
  EXPECT_EQ(Kept("link fe80::1 up"), One("fe80::1", EntityType::kIp));
  EXPECT_TRUE(Kept("not 256.1.1.1 nor 1.2.3 nor a@b").empty());
  // A dotted quad whose digits would spell a mobile (19216878125) is an address,
  // next to CJK text and after a comma too.
  EXPECT_EQ(Kept("用户反映服务器192.168.78.125无法访问"), One("192.168.78.125", EntityType::kIp));
  EXPECT_EQ(Kept("来自IP 175.204.14.160，时间戳"), One("175.204.14.160", EntityType::kIp));
  EXPECT_EQ(Kept("wei@163.com,192.168.60.250,2024").back(), (Found{"192.168.60.250", EntityType::kIp}));
  EXPECT_TRUE(Kept("at 14:30:15 and std::vector").empty());
}

TEST(Patterns, PassportsPlatesCodesSsn) {
  EXPECT_EQ(Kept("护照 E12345678。"), One("E12345678", EntityType::kPassport));
  EXPECT_EQ(Kept("G12345678 到"), One("G12345678", EntityType::kPassport));
  EXPECT_EQ(Kept("passport no: K1234567."), One("K1234567", EntityType::kPassport));
  EXPECT_TRUE(Kept("型号 K1234567").empty());  // generic form needs the keyword
  EXPECT_TRUE(Kept("单号 E12345678").empty());
  EXPECT_EQ(Kept("车牌京A12345。"), One("京A12345", EntityType::kPlate));
  EXPECT_EQ(Kept("车牌沪B·D12345。"), One("沪B·D12345", EntityType::kPlate));
  EXPECT_EQ(Kept("车牌粤B 12345F。"), One("粤B 12345F", EntityType::kPlate));
  EXPECT_EQ(Kept("车牌京AD12345。"), One("京AD12345", EntityType::kPlate));
  EXPECT_TRUE(Kept("车牌川A1234。京A123456。京ABCDEF").empty());
  // 91440300708461136T: GB 32100 check character T, computed by python3.
  EXPECT_EQ(Kept("信用代码 91440300708461136T。"), One("91440300708461136T", EntityType::kCreditCode));
  EXPECT_EQ(Kept("代码91350100M00010000P，"), One("91350100M00010000P", EntityType::kCreditCode));
  EXPECT_TRUE(Kept("错码 91440300708461136U").empty());
  EXPECT_EQ(Kept("SSN 123-45-6789."), One("123-45-6789", EntityType::kSsn));
  EXPECT_TRUE(Kept("666-12-3456 000-12-3456 912-12-3456 123-00-4567 123-45-0000 1-123-45-6789").empty());
}

TEST(Patterns, SpansSortedDisjointOnOriginal) {
  const std::string s = "张三 13800138000, a@b.com, 192.168.0.1, 京A12345, 11010519491231002X";
  const auto spans = Redactor().Detect(s);
  ASSERT_EQ(spans.size(), 5u);
  for (size_t k = 1; k < spans.size(); ++k) EXPECT_LE(spans[k - 1].end, spans[k].start);
  EXPECT_EQ(spans[0].start, 3);  // "张三 " is 3 code points
  EXPECT_EQ(spans[0].end, 14);
}

TEST(Patterns, ResolveOverlapsLongestThenConfident) {
  std::vector<Span> in = {{0, 5, kPhone, 0.9f}, {0, 8, kCard, 0.6f}, {7, 10, kId, 0.99f}, {8, 10, kId, 0.5f}};
  const auto out = ResolveOverlaps(in);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], (Span{0, 8, kCard}));
  EXPECT_EQ(out[1], (Span{8, 10, kId}));
}

// The tagger's spans: pattern spans win where they overlap.
class FixedTagger : public SpanTagger {
 public:
  explicit FixedTagger(std::vector<Span> s) : spans_(std::move(s)) {}
  std::vector<Span> Tag(std::u32string_view) const override { return spans_; }

 private:
  std::vector<Span> spans_;
};

TEST(Patterns, TaggerMergedPatternsWin) {
  // "张三 13800138000 住北京": PERSON [0,2), a wrong PERSON over the phone [3,8), ADDRESS [16,18).
  FixedTagger tagger({{0, 2, EntityType::kPerson, 0.9f}, {3, 8, EntityType::kPerson, 0.99f},
                      {16, 18, EntityType::kAddress, 0.8f}, {15, 17, EntityType::kOrg, 0.2f}});
  const auto spans = Redactor(&tagger).Detect("张三 13800138000 住北京");
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0], (Span{0, 2, EntityType::kPerson}));
  EXPECT_EQ(spans[1], (Span{3, 14, kPhone}));
  EXPECT_EQ(spans[2], (Span{16, 18, EntityType::kAddress}));
}

TEST(Patterns, PlausibleDate) {
  EXPECT_TRUE(PlausibleDate(U"20000229"));
  EXPECT_FALSE(PlausibleDate(U"19000229"));
  EXPECT_FALSE(PlausibleDate(U"20231131"));
  EXPECT_FALSE(PlausibleDate(U"18991231"));
}

}  // namespace
}  // namespace myriad::edge
