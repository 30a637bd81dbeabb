// Restore over every reformatting a model is known to produce, failing
// closed on placeholders the vault lacks; StreamRestorer equals Restore for
// every one- and two-cut split of several texts.
#include <gtest/gtest.h>

#include <random>

#include "edge/redact.h"

namespace myriad::edge {
namespace {

Vault TestVault() {
  Vault v;
  EXPECT_EQ(v.Placeholder(EntityType::kPerson, "张三"), "⟦PERSON_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPerson, "Li Si"), "⟦PERSON_2⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kPhone, "138 0013 8000"), "⟦PHONE_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kBankCard, "6222 0212 3456 7890 128"), "⟦BANK_CARD_1⟧");
  EXPECT_EQ(v.Placeholder(EntityType::kResidentId, "11010519491231002X"), "⟦ID_CN_1⟧");
  return v;
}

TEST(Restore, CanonicalRepeatedReordered) {
  const Vault v = TestVault();
  const Restored r = Restore("⟦PHONE_1⟧ 是 ⟦PERSON_1⟧ 的，⟦PERSON_2⟧ 和 ⟦PERSON_1⟧；⟦PHONE_1⟧", v);
  EXPECT_EQ(r.text, "138 0013 8000 是 张三 的，Li Si 和 张三；138 0013 8000");
  EXPECT_TRUE(r.ok());
}

TEST(Restore, EveryReformatting) {
  const Vault v = TestVault();
  for (const char* form :
       {"⟦PERSON_1⟧", "⟦person_1⟧", "⟦Person_1⟧", "⟦ PERSON 1 ⟧", "⟦PERSON-1⟧", "⟦PERSON 1⟧", "⟦PERSON1⟧",
        "[[PERSON_1]]", "[[ person_1 ]]", "[PERSON_1]", "[person 1]", "【PERSON_1】", "【 PERSON_1 】", "〚PERSON_1〛",
        "［PERSON_1］", "〖PERSON_1〗", "⟦PERSON_１⟧", "［ＰＥＲＳＯＮ＿１］", "⟦PERSON\u200B_1⟧", "⟦PERSON_01⟧",
        "⟦PERSON_1]", "[[PERSON_1]"}) {
    const Restored r = Restore(std::string("给") + form + "回电", v);
    EXPECT_EQ(r.text, "给张三回电") << form;
    EXPECT_TRUE(r.ok()) << form;
  }
  EXPECT_EQ(Restore("[[BANK_CARD_1]] / ⟦bank card 1⟧ / [BANK-CARD-1] / ⟦BANKCARD_1⟧ / ⟦id cn 1⟧", v).text,
            "6222 0212 3456 7890 128 / 6222 0212 3456 7890 128 / 6222 0212 3456 7890 128 / "
            "6222 0212 3456 7890 128 / 11010519491231002X");
}

TEST(Restore, OrdinaryBracketsLeftAlone) {
  const Vault v = TestVault();
  for (const char* s : {"see [1] and [2, 3]", "[see note]", "[[wiki link]]", "【注意】", "⟦⟧ [] [[]]", "a[i] = b[j+1];",
                        "[PERSON]", "[FIGURE_1]", "〔PERSON_1〕", "x [ y", "⟦PERSON_1"}) {
    const Restored r = Restore(s, v);
    EXPECT_EQ(r.text, s);
    EXPECT_TRUE(r.ok()) << s;
  }
}

TEST(Restore, UnresolvedFailsClosed) {
  const Vault v = TestVault();
  const Restored r = Restore("问 ⟦PERSON_9⟧ 和 [phone 2] 以及 ⟦PERSON_9⟧、⟦ALIEN_1⟧、⟦PERSON_1⟧", v);
  EXPECT_EQ(r.text,
            "问 ⟦unresolved:PERSON_9⟧ 和 ⟦unresolved:PHONE_2⟧ 以及 ⟦unresolved:PERSON_9⟧、⟦unresolved:ALIEN_1⟧、张三");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.unresolved, (std::vector<std::string>{"⟦PERSON_9⟧", "[phone 2]", "⟦ALIEN_1⟧"}));
  // The marker itself is not a placeholder: restoring twice changes nothing more.
  const Restored again = Restore(r.text, v);
  EXPECT_EQ(again.text, r.text);
  EXPECT_TRUE(again.ok());
  // An empty vault resolves nothing.
  const Restored none = Restore("⟦PERSON_1⟧", Vault());
  EXPECT_EQ(none.text, "⟦unresolved:PERSON_1⟧");
}

TEST(Restore, RedactThenRestoreIsExact) {
  Vault v;
  const std::string text = "张三，电话 +86 138-0013-8000，邮箱 a.b@example.com，卡 6222 0212 3456 7890 128。";
  const Redaction red = Redactor().Redact(text, &v);
  EXPECT_EQ(red.text.find("138"), std::string::npos);
  const Restored r = Restore(red.text, v);
  EXPECT_EQ(r.text, text);
}

std::string StreamAll(const Vault& v, const std::string& s, const std::vector<size_t>& cuts,
                      std::vector<std::string>* unresolved) {
  StreamRestorer sr(&v);
  std::string out;
  size_t at = 0;
  for (size_t c : cuts) {
    out += sr.Push(std::string_view(s).substr(at, c - at));
    at = c;
  }
  out += sr.Push(std::string_view(s).substr(at));
  out += sr.Finish();
  *unresolved = sr.unresolved();
  return out;
}

const char* kStreamTexts[] = {
    "⟦PERSON_1⟧ 给 [[phone_1]] 打电话，[1] 不是，【BANK_CARD_1】",
    "[PERSON_9] and ⟦ PERSON 2 ⟧[x][[PERSON_1]]]",
    "［ＰＥＲＳＯＮ＿１］⟦PERSON_1]⟦unresolved:PERSON_9⟧",
    "[[[PERSON_1]] 〚ID CN 1〛 end [",
    "bad \xFF\xE2\x9F [PHONE_1 2] ⟦PHONE_1⟧",
};

TEST(StreamRestorer, EqualsRestoreForEveryOneAndTwoCut) {
  const Vault v = TestVault();
  for (const char* text : kStreamTexts) {
    const std::string s = text;
    const Restored whole = Restore(s, v);
    std::vector<std::string> unresolved;
    for (size_t a = 0; a <= s.size(); ++a) {
      ASSERT_EQ(StreamAll(v, s, {a}, &unresolved), whole.text) << s << " cut " << a;
      ASSERT_EQ(unresolved, whole.unresolved) << s << " cut " << a;
      for (size_t b = a; b <= s.size(); ++b) {
        ASSERT_EQ(StreamAll(v, s, {a, b}, &unresolved), whole.text) << s << " cuts " << a << "," << b;
        ASSERT_EQ(unresolved, whole.unresolved) << s << " cuts " << a << "," << b;
      }
    }
    // One byte at a time.
    std::vector<size_t> every;
    for (size_t k = 1; k < s.size(); ++k) every.push_back(k);
    EXPECT_EQ(StreamAll(v, s, every, &unresolved), whole.text);
  }
}

// Random texts over the characters that matter (brackets of every kind,
// name letters, digits, separators, full-width forms, stray bytes) cut at
// random: the stream still equals Restore.
TEST(StreamRestorer, EqualsRestoreOnRandomTexts) {
  const Vault v = TestVault();
  const char* pieces[] = {"⟦", "⟧", "[", "]", "[[", "]]", "【", "】", "〚", "〛", "［", "］", "〖", "〗", "PERSON", "person",
                          "PHONE", "BANK", "CARD", "ID", "CN", "_", "-", " ", "1", "2", "9", "１", "ＰＥＲＳＯＮ", "＿",
                          "\u200B", "x", "中", "\xE2", "\x9F", "\xFF", ":", "unresolved"};
  std::mt19937 rng(7);
  for (int round = 0; round < 3000; ++round) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int k = 0; k < n; ++k) s += pieces[rng() % std::size(pieces)];
    const Restored whole = Restore(s, v);
    std::vector<size_t> cuts;
    for (size_t k = 1; k < s.size(); ++k)
      if (rng() % 3 == 0) cuts.push_back(k);
    std::vector<std::string> unresolved;
    ASSERT_EQ(StreamAll(v, s, cuts, &unresolved), whole.text) << s;
    ASSERT_EQ(unresolved, whole.unresolved) << s;
  }
}

TEST(StreamRestorer, HoldsBackOnlyAPossiblePlaceholder) {
  const Vault v = TestVault();
  StreamRestorer sr(&v);
  EXPECT_EQ(sr.Push("hello wor"), "hello wor");  // nothing bracket-like: all out
  EXPECT_EQ(sr.Push("ld [1] ⟦PER"), "ld [1] ");  // "[1]" decided, "⟦PER" may still be one
  EXPECT_EQ(sr.Push("SON_1"), "");
  EXPECT_EQ(sr.Push("⟧ ok ["), "张三 ok ");
  EXPECT_EQ(sr.Push("note] \xE2"), "[note] ");     // a cut UTF-8 sequence waits
  EXPECT_EQ(sr.Push("\x80\x94 x"), "\xE2\x80\x94 x");  // an em dash, not a bracket
  EXPECT_EQ(sr.Push("[[PERSON_2]"), "");          // "]]" or "]"?
  EXPECT_EQ(sr.Finish(), "Li Si");
}

}  // namespace
}  // namespace myriad::edge
