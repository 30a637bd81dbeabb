// Documents assembled from known entities, known decoys and filler text, so
// that the expected spans and the expected redaction follow from how each
// document was built: detection finds exactly the entities, the vault keeps
// one placeholder per entity across documents, Restore gives back the
// document, and StreamRestorer does so under random cuts.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "edge/redact.h"

namespace myriad::edge {
void PrintTo(const Span& s, std::ostream* os) {
  *os << EntityTypeName(s.type) << "[" << s.start << "," << s.end << ")";
}
namespace {

struct Known {
  const char* text;
  EntityType type;
  int entity;  // forms of one entity share this number
};

// Check characters of the IDs, cards and credit code computed by python3 apart
// from the code under test (GB 11643, Luhn, GB 32100 formulas).
const Known kEntities[] = {
    {"110105199003071239", EntityType::kResidentId, 1},
    {"110105 19900307 1239", EntityType::kResidentId, 1},
    {"11010519491231002X", EntityType::kResidentId, 2},
    {"11010519491231002x", EntityType::kResidentId, 2},
    {"110105900307123", EntityType::kResidentId, 3},
    {"+86 138-0013-8000", EntityType::kPhone, 4},
    {"138 0013 8000", EntityType::kPhone, 4},
    {"(+86) 138.0013.8000", EntityType::kPhone, 4},
    {"0086 13800138000", EntityType::kPhone, 4},
    {"１３９００１３９０００", EntityType::kPhone, 5},
    {"139\u200B0013\u200B9000", EntityType::kPhone, 5},
    {"010-12345678", EntityType::kPhone, 6},
    {"(010) 1234 5678", EntityType::kPhone, 6},
    {"(415) 555-0132", EntityType::kPhone, 7},
    {"+44 20 7946 0958", EntityType::kPhone, 8},
    {"6222 0212 3456 7890 128", EntityType::kBankCard, 9},
    {"6222021234567890128", EntityType::kBankCard, 9},
    {"4111-1111-1111-1111", EntityType::kBankCard, 10},
    {"Alice.Smith@Example.COM", EntityType::kEmail, 11},
    {"alice.smith@example.com", EntityType::kEmail, 11},
    {"https://example.com/a?b=1", EntityType::kUrl, 12},
    {"192.168.1.255", EntityType::kIp, 13},
    {"fe80::1", EntityType::kIp, 14},
    {"2001:db8::8a2e:370:7334", EntityType::kIp, 15},
    {"E12345678", EntityType::kPassport, 16},
    {"G12345678", EntityType::kPassport, 17},
    {"京A12345", EntityType::kPlate, 18},
    {"沪B·D12345", EntityType::kPlate, 19},
    {"沪BD12345", EntityType::kPlate, 19},
    {"粤B 12345F", EntityType::kPlate, 20},
    {"91440300708461136T", EntityType::kCreditCode, 21},
    {"123-45-6789", EntityType::kSsn, 22},
};
// Never redacted.
const char* kDecoys[] = {"110105199003071238", "20231105143015", "2023-11-05 14:30:15", "¥13,800.00",
                         "4111111111111112",   "256.1.1.1",      "川A1234",              "[1]",
                         "SF13800138000",      "12800138000",    "138001380001",         "666-12-3456",
                         "91440300708461136U", "110105199013071232"};
// No digits, no province characters, no order/invoice keywords; Latin words
// only with spaces around; a zero-width character never alone (it would join two numbers).
const char* kFillers[] = {"我们明天见面", "请查收附件", "谢谢你的帮助", "，", "。", "：", "——", "（见上）", "好的 ",
                          " and ", " please note: ", "\u200B好", "\n"};

TEST(RedactProperty, BuiltDocumentsRoundTrip) {
  std::mt19937 rng(20261204);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  Vault vault;
  const Redactor redactor;
  std::vector<std::string> docs, redacted;
  std::set<int> used;
  for (int doc = 0; doc < 2000; ++doc) {
    std::string text;
    std::vector<Span> want;
    std::vector<std::pair<size_t, const Known*>> where;  // byte offset in `text` of each entity
    const int parts = 1 + static_cast<int>(pick(6));
    for (int p = 0; p < parts; ++p) {
      text += kFillers[pick(std::size(kFillers))];
      if (pick(4) == 0) {
        text += kDecoys[pick(std::size(kDecoys))];
      } else {
        const Known& k = kEntities[pick(std::size(kEntities))];
        const int64_t start = static_cast<int64_t>(DecodeUtf8(text).size());
        where.push_back({text.size(), &k});
        used.insert(k.entity);
        text += k.text;
        want.push_back(Span{start, start + static_cast<int64_t>(DecodeUtf8(k.text).size()), k.type});
      }
      text += kFillers[pick(std::size(kFillers))];
    }
    const std::vector<Span> got = redactor.Detect(text);
    ASSERT_EQ(got, want) << text;

    const Redaction r = redactor.Redact(text, &vault);
    // The expected redaction, built from the same pieces: every entity by the
    // vault's placeholder for it (Placeholder adds nothing for a known one).
    const int64_t before = vault.size();
    std::string expect;
    size_t at = 0;
    for (const auto& [off, k] : where) {
      expect += text.substr(at, off - at) + vault.Placeholder(k->type, k->text);
      at = off + std::string_view(k->text).size();
    }
    expect += text.substr(at);
    ASSERT_EQ(vault.size(), before) << "an entity got two placeholders: " << text;
    ASSERT_EQ(r.text, expect);
    docs.push_back(text);
    redacted.push_back(r.text);
  }
  // One vault entry per distinct entity used, whatever its forms.
  EXPECT_EQ(vault.size(), static_cast<int64_t>(used.size()));

  for (size_t d = 0; d < docs.size(); ++d) {
    const Restored back = Restore(redacted[d], vault);
    ASSERT_TRUE(back.ok());
    // The form first seen comes back: equal up to each entity's key.
    const Redaction again = redactor.Redact(back.text, &vault);
    EXPECT_EQ(again.text, redacted[d]);
    StreamRestorer sr(&vault);
    std::string streamed;
    for (size_t at = 0; at < redacted[d].size();) {
      const size_t n = 1 + pick(12);
      streamed += sr.Push(std::string_view(redacted[d]).substr(at, n));
      at += n;
    }
    streamed += sr.Finish();
    EXPECT_EQ(streamed, back.text);
  }
}

TEST(RedactProperty, RestoreExactWhenEachEntityHasOneForm) {
  Vault vault;
  const std::string text = "张三 110105199003071239，电话 +86 138-0013-8000；邮箱 a.b@example.com，京A12345。";
  const Redaction r = Redactor().Redact(text, &vault);
  EXPECT_EQ(r.text, "张三 ⟦ID_CN_1⟧，电话 ⟦PHONE_1⟧；邮箱 ⟦EMAIL_1⟧，⟦PLATE_1⟧。");
  EXPECT_EQ(Restore(r.text, vault).text, text);
}

}  // namespace
}  // namespace myriad::edge
