// Hugging Face tokenizer.json (byte-level BPE) and foreign SentencePiece
// models through myriad::Tokenizer, on hand-built files whose ids follow
// from the format's rules. Parity with Hugging Face's own library on real
// text is tests/hf/tokenizer_parity.sh.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/rng.h"
#include "data/hf_pretokenizer.h"
#include "data/test_util.h"
#include "data/text_conventions.h"
#include "data/tokenizer.h"

namespace myriad {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// GPT-2's byte-to-character table, written out from its definition: bytes
// '!'..'~', 0xA1..0xAC and 0xAE..0xFF are themselves, the other 68 become
// U+0100, U+0101, ... in byte order.
std::string ByteChar(unsigned char b) {
  static const std::vector<std::string> table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int c = 0; c < 256; ++c) {
      const bool self = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      const int cp = self ? c : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[c] = s;
    }
    return t;
  }();
  return table[b];
}

std::string Mapped(std::string_view raw) {
  std::string out;
  for (unsigned char c : raw) out += ByteChar(c);
  return out;
}

// A byte-level BPE tokenizer.json: byte b is token b; merge k (raw text
// pairs) makes token 256 + k unless its result exists already.
json TinyTokenizer(const std::vector<std::pair<std::string, std::string>>& merges, bool pair_format = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(static_cast<unsigned char>(b))] = b;
  json list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    const std::string merged = Mapped(a + b);
    if (!vocab.contains(merged)) vocab[merged] = next++;
    if (pair_format) {
      list.push_back({Mapped(a), Mapped(b)});
    } else {
      list.push_back(Mapped(a) + " " + Mapped(b));
    }
  }
  return json{
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", vocab}, {"merges", list}}},
  };
}

json Added(int id, const std::string& content, bool special, json extra = json::object()) {
  json t = {{"id", id},         {"content", content}, {"single_word", false}, {"lstrip", false},
            {"rstrip", false},  {"normalized", !special}, {"special", special}};
  t.update(extra);
  return t;
}

