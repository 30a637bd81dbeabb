// The corpus generator: every span covers a value of the planted form (checked
// with independent format rules and the check characters), decoys are the
// invalid look-alikes, the splits draw from disjoint lexicons, and the same
// (seed, split) gives the same documents.
#include "edge/corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <set>

#include "data/test_util.h"
#include "edge/checksums.h"

namespace myriad::edge {
namespace {

// Digits and letters with zero-width spaces removed, full-width digits made ASCII, separators dropped.
std::string Compact(const std::string& s) {
  std::string out;
  for (char32_t c : DecodeUtf8(s)) {
    if (c >= 0xFF10 && c <= 0xFF19) c = c - 0xFF10 + U'0';
    if (c == 0x200B || c == U' ' || c == U'-') continue;
    out += EncodeUtf8(std::u32string(1, c));
  }
  return out;
}

bool AllDigits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool StartsWithAny(const std::string& s, const std::vector<std::string>& v) {
  for (const std::string& p : v)
    if (s.rfind(p, 0) == 0) return true;
  return false;
}

bool EndsWithAny(const std::string& s, const std::vector<std::string>& v) {
  for (const std::string& p : v)
    if (s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0) return true;
  return false;
}

const std::vector<LabelledDoc>& Docs(Split split) {
  static const std::vector<LabelledDoc> train = GenerateCorpus(7, Split::kTrain, 400);
  static const std::vector<LabelledDoc> held = GenerateCorpus(7, Split::kHeldOut, 400);
  return split == Split::kTrain ? train : held;
}

TEST(Corpus, SpansCoverWellFormedValues) {
  for (Split split : {Split::kTrain, Split::kHeldOut}) {
    std::vector<std::string> surnames = LexiconEntries("cn_surname", split), first = LexiconEntries("en_first", split),
                             places = LexiconEntries("cn_place", split);
    std::set<std::string> last, given;
    for (const std::string& g : LexiconEntries("cn_given", split)) given.insert(g);
    for (const std::string& l : LexiconEntries("en_last", split)) last.insert(l);
    std::set<EntityType> seen;
    std::set<std::string> kinds, langs;
    bool full_width = false, zero_width = false;
    for (const LabelledDoc& d : Docs(split)) {
      kinds.insert(d.kind);
      langs.insert(d.lang);
      const int64_t n = static_cast<int64_t>(DecodeUtf8(d.text).size());
      int64_t prev_end = 0;
      for (const Span& s : d.spans) {
        ASSERT_GE(s.start, prev_end) << d.id;  // sorted, disjoint
        ASSERT_LT(s.start, s.end) << d.id;
        ASSERT_LE(s.end, n) << d.id;
        prev_end = s.end;
        seen.insert(s.type);
        const std::string v = SpanText(d.text, s), c = Compact(v);
        ASSERT_FALSE(v.empty());
        EXPECT_NE(v.front(), ' ');
        EXPECT_NE(v.back(), ' ');
        full_width |= v.find("\xEF\xBC") != std::string::npos;  // U+FF10.. in UTF-8
        zero_width |= v.find("\u200b") != std::string::npos;
        SCOPED_TRACE(d.id + ": " + EntityTypeName(s.type) + " '" + v + "'");
        switch (s.type) {
          case EntityType::kPerson:
            if (std::regex_search(v, std::regex("^[A-Za-z]"))) {
              const size_t sp = v.rfind(' ');
              ASSERT_NE(sp, std::string::npos);
              EXPECT_TRUE(last.count(v.substr(sp + 1)));
              EXPECT_TRUE(StartsWithAny(v, first) || std::regex_match(v.substr(0, sp), std::regex("[A-Z]\\.")));
            } else {
              // Exactly a surname and a given name of this split's lexicons (no title inside).
              bool split_ok = false;
              for (const std::string& sn : surnames)
                split_ok |= v.rfind(sn, 0) == 0 && given.count(v.substr(sn.size()));
              EXPECT_TRUE(split_ok);
            }
            break;
          case EntityType::kAddress:
            if (std::regex_search(v, std::regex("^[0-9]"))) {
              EXPECT_TRUE(std::regex_search(v, std::regex(", [A-Z][A-Za-z .]+, [A-Z]{2} [0-9]{5}$")));
            } else {
              EXPECT_TRUE(StartsWithAny(v, places));
              EXPECT_TRUE(EndsWithAny(v, {"号", "室", "层"}));
            }
            break;
          case EntityType::kOrg:
            EXPECT_TRUE(EndsWithAny(v, {"公司", "分行", "支行", "营业部", "Ltd.", "Inc.", "LLC", "Co.", "Group",
                                        "Corporation", "Bank"}));
            break;
          case EntityType::kResidentId:
            if (c.size() == 18) {
              EXPECT_TRUE(ResidentIdCheckValid(c));
            } else {
              EXPECT_TRUE(c.size() == 15 && AllDigits(c));
            }
            break;
          case EntityType::kPhone: {
            std::string digits;
            for (char ch : c) if (ch >= '0' && ch <= '9') digits += ch;
            EXPECT_GE(digits.size(), 10u);
            EXPECT_LE(digits.size(), 13u);
            break;
          }
          case EntityType::kBankCard:
            EXPECT_TRUE(AllDigits(c) && c.size() >= 16 && c.size() <= 19 && LuhnValid(c));
            EXPECT_TRUE(c.rfind("62", 0) == 0 || c[0] == '4' || (c[0] == '5' && c[1] >= '1' && c[1] <= '5'));
            break;
          case EntityType::kEmail:
            EXPECT_TRUE(std::regex_match(v, std::regex("[a-z0-9._-]+@[a-z0-9.-]+\\.[a-z]+")));
            break;
          case EntityType::kUrl: EXPECT_TRUE(std::regex_match(v, std::regex("https?://[a-z0-9./?=_-]+"))); break;
          case EntityType::kIp:
            EXPECT_TRUE(std::regex_match(v, std::regex("([0-9]{1,3}\\.){3}[0-9]{1,3}")) ||
                        std::regex_match(v, std::regex("2001:db8:[0-9a-f:]+")));
            break;
          case EntityType::kPassport: EXPECT_TRUE(std::regex_match(v, std::regex("[A-Z]{1,2}[0-9]{7,8}")) && v.size() == 9); break;
          case EntityType::kPlate:
            EXPECT_TRUE(std::regex_search(v, std::regex("[A-Z](·)?[A-Z0-9]{5,6}$")));
            break;
          case EntityType::kCreditCode: EXPECT_TRUE(CreditCodeCheckValid(v)); break;
          case EntityType::kSsn: EXPECT_TRUE(std::regex_match(v, std::regex("[0-8][0-9]{2}-[0-9]{2}-[0-9]{4}"))); break;
        }
      }
      for (const Span& s : d.decoys) {
        const std::string v = SpanText(d.text, s);
        SCOPED_TRACE(d.id + ": decoy " + EntityTypeName(s.type) + " '" + v + "'");
        for (const Span& g : d.spans) EXPECT_TRUE(g.end <= s.start || s.end <= g.start);
        if (s.type == EntityType::kResidentId) {
          EXPECT_TRUE(v.size() == 18 && !ResidentIdCheckValid(v));
        }
        if (s.type == EntityType::kBankCard && AllDigits(v)) {
          EXPECT_FALSE(LuhnValid(v));
        }
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kNumEntityTypes)) << SplitName(split);
    EXPECT_EQ(kinds.size(), 5u);
    EXPECT_EQ(langs, (std::set<std::string>{"zh", "en", "mixed"}));
    EXPECT_TRUE(full_width);
    EXPECT_TRUE(zero_width);
  }
}

TEST(Corpus, DecoysOfEveryKindAppear) {
  std::set<EntityType> types;
  int64_t bad_ids = 0, orders = 0;
  for (const LabelledDoc& d : Docs(Split::kTrain))
    for (const Span& s : d.decoys) {
      types.insert(s.type);
      const std::string v = SpanText(d.text, s);
      bad_ids += s.type == EntityType::kResidentId;
      orders += s.type == EntityType::kBankCard && AllDigits(v) && v.size() == 16;
    }
  EXPECT_GT(bad_ids, 0);
  EXPECT_GT(orders, 0);
  EXPECT_TRUE(types.count(EntityType::kPhone) && types.count(EntityType::kPassport));
}

TEST(Corpus, SplitsShareNoLexiconEntry) {
  for (const std::string& cat : LexiconCategories()) {
    const auto a = LexiconEntries(cat, Split::kTrain), b = LexiconEntries(cat, Split::kHeldOut);
    if (IsClosedLexicon(cat)) {  // the same list on both sides
      EXPECT_EQ(a, b) << cat;
      continue;
    }
    EXPECT_FALSE(a.empty()) << cat;
    EXPECT_FALSE(b.empty()) << cat;
    EXPECT_LT(b.size(), a.size()) << cat;
    for (const std::string& e : b) EXPECT_EQ(std::find(a.begin(), a.end(), e), a.end()) << cat << " " << e;
  }
  // And in the documents: no name, address or organisation of the held-out
  // split is written in a training document.
  std::set<std::string> train_values;
  for (const LabelledDoc& d : Docs(Split::kTrain))
    for (const Span& s : d.spans)
      if (s.type == EntityType::kPerson || s.type == EntityType::kAddress || s.type == EntityType::kOrg)
        train_values.insert(SpanText(d.text, s));
  int64_t checked = 0;
  for (const LabelledDoc& d : Docs(Split::kHeldOut))
    for (const Span& s : d.spans)
      if (s.type == EntityType::kPerson || s.type == EntityType::kAddress || s.type == EntityType::kOrg) {
        ++checked;
        EXPECT_EQ(train_values.count(SpanText(d.text, s)), 0u) << SpanText(d.text, s);
      }
  EXPECT_GT(checked, 1000);
}

TEST(Corpus, Deterministic) {
  for (int64_t i : {0, 5, 17}) {
    EXPECT_EQ(DocToJsonLine(GenerateDoc(3, Split::kTrain, i)), DocToJsonLine(GenerateDoc(3, Split::kTrain, i)));
    EXPECT_NE(DocToJsonLine(GenerateDoc(3, Split::kTrain, i)), DocToJsonLine(GenerateDoc(4, Split::kTrain, i)));
    EXPECT_NE(GenerateDoc(3, Split::kTrain, i).text, GenerateDoc(3, Split::kHeldOut, i).text);
  }
}

TEST(Corpus, JsonlRoundTripAndErrors) {
  const auto docs = GenerateCorpus(11, Split::kHeldOut, 20);
  TempDir tmp("corpus_rt");
  const std::string path = tmp.path() + "/corpus_rt.jsonl";
  ASSERT_TRUE(WriteJsonl(path, docs).ok());
  auto back = ReadJsonl(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ((*back)[i].text, docs[i].text);
    EXPECT_EQ((*back)[i].spans, docs[i].spans);
    EXPECT_EQ((*back)[i].decoys, docs[i].decoys);
    EXPECT_EQ((*back)[i].kind, docs[i].kind);
  }
  // A span beyond the text, on line 2.
  const std::string bad = tmp.path() + "/corpus_bad.jsonl";
  FILE* f = std::fopen(bad.c_str(), "w");
  std::fprintf(f, "%s\n{\"text\":\"abc\",\"spans\":[{\"start\":1,\"end\":9,\"type\":\"PERSON\"}]}\n",
               DocToJsonLine(docs[0]).c_str());
  std::fclose(f);
  auto r = ReadJsonl(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("corpus_bad.jsonl:2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(DocFromJsonLine("{\"text\":\"abc\",\"spans\":[{\"start\":0,\"end\":1,\"type\":\"NOPE\"}]}").ok());
  EXPECT_FALSE(DocFromJsonLine("not json").ok());
}

}  // namespace
}  // namespace myriad::edge

namespace myriad::edge {
namespace {

TEST(PlainTextDocs, SplitsByTextCutsAtLinesAndSkipsNamedPieces) {
  std::vector<std::string> texts;
  for (int i = 0; i < 40; ++i) {
    std::string t;
    for (int l = 0; l < 12; ++l) t += "line " + std::to_string(i) + "." + std::to_string(l) + " of plain words here\n";
    texts.push_back(t);
  }
  texts.push_back(std::string(60, 'x') + " said Mark Twain\n");  // two capitalised words: left out
  texts.push_back(std::string(60, 'y') + "\n-- an attribution\n");  // "--": left out
  const auto train = PlainTextDocs(texts, Split::kTrain, 1000, 3);
  const auto held = PlainTextDocs(texts, Split::kHeldOut, 1000, 3);
  ASSERT_FALSE(train.empty());
  ASSERT_FALSE(held.empty());
  std::set<std::string> seen;
  for (const auto& d : train) {
    EXPECT_TRUE(d.spans.empty());
    EXPECT_EQ(d.kind, "plain");
    const size_t n = DecodeUtf8(d.text).size();
    EXPECT_GE(n, 40u);
    EXPECT_LE(n, 400u);
    EXPECT_EQ(d.text.find("Twain"), std::string::npos);
    EXPECT_EQ(d.text.find("--"), std::string::npos);
    seen.insert(d.text);
  }
  for (const auto& d : held) EXPECT_FALSE(seen.count(d.text)) << d.text;  // the splits never share a piece
  // Deterministic in the seed; `count` caps.
  EXPECT_EQ(PlainTextDocs(texts, Split::kTrain, 1000, 3)[0].text, train[0].text);
  EXPECT_EQ(PlainTextDocs(texts, Split::kTrain, 2, 3).size(), 2u);
}

}  // namespace
}  // namespace myriad::edge
