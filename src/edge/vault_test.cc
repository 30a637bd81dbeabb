// The vault: one placeholder per entity whatever its written form, JSON
// round trip, atomic file, and one-line errors for malformed input.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "core/env.h"
#include "edge/redact.h"

namespace myriad::edge {
namespace {

TEST(Vault, PlaceholderFormat) {
  EXPECT_EQ(PlaceholderText(EntityType::kPerson, 1), "\u27E6PERSON_1\u27E7");
  EXPECT_EQ(PlaceholderText(EntityType::kBankCard, 12), "\u27E6BANK_CARD_12\u27E7");
}

TEST(Vault, SameEntitySamePlaceholder) {
  Vault v;
  EXPECT_EQ(v.Placeholder(EntityType::kPhone, "138 0013 8000"), "⟦PHONE_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPhone, "+86 13800138000"), "⟦PHONE_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPhone, "0086-138-0013-8000"), "⟦PHONE_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPhone, "１３８００１３８０００"), "⟦PHONE_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPhone, "13900139000"), "⟦PHONE_2⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kEmail, "Alice@Example.com"), "⟦EMAIL_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kEmail, "alice@example.COM"), "⟦EMAIL_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPerson, "Zhang  San"), "⟦PERSON_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPerson, "Zhang San"), "⟦PERSON_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPerson, "Li Si"), "⟦PERSON_2⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kResidentId, "11010519491231002x"), "⟦ID_CN_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kResidentId, "110105 19491231 002X"), "⟦ID_CN_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPlate, "沪B·D12345"), "⟦PLATE_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPlate, "沪BD12345"), "⟦PLATE_1⟧");
  // Same digits, another type: another entity.
  EXPECT_EQ(v.Placeholder(EntityType::kBankCard, "13800138000"), "⟦BANK_CARD_1⟧");
  EXPECT_EQ(v.size(), 8);  // PHONE 2, EMAIL 1, PERSON 2, ID_CN 1, PLATE 1, BANK_CARD 1
  // The form first seen is what comes back.
  ASSERT_NE(v.Original(EntityType::kPhone, 1), nullptr);
  EXPECT_EQ(*v.Original(EntityType::kPhone, 1), "138 0013 8000");
  EXPECT_EQ(v.Original(EntityType::kPhone, 3), nullptr);
  EXPECT_EQ(v.Original(EntityType::kUrl, 1), nullptr);
}

TEST(Vault, RedactAcrossDocumentsConsistent) {
  Vault v;
  Redactor r;
  const Redaction a = r.Redact("电话 138 0013 8000，邮箱 Bob@x.org", &v);
  const Redaction b = r.Redact("Mail bob@X.ORG or +86 13800138000 or 13900139000.", &v);
  EXPECT_EQ(a.text, "电话 ⟦PHONE_1⟧，邮箱 ⟦EMAIL_1⟧");
  EXPECT_EQ(b.text, "Mail ⟦EMAIL_1⟧ or ⟦PHONE_1⟧ or ⟦PHONE_2⟧.");
  // Bytes outside spans survive, malformed ones included.
  const Redaction c = r.Redact("bad \xFF byte 13800138000 \xC3", &v);
  EXPECT_EQ(c.text, "bad \xFF byte ⟦PHONE_1⟧ \xC3");
}

TEST(Vault, JsonRoundTrip) {
  Vault v;
  v.Placeholder(EntityType::kPhone, "138 0013 8000");
  v.Placeholder(EntityType::kPerson, "张三");
  v.Placeholder(EntityType::kPerson, "\"quoted\" \\ name");
  Result<Vault> back = Vault::FromJson(v.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), v.ToJson());
  EXPECT_EQ(*back->Original(EntityType::kPerson, 2), "\"quoted\" \\ name");
  // Keys are rebuilt on load: another form of the phone still maps to PHONE_1.
  EXPECT_EQ(back->Placeholder(EntityType::kPhone, "+86 13800138000"), "⟦PHONE_1⟧");
  EXPECT_EQ(back->Placeholder(EntityType::kPerson, "李四"), "⟦PERSON_3⟧");
}

TEST(Vault, LoadedIndicesContinue) {
  Result<Vault> v = Vault::FromJson(
      R"({"format": "myriad-vault-1", "entries": [{"type": "PHONE", "index": 3, "original": "13800138000"},
          {"type": "person", "index": 1, "original": "张三"}]})");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->Placeholder(EntityType::kPhone, "13900139000"), "⟦PHONE_4⟧");
  EXPECT_EQ(v->Placeholder(EntityType::kPhone, "+86 138 0013 8000"), "⟦PHONE_3⟧");
  EXPECT_EQ(v->Placeholder(EntityType::kEmail, "a@b.com"), "⟦EMAIL_1⟧");
  EXPECT_EQ(v->Placeholder(EntityType::kPerson, "张三"), "⟦PERSON_1⟧");
  EXPECT_EQ(v->Original(EntityType::kPhone, 1), nullptr);
}

TEST(Vault, MalformedRefusedWithOneLine) {
  const char* bad[] = {
      "", "{", "[]", "{\"entries\": 3}", "{\"format\": \"other\", \"entries\": []}",
      "{\"entries\": [{\"type\": \"ALIEN\", \"index\": 1, \"original\": \"x\"}]}",
      "{\"entries\": [{\"type\": \"PHONE\", \"index\": 0, \"original\": \"x\"}]}",
      "{\"entries\": [{\"type\": \"PHONE\", \"index\": \"1\", \"original\": \"x\"}]}",
      "{\"entries\": [{\"type\": \"PHONE\", \"index\": 1}]}",
      "{\"entries\": [{\"type\": \"PHONE\", \"index\": 1, \"original\": \"a\"}, {\"type\": \"phone\", \"index\": 1, \"original\": \"b\"}]}",
  };
  for (const char* b : bad) {
    Result<Vault> v = Vault::FromJson(b);
    ASSERT_FALSE(v.ok()) << b;
    EXPECT_EQ(v.status().message().find('\n'), std::string::npos) << v.status().message();
    EXPECT_EQ(v.status().message().rfind("malformed vault", 0), 0u) << v.status().message();
  }
  EXPECT_TRUE(Vault::FromJson("{\"entries\": []}").ok());
}

TEST(Vault, SaveLoadFiles) {
  char tmpl[] = "/tmp/myriad-vault-test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, path = dir + "/v.json";
  Vault v;
  v.Placeholder(EntityType::kEmail, "a@b.com");
  ASSERT_TRUE(v.Save(path).ok());
  EXPECT_FALSE(Env::Default()->FileExists(path + ".tmp"));
  Result<Vault> back = Vault::Load(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back->Original(EntityType::kEmail, 1), "a@b.com");
  { std::ofstream(path) << "{\"entries\": [1]}"; }
  Result<Vault> bad = Vault::Load(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind(path + ": malformed vault", 0), 0u) << bad.status().message();
  Result<Vault> missing = Vault::Load(dir + "/none.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("none.json"), std::string::npos);
  ASSERT_TRUE(Env::Default()->RemoveAll(dir).ok());
}

}  // namespace
}  // namespace myriad::edge