class HfTokenizerTest : public ::testing::Test {
 protected:
  HfTokenizerTest() : dir_("hftok") {}
  std::string Write(const json& j, const std::string& name = "tokenizer.json") {
    return WriteText(j.dump(), name);
  }
  std::string WriteText(const std::string& text, const std::string& name) {
    const std::string path = dir_.path() + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  Tokenizer Load(const json& j) {
    auto tok = Tokenizer::Load(Write(j));
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    return std::move(tok.value());
  }
  // The error of loading `j`: one line, naming the file.
  std::string LoadError(const json& j) { return ErrorOf(Write(j)); }
  std::string ErrorOf(const std::string& path) {
    auto tok = Tokenizer::Load(path);
    EXPECT_FALSE(tok.ok());
    if (tok.ok()) return "";
    const std::string m = tok.status().message();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
    return m;
  }
  TempDir dir_;
};

Ids Bytes(std::string_view s) {
  Ids ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST_F(HfTokenizerTest, MergesApplyByRankThenLeftmost) {
  // ("b","c") has rank 0, so "abc" is a + bc, and ("a","bc") joins them.
  Tokenizer t1 = Load(TinyTokenizer({{"b", "c"}, {"a", "b"}, {"a", "bc"}}));
  EXPECT_EQ(t1.kind(), TokenizerKind::kHuggingFaceBpe);
  EXPECT_EQ(t1.Encode("abc"), (Ids{258}));
  EXPECT_EQ(t1.Encode("ab"), (Ids{257}));
  // Without ("a","bc") the rank-0 merge still wins over ("a","b").
  Tokenizer t2 = Load(TinyTokenizer({{"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(t2.Encode("abc"), (Ids{'a', 256}));
  // Equal ranks: the leftmost pair first.
  Tokenizer t3 = Load(TinyTokenizer({{"a", "a"}, {"aa", "aa"}}));
  EXPECT_EQ(t3.Encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t3.Encode("aaaa"), (Ids{257}));
  EXPECT_EQ(t3.Encode("aaaaa"), (Ids{257, 'a'}));
  EXPECT_EQ(t3.Decode(t3.Encode("aaaaa")), "aaaaa");
}

TEST_F(HfTokenizerTest, MergesNeverCrossPreTokens) {
  // GPT-2's pattern: "a" and " b" are separate words, " " joins the word after it.
  Tokenizer t = Load(TinyTokenizer({{"a", " "}, {" ", "b"}}));
  EXPECT_EQ(t.Encode("a b"), (Ids{'a', 257}));
  EXPECT_EQ(t.PieceName(257), Mapped(" b"));
  EXPECT_EQ(t.PieceName(257), "\xC4\xA0" "b");  // "Ġb"
  EXPECT_EQ(t.DecodePiece(257), " b");
}

TEST_F(HfTokenizerTest, BothMergeFormatsGiveTheSameIds) {
  const std::vector<std::pair<std::string, std::string>> merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}};
  Tokenizer strings = Load(TinyTokenizer(merges, false));
  Tokenizer pairs = Load(TinyTokenizer(merges, true));
  EXPECT_EQ(strings.Encode("hello"), (Ids{259}));
  EXPECT_EQ(pairs.Encode("hello"), (Ids{259}));
  EXPECT_EQ(pairs.Encode("hello hell"), (Ids{259, ' ', 258}));
}

TEST_F(HfTokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocab) {
  json j = TinyTokenizer({});
  j["model"]["vocab"][Mapped("xyz")] = 256;  // no merge makes it
  Tokenizer plain = Load(j);
  EXPECT_EQ(plain.Encode("xyz"), Bytes("xyz"));
  j["model"]["ignore_merges"] = true;
  Tokenizer ignoring = Load(j);
  EXPECT_EQ(ignoring.Encode("xyz xyz"), (Ids{256, ' ', 'x', 'y', 'z'}));
}

TEST_F(HfTokenizerTest, AddedTokensAreSplitOutFirst) {
  json j = TinyTokenizer({{"<", "|"}});
  j["added_tokens"] = {Added(300, "<|im_start|>", true), Added(301, "<x>", true), Added(302, "<x>y", false),
                       Added(303, "bc", false), Added(304, "abc", false)};
  Tokenizer t = Load(j);
  EXPECT_EQ(t.vocab_size(), 305);
  EXPECT_EQ(t.Encode("a<|im_start|>b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(t.Encode("<|im_start|><|im_start|>"), (Ids{300, 300}));
  EXPECT_EQ(t.Encode("<|im_sta"), (Ids{256, 'i', 'm', '_', 's', 't', 'a'}));
  EXPECT_EQ(t.Encode("<x>yz"), (Ids{302, 'z'}));  // the longest at a position
  EXPECT_EQ(t.Encode("zabc"), (Ids{'z', 304}));   // the leftmost start
  EXPECT_EQ(t.Decode(t.Encode("a<|im_start|>b")), "a<|im_start|>b");
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(302));
  EXPECT_FALSE(t.is_special('a'));
  EXPECT_EQ(t.PieceName(300), "<|im_start|>");
}

TEST_F(HfTokenizerTest, LstripAndRstripTakeWhiteSpaceAround) {
  json j = TinyTokenizer({});
  j["added_tokens"] = {Added(300, "<m>", true, {{"lstrip", true}, {"rstrip", true}}), Added(301, "<n>", true)};
  Tokenizer t = Load(j);
  EXPECT_EQ(t.Encode("a  <m>\t\nb"), (Ids{'a', 300, 'b'}));
  // Without strip the spaces stay: GPT-2's pattern makes "a", "  " and " ", " b".
  EXPECT_EQ(t.Encode("a  <n>  b"), (Ids{'a', ' ', ' ', 301, ' ', ' ', 'b'}));
  // White_Space as Hugging Face's lstrip has it: U+0085 and U+3000 yes, U+FEFF no.
  EXPECT_EQ(t.Encode("a\xC2\x85\xE3\x80\x80<m>"), (Ids{'a', 300}));
  EXPECT_EQ(t.Encode("a\xEF\xBB\xBF<m>"), (Ids{'a', 0xEF, 0xBB, 0xBF, 300}));
}

TEST_F(HfTokenizerTest, NormalizersRunBeforePreTokenization) {
  json j = TinyTokenizer({});
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(Load(j).Encode("e\xCC\x81"), (Ids{0xC3, 0xA9}));  // e + U+0301 -> é
  j["normalizer"] = {{"type", "NFD"}};
  EXPECT_EQ(Load(j).Encode("\xC3\xA9"), (Ids{'e', 0xCC, 0x81}));
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(Load(j).Encode("\xEF\xAC\x81"), (Ids{'f', 'i'}));  // the ligature ﬁ
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "NFC"}}}}};
  EXPECT_EQ(Load(j).Encode("e\xCC\x81"), (Ids{0xC3, 0xA9}));
}

TEST_F(HfTokenizerTest, NormalizedAddedTokensMatchAfterNormalization) {
  json j = TinyTokenizer({});
  j["normalizer"] = {{"type", "NFC"}};
  j["added_tokens"] = {Added(300, "\xCE\xA9", false)};  // Ω U+03A9, normalized
  // The ohm sign U+2126 is Ω after NFC.
  EXPECT_EQ(Load(j).Encode("x\xE2\x84\xA6"), (Ids{'x', 300}));
  j["added_tokens"] = {Added(300, "\xCE\xA9", false, {{"normalized", false}})};
  EXPECT_EQ(Load(j).Encode("x\xE2\x84\xA6"), (Ids{'x', 0xCE, 0xA9}));
}

TEST_F(HfTokenizerTest, MalformedUtf8BecomesByteTokensAndRoundTrips) {
  Tokenizer t = Load(TinyTokenizer({{"a", "b"}}));
  EXPECT_EQ(t.Encode("ab\xFF" "ab"), (Ids{256, 0xFF, 256}));
  EXPECT_EQ(t.Encode("\xE4\xB8"), (Ids{0xE4, 0xB8}));
  Rng rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng.Below(30));
    for (int i = 0; i < n; ++i) {
      s.push_back(rng.Below(3) == 0 ? static_cast<char>(rng.Below(256)) : "ab \n\t\xC3\xA9<|"[rng.Below(10)]);
    }
    ASSERT_EQ(t.Decode(t.Encode(s)), s);
  }
}

TEST_F(HfTokenizerTest, TemplateBosIsReportedNotAdded) {
  json j = TinyTokenizer({});
  j["added_tokens"] = {Added(300, "<|begin_of_text|>", true), Added(301, "<|end_of_text|>", true)};
  EXPECT_FALSE(Load(j).adds_bos());
  j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel"},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [300], "tokens": ["<|begin_of_text|>"]}}}]})");
  Tokenizer t = Load(j);
  EXPECT_TRUE(t.adds_bos());
  EXPECT_EQ(t.bos_id(), 300);
  EXPECT_EQ(t.eos_id(), 301);  // the Llama 3 end-of-text name
  EXPECT_EQ(t.Encode("hi"), (Ids{'h', 'i'}));
}

TEST_F(HfTokenizerTest, TokenizerConfigNamesBosAndEos) {
  json j = TinyTokenizer({});
  j["added_tokens"] = {Added(300, "<|endoftext|>", true), Added(301, "<|im_end|>", true)};
  const std::string path = Write(j, "model/tokenizer.json");
  auto bare = Tokenizer::Load(path);
  ASSERT_TRUE(bare.ok()) << bare.status().message();
  EXPECT_EQ(bare->eos_id(), 300);
  WriteText(R"({"eos_token": {"content": "<|im_end|>"}, "bos_token": null})", "model/tokenizer_config.json");
  auto configured = Tokenizer::Load(dir_.path() + "/model");  // the folder
  ASSERT_TRUE(configured.ok()) << configured.status().message();
  EXPECT_EQ(configured->path(), path);
  EXPECT_EQ(configured->eos_id(), 301);
  EXPECT_EQ(configured->bos_id(), -1);
}

TEST_F(HfTokenizerTest, SplitSequencesAndDigits) {
  json j = TinyTokenizer({{"1", "2"}, {"12", "3"}});
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(Load(j).Encode("1231234"), (Ids{257, 257, '4'}));
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Digits"}, {"individual_digits", true}};
  EXPECT_EQ(Load(j).Encode("a123"), (Ids{'a', '1', '2', '3'}));
  j["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Digits"}, {"individual_digits", false}};
  EXPECT_EQ(Load(j).Encode("a123"), (Ids{'a', 257}));
}

TEST_F(HfTokenizerTest, AddPrefixSpace) {
  json j = TinyTokenizer({{" ", "a"}});
  j["pre_tokenizer"]["add_prefix_space"] = true;
  Tokenizer t = Load(j);
  EXPECT_EQ(t.Encode("a"), (Ids{256}));
  EXPECT_EQ(t.Encode(" a"), (Ids{256}));
}

TEST_F(HfTokenizerTest, EncodesTheSameOnManyThreads) {
  Tokenizer t = Load(TinyTokenizer({{"t", "h"}, {"th", "e"}, {" ", "the"}, {"o", "n"}}));
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("the one on the " + std::to_string(i) + " thenon");
  std::vector<Ids> want;
  for (const auto& s : texts) want.push_back(t.Encode(s));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) wrong += t.Encode(texts[i]) != want[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(HfTokenizerTest, StreamDecoderJoinsBytesOfCharacters) {
  Tokenizer t = Load(TinyTokenizer({{"\xE4", "\xB8"}}));
  const std::string text = "\xE4\xB8\xAD\xE6\x96\x87 ok";  // 中文 ok
  Ids ids = t.Encode(text);
  EXPECT_EQ(ids[0], 256);  // half of 中
  TokenStreamDecoder dec(&t);
  std::string out;
  for (int32_t id : ids) {
    std::string part = dec.Push(id);
    if (id == 256) {
      EXPECT_EQ(part, "");
    }
    out += part;
  }
  out += dec.Finish();
  EXPECT_EQ(out, text);
}

TEST_F(HfTokenizerTest, ErrorsAreOneLineNamingFileAndWhat) {
  json j = TinyTokenizer({});
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(LoadError(j).find("model type \"WordPiece\" is not supported (supported: BPE)"), std::string::npos);
  j["model"]["type"] = "Unigram";
  EXPECT_NE(LoadError(j).find("model type \"Unigram\" is not supported"), std::string::npos);

  auto with = [&](const char* key, json value) {
    json k = TinyTokenizer({});
    k[key] = value;
    return LoadError(k);
  };
  EXPECT_NE(with("pre_tokenizer", {{"type", "Metaspace"}}).find("pre_tokenizer \"Metaspace\" is not supported"), std::string::npos);
  EXPECT_NE(with("pre_tokenizer", nullptr).find("ByteLevel"), std::string::npos);
  EXPECT_NE(with("normalizer", {{"type", "Lowercase"}}).find("normalizer \"Lowercase\" is not supported"), std::string::npos);
  EXPECT_NE(with("decoder", {{"type", "WordPiece"}}).find("decoder \"WordPiece\" is not supported"), std::string::npos);
  EXPECT_NE(with("post_processor", {{"type", "BertProcessing"}}).find("post_processor \"BertProcessing\" is not supported"),
            std::string::npos);
  EXPECT_NE(with("post_processor", {{"type", "TemplateProcessing"},
                                    {"single", {{{"Sequence", {{"id", "A"}}}}, {{"SpecialToken", {{"id", "x"}}}}}}})
                .find("is not supported"),
            std::string::npos);
  EXPECT_NE(with("added_tokens", {Added(300, "<m>", true, {{"single_word", true}})}).find("single_word=true is not supported"),
            std::string::npos);
  EXPECT_NE(with("pre_tokenizer", {{"type", "Sequence"},
                                   {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}})
                .find("must end in ByteLevel"),
            std::string::npos);

  json vocabless = TinyTokenizer({});
  vocabless["model"].erase("vocab");
  EXPECT_NE(LoadError(vocabless).find("model.vocab is missing"), std::string::npos);
  json no_byte = TinyTokenizer({});
  no_byte["model"]["vocab"].erase(ByteChar(0x0A));
  EXPECT_NE(LoadError(no_byte).find("no token for byte 0x0A"), std::string::npos);
  json bad_merge = TinyTokenizer({});
  bad_merge["model"]["merges"] = {"a nope"};
  EXPECT_NE(LoadError(bad_merge).find("\"nope\" is not in the vocab"), std::string::npos);
  bad_merge["model"]["merges"] = {"a b c"};
  EXPECT_NE(LoadError(bad_merge).find("is not two tokens"), std::string::npos);
  json no_type = TinyTokenizer({});
  no_type["model"].erase("type");
  EXPECT_NE(LoadError(no_type).find("model has no \"type\""), std::string::npos);
  json dropout = TinyTokenizer({});
  dropout["model"]["dropout"] = 0.1;
  EXPECT_NE(LoadError(dropout).find("model.dropout 0.1 is not supported"), std::string::npos);

  const std::string text = TinyTokenizer({{"a", "b"}}).dump();
  EXPECT_NE(ErrorOf(WriteText(text.substr(0, text.size() / 2), "truncated.json")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf(WriteText("{\"model\": ", "malformed.json")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(ErrorOf(WriteText("[1, 2]", "list.json")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(ErrorOf(dir_.path() + "/absent/tokenizer.json").find("not found"), std::string::npos);
}

TEST_F(HfTokenizerTest, UnsupportedRegexesAreRefused) {
  auto error_for = [&](const std::string& regex) {
    json j = TinyTokenizer({});
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}},
                            {{"type", "ByteLevel"}, {"use_regex", false}}}}};
    return LoadError(j);
  };
  EXPECT_NE(error_for("\\bword").find("\\b (word boundary) at offset 0 is not supported"), std::string::npos);
  EXPECT_NE(error_for("[a[b]]").find("nested character class"), std::string::npos);
  EXPECT_NE(error_for("[[:alpha:]]").find("POSIX bracket"), std::string::npos);
  EXPECT_NE(error_for("(?m:a.b)").find("group flags"), std::string::npos);
  EXPECT_NE(error_for("[a-z&&[^aeiou]]").find("&&"), std::string::npos);
  EXPECT_NE(error_for("a{1,3}+").find("interval followed by +"), std::string::npos);
  EXPECT_NE(error_for("(unclosed").find("does not compile"), std::string::npos);
}

// ------------------------------------------------- the pre-tokenizer layer

std::vector<std::string> SplitWith(const std::string& pattern, hf::SplitBehavior behavior, bool invert,
                                   const std::string& text) {
  auto regex = hf::Regex::Compile(pattern);
  EXPECT_TRUE(regex.ok()) << regex.status().message();
  hf::Pieces pieces;
  hf::SplitByRegex(regex.value(), behavior, invert, text, &pieces);
  return {pieces.begin(), pieces.end()};
}

using Strings = std::vector<std::string>;

TEST(HfSplit, BehaviorsOnTheDocumentedExample) {
  using B = hf::SplitBehavior;
  const std::string text = "the-final--countdown";
  EXPECT_EQ(SplitWith("-", B::kRemoved, false, text), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(SplitWith("-", B::kIsolated, false, text), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(SplitWith("-", B::kMergedWithPrevious, false, text), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(SplitWith("-", B::kMergedWithNext, false, text), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(SplitWith("-", B::kContiguous, false, text), (Strings{"the", "-", "final", "--", "countdown"}));
  // Inverted, the matches are kept and the text between them is the delimiter.
  EXPECT_EQ(SplitWith("-", B::kRemoved, true, text), (Strings{"-", "-", "-"}));
  EXPECT_EQ(SplitWith("\\p{L}+", B::kRemoved, true, "ab, cd!"), (Strings{"ab", "cd"}));
  EXPECT_EQ(SplitWith("\\p{L}+", B::kIsolated, true, "ab, cd!"), (Strings{"ab", ", ", "cd", "!"}));
}

TEST(HfSplit, EmptyMatchesCutButAddNothing) {
  EXPECT_EQ(SplitWith("(?=b)", hf::SplitBehavior::kIsolated, false, "abab"), (Strings{"a", "ba", "b"}));
  EXPECT_EQ(SplitWith("x*", hf::SplitBehavior::kIsolated, false, "\xE4\xB8\xAD" "x"), (Strings{"\xE4\xB8\xAD", "x"}));
}

TEST(HfSplit, DigitsAreUnicodeNumbers) {
  // Hugging Face's Digits splits at char::is_numeric (General_Category N).
  auto regex = hf::Regex::Compile("\\p{N}");
  ASSERT_TRUE(regex.ok());
  hf::Pieces pieces;
  hf::SplitByRegex(regex.value(), hf::SplitBehavior::kContiguous, false, "Hey 123 friend! x\xC2\xB2", &pieces);
  EXPECT_EQ(Strings(pieces.begin(), pieces.end()), (Strings{"Hey ", "123", " friend! x", "\xC2\xB2"}));
}

TEST(HfRegex, OnigurumaMeaningsKept) {
  using B = hf::SplitBehavior;
  // \s is White_Space: U+0085 yes; U+180E (PCRE2's \s has it) and U+FEFF no.
  EXPECT_EQ(SplitWith("\\s+", B::kRemoved, false, "a\xC2\x85" "b\xE1\xA0\x8E" "c\xEF\xBB\xBF" "d"),
            (Strings{"a", "b\xE1\xA0\x8E" "c\xEF\xBB\xBF" "d"}));
  EXPECT_EQ(SplitWith("[^\\s]+", B::kRemoved, true, "a\xE3\x80\x80" "b"), (Strings{"a", "b"}));
  // (?i:) folds by Unicode: 's matches 'S and 'ſ (U+017F folds to s).
  EXPECT_EQ(SplitWith("(?i:'s)", B::kIsolated, false, "it's IT'S it'\xC5\xBF"),
            (Strings{"it", "'s", " IT", "'S", " it", "'\xC5\xBF"}));
  // \w is L|M|N|Pc: the superscript two (No) and the combining acute (Mn) are in.
  EXPECT_EQ(SplitWith("\\w+", B::kRemoved, true, "x\xC2\xB2 e\xCC\x81!"), (Strings{"x\xC2\xB2", "e\xCC\x81"}));
  // \h is a hex digit, \uHHHH a code point; $ and ^ work at line feeds.
  EXPECT_EQ(SplitWith("\\h+", B::kRemoved, true, "0xBEEF g"), (Strings{"0", "BEEF"}));
  EXPECT_EQ(SplitWith("\\u4E2D", B::kIsolated, false, "a\xE4\xB8\xAD" "b"), (Strings{"a", "\xE4\xB8\xAD", "b"}));
  EXPECT_EQ(SplitWith("^x|x$", B::kIsolated, false, "xax\nxbx"), (Strings{"x", "a", "x", "\n", "x", "b", "x"}));
  // A script name means the Script property.
  EXPECT_EQ(SplitWith("\\p{Han}+", B::kIsolated, false, "ab\xE4\xB8\xAD\xE6\x96\x87" "cd"),
            (Strings{"ab", "\xE4\xB8\xAD\xE6\x96\x87", "cd"}));
}

TEST(HfRegex, TranslationsArePlainPcre2) {
  auto t = hf::OnigurumaToPcre2("'s| ?\\p{L}+|[^\\s\\p{L}]+|\\s+(?!\\S)");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.value(), "'s| ?\\p{L}+|[^\\p{White_Space}\\p{L}]+|\\p{White_Space}+(?!\\P{White_Space})");
  EXPECT_EQ(hf::OnigurumaToPcre2("[]a]\\{x{2}").value(), "[]a]\\{x{2}");
}

// ------------------------------------------------ SentencePiece, foreign

class ForeignSentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("hfsp");
    const std::string text_path = dir_->path() + "/text.txt";
    std::filesystem::create_directories(dir_->path() + "/hf");
    {
      std::ofstream text(text_path);
      for (int i = 0; i < 50; ++i) text << "hello world, the quick brown fox " << i << "\nsay hello to the world\n";
    }
    // SentencePiece's defaults: NFKC-like normalization, a dummy prefix.
    auto st = sentencepiece::SentencePieceTrainer::Train("--input=" + text_path + " --model_prefix=" + dir_->path() +
                                                         "/hf/tokenizer --vocab_size=60 --model_type=bpe "
                                                         "--minloglevel=2");
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(processor_.Load(dir_->path() + "/hf/tokenizer.model").ok());
    std::ofstream(dir_->path() + "/hf/tokenizer_config.json") << R"({"add_bos_token": true, "eos_token": "</s>"})";
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
  static sentencepiece::SentencePieceProcessor processor_;
};
TempDir* ForeignSentencePieceTest::dir_ = nullptr;
sentencepiece::SentencePieceProcessor ForeignSentencePieceTest::processor_;

TEST_F(ForeignSentencePieceTest, FolderLoadsWithSentencePieceSemantics) {
  auto tok = Tokenizer::Load(dir_->path() + "/hf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->kind(), TokenizerKind::kSentencePiece);
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_EQ(tok->bos_id(), processor_.bos_id());
  EXPECT_EQ(tok->eos_id(), processor_.PieceToId("</s>"));
  for (const std::string text : {"hello world", "  say   hello\tto\nthe fox 12", "unseen zzz"}) {
    std::vector<int> want;
    ASSERT_TRUE(processor_.Encode(text, &want).ok());
    Ids got = tok->Encode(text);
    EXPECT_EQ(got, Ids(want.begin(), want.end())) << text;
    std::string decoded;
    ASSERT_TRUE(processor_.Decode(want, &decoded).ok());
    EXPECT_EQ(tok->Decode(got), decoded);
  }
  EXPECT_EQ(tok->Decode(tok->Encode("hello world")), "hello world");  // no dummy-prefix space
}

TEST_F(ForeignSentencePieceTest, SameFileWithoutConfigIsOurs) {
  const std::string alone = dir_->path() + "/alone.model";
  std::filesystem::copy_file(dir_->path() + "/hf/tokenizer.model", alone, std::filesystem::copy_options::overwrite_existing);
  // Our own models need byte fallback; this one has none, so it is refused.
  auto tok = Tokenizer::Load(alone);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("no byte token"), std::string::npos);
}

TEST_F(ForeignSentencePieceTest, RefusedTokenizerJsonFallsBackToTheModel) {
  const std::string folder = dir_->path() + "/both";
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(dir_->path() + "/hf/tokenizer.model", folder + "/tokenizer.model",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(folder + "/tokenizer_config.json") << "{}";
  json j = TinyTokenizer({});
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  std::ofstream(folder + "/tokenizer.json") << j.dump();
  auto tok = Tokenizer::Load(folder);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->kind(), TokenizerKind::kSentencePiece);
  EXPECT_EQ(tok->path(), folder + "/tokenizer.model");
}

TEST(TokenizerLoad, FolderWithOurModelIsOurs) {
  TempDir dir("hfours");
  std::vector<std::string> docs(50, "the quick brown fox jumps over the lazy dog\n");
  Status st = Tokenizer::Train(docs, dir.path() + "/tokenizer", 300);
  ASSERT_TRUE(st.ok()) << st.message();
  auto tok = Tokenizer::Load(dir.path());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->kind(), TokenizerKind::kMyriad);
  EXPECT_FALSE(tok->adds_bos());
  EXPECT_EQ(tok->Decode(tok->Encode("the\n  fox\xFF")), "the\n  fox\xFF");
}

TEST(TokenizerLoad, EmptyFolderSaysWhatIsMissing) {
  TempDir dir("hfempty");
  auto tok = Tokenizer::Load(dir.path());
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("neither tokenizer.json nor tokenizer.model"), std::string::npos);
}

}  // namespace
}  // namespace myriad

namespace myriad {
namespace {

// TextConventions: bos only where the tokenizer prepends one, and a reply
// stops at each of the model's eos ids and the tokenizer's eos.
TEST_F(HfTokenizerTest, TextConventionsFollowTheTokenizerAndTheModel) {
  json j = TinyTokenizer({});
  j["added_tokens"] = {Added(300, "<|begin_of_text|>", true), Added(301, "<|end_of_text|>", true),
                       Added(302, "<|eot_id|>", true)};
  Tokenizer plain = Load(j);  // no template: nothing prepended
  TextConventions c = TextConventions::For(plain, {302, 301, 99999});
  EXPECT_TRUE(c.prompt_prefix.empty());
  EXPECT_EQ(c.stop_ids, (std::vector<int32_t>{302, 301}));  // out-of-vocabulary ids dropped, no repeats
  EXPECT_TRUE(c.IsStop(302));
  EXPECT_FALSE(c.IsStop('h'));
  EXPECT_TRUE(TextConventions::IsControl(plain, 302));
  EXPECT_FALSE(TextConventions::IsControl(plain, 'h'));
  j["post_processor"] = json::parse(R"({"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [300], "tokens": ["<|begin_of_text|>"]}}})");
  Tokenizer llama = Load(j);
  c = TextConventions::For(llama);
  EXPECT_EQ(c.prompt_prefix, (std::vector<int32_t>{300}));
  EXPECT_EQ(c.stop_ids, (std::vector<int32_t>{301}));  // the tokenizer's own eos
}

}  // namespace
}  // namespace myriad
