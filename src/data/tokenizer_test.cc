#include "data/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/rng.h"
#include "data/corpus.h"
#include "data/test_util.h"

namespace myriad {
namespace {

// A small mixed corpus: English prose, Chinese, emoji and indented code.
std::vector<std::string> TinyCorpus() {
  std::vector<std::string> docs;
  const char* english[] = {
      "The quick brown fox jumps over the lazy dog.",
      "A journey of a thousand miles begins with a single step.",
      "To be, or not to be, that is the question.",
      "All that glitters is not gold; all that wander are not lost.",
      "There is nothing either good or bad, but thinking makes it so.",
  };
  const char* chinese[] = {
      "床前明月光，疑是地上霜。举头望明月，低头思故乡。",
      "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。",
      "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
  };
  const char* code =
      "def fib(n):\n"
      "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
      "    if n < 2:\n"
      "        return n\n"
      "    a, b = 0, 1\n"
      "    for _ in range(n - 1):\n"
      "        a, b = b, a + b\n"
      "    return b\n"
      "\n"
      "class Point:\n"
      "    def __init__(self, x, y):\n"
      "        self.x = x\n"
      "        self.y = y\n";
  for (int rep = 0; rep < 20; ++rep) {
    for (const char* s : english) docs.push_back(std::string(s) + "\n" + s);
    for (const char* s : chinese) docs.push_back(s);
    docs.push_back(code);
    docs.push_back("emoji 😀 🎉 and more 🚀 fun 😀");
  }
  return docs;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("tokenizer");
    TokenizerTrainOptions options;
    options.character_coverage = 1.0;
    Status st = Tokenizer::Train(TinyCorpus(), dir_->path() + "/tok", 600, options);
    ASSERT_TRUE(st.ok()) << st.message();
    auto tok = Tokenizer::Load(dir_->path() + "/tok.model");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    tok_ = new Tokenizer(std::move(tok.value()));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }
  void ExpectRoundTrip(const std::string& text) {
    std::vector<int32_t> ids = tok_->Encode(text);
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, tok_->vocab_size());
      ASSERT_NE(id, tok_->unk_id()) << "unk in encoding of: " << text;
    }
    EXPECT_EQ(tok_->Decode(ids), text);
  }
  static TempDir* dir_;
  static Tokenizer* tok_;
};
TempDir* TokenizerTest::dir_ = nullptr;
Tokenizer* TokenizerTest::tok_ = nullptr;

TEST_F(TokenizerTest, ModelFilesAndIds) {
  EXPECT_TRUE(std::filesystem::exists(dir_->path() + "/tok.model"));
  EXPECT_TRUE(std::filesystem::exists(dir_->path() + "/tok.vocab"));
  EXPECT_GT(tok_->vocab_size(), 259);
  EXPECT_LE(tok_->vocab_size(), 600);
  EXPECT_EQ(tok_->unk_id(), 0);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  for (int b = 0; b < 256; ++b) {
    ASSERT_EQ(tok_->DecodePiece(tok_->byte_id(static_cast<uint8_t>(b))), std::string(1, char(b)));
  }
  EXPECT_EQ(tok_->DecodePiece(tok_->bos_id()), "");
  EXPECT_EQ(tok_->DecodePiece(tok_->eos_id()), "");
}

// The fingerprint follows what ids mean: the same file loaded again (or
// copied elsewhere) has it; a tokenizer learned from other text, or of
// another size, does not.
TEST_F(TokenizerTest, VocabFingerprintFollowsWhatIdsMean) {
  const std::string fp = tok_->VocabFingerprint();
  EXPECT_EQ(fp.size(), 16u);
  std::filesystem::copy_file(dir_->path() + "/tok.model", dir_->path() + "/copy.model",
                             std::filesystem::copy_options::overwrite_existing);
  auto again = Tokenizer::Load(dir_->path() + "/copy.model");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->VocabFingerprint(), fp);
  TokenizerTrainOptions options;
  options.character_coverage = 1.0;
  std::vector<std::string> other = TinyCorpus();
  other.push_back("zebra quagga okapi zebra quagga okapi zebra quagga okapi");
  for (int size : {600, 590}) {
    ASSERT_TRUE(Tokenizer::Train(other, dir_->path() + "/other", size, options).ok());
    auto o = Tokenizer::Load(dir_->path() + "/other.model");
    ASSERT_TRUE(o.ok()) << o.status().message();
    bool same_meaning = o->vocab_size() == tok_->vocab_size();
    for (int id = 0; same_meaning && id < o->vocab_size(); ++id)
      same_meaning = o->DecodePiece(id) == tok_->DecodePiece(id) && o->is_special(id) == tok_->is_special(id);
    ASSERT_FALSE(same_meaning) << size;  // the premise: another vocabulary
    EXPECT_NE(o->VocabFingerprint(), fp) << size;
  }
}

TEST_F(TokenizerTest, LearnsMergesForTrainingText) {
  // Text seen 20 times in training compresses well below one token per byte.
  std::string text = "The quick brown fox jumps over the lazy dog.";
  std::vector<int32_t> ids = tok_->Encode(text);
  std::string pieces;
  for (int32_t id : ids) pieces += "[" + tok_->PieceName(id) + "]";
  EXPECT_LT(ids.size(), text.size() / 2) << pieces;
}

TEST_F(TokenizerTest, RoundTripEnglish) {
  ExpectRoundTrip("The quick brown fox jumps over the lazy dog.");
  ExpectRoundTrip("Unseen words: zyzzyva, quixotic, xylophone! 12345 + 678 = 13023");
  ExpectRoundTrip(" leading space, trailing space ");
  ExpectRoundTrip("");
}

TEST_F(TokenizerTest, RoundTripChinese) {
  ExpectRoundTrip("床前明月光，疑是地上霜。");
  ExpectRoundTrip("龘靐齉爩 — characters never seen in training fall back to bytes");
}

TEST_F(TokenizerTest, RoundTripEmoji) {
  ExpectRoundTrip("emoji 😀 🎉 🚀");
  ExpectRoundTrip("flags 🇨🇳🇺🇸 and ZWJ 👨‍👩‍👧‍👦 and skin 👍🏽");
}

TEST_F(TokenizerTest, RoundTripCodeWhitespace) {
  ExpectRoundTrip(
      "def fib(n):\n"
      "    if n < 2:\n"
      "        return n\n"
      "\treturn  fib(n-1)   +\t\tfib(n-2)  \n"
      "\n\n\n"
      "        \n"
      "x = {'a':  1}\r\n"
      "   # comment with trailing spaces    \n");
  ExpectRoundTrip("\n");
  ExpectRoundTrip("\n\n  \n\t\n");
  ExpectRoundTrip("    ");
  ExpectRoundTrip("no newline at end");
}

TEST_F(TokenizerTest, NewlineIsOneTokenAndIndentationIsCheap) {
  std::vector<int32_t> ids = tok_->Encode("a\nb");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], tok_->byte_id('\n'));
  // Eight spaces of indentation were frequent in training: far fewer than 8 tokens.
  EXPECT_LE(tok_->Encode("        ").size(), 3u);
}

TEST_F(TokenizerTest, RoundTripBytesSentencePieceWouldAlter) {
  ExpectRoundTrip("literal \xE2\x96\x81 lower one eighth block ▁▁ and spaces");
  ExpectRoundTrip(std::string("nul\0byte", 8));
  ExpectRoundTrip("bad utf8: \xFF\xFE \xC3 \xE4\xB8 \xED\xA0\x80 overlong \xC0\xAF end");
  ExpectRoundTrip("controls \x01\x02\x1b[31m red \x7f");
}

TEST_F(TokenizerTest, RoundTripRandomBytes) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    int n = static_cast<int>(rng.Below(40));
    for (int i = 0; i < n; ++i) {
      // Mix ASCII-heavy text with arbitrary bytes.
      if (rng.Below(3) == 0) {
        s.push_back(static_cast<char>(rng.Below(256)));
      } else {
        s.push_back(" \n\tab{}()_=é"[rng.Below(12)]);
      }
    }
    ExpectRoundTrip(s);
  }
}

TEST_F(TokenizerTest, StreamDecoderNeverEmitsBrokenCharacters) {
  const std::string text = "中文 😀 emoji 龘 mixed ▁ text\n";
  std::vector<int32_t> ids = tok_->Encode(text);
  // Force byte-level ids so characters are split across tokens.
  std::vector<int32_t> byte_ids;
  for (unsigned char c : text) byte_ids.push_back(tok_->byte_id(c));
  for (const auto* seq : {&ids, &byte_ids}) {
    TokenStreamDecoder dec(tok_);
    std::string streamed;
    for (int32_t id : *seq) {
      std::string part = dec.Push(id);
      ASSERT_TRUE(corpus_text::IsValidUtf8(part)) << "broken character emitted";
      streamed += part;
    }
    streamed += dec.Finish();
    EXPECT_EQ(streamed, text);
  }
}

TEST_F(TokenizerTest, StreamDecoderReplacesInvalidBytes) {
  TokenStreamDecoder dec(tok_);
  std::string out = dec.Push(tok_->byte_id(0xE4));  // start of a 3-byte char
  EXPECT_EQ(out, "");
  out = dec.Push(tok_->byte_id('a'));  // breaks it
  EXPECT_EQ(out, "\xEF\xBF\xBD" "a");
  out = dec.Push(tok_->byte_id(0xE4));
  EXPECT_EQ(out, "");
  EXPECT_EQ(dec.Finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.Push(tok_->byte_id(0xFF)), "\xEF\xBF\xBD");
}

TEST(TokenizerErrors, MissingModelNamesPathAndHint) {
  auto tok = Tokenizer::Load("/nonexistent/dir/tokenizer.model");
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("/nonexistent/dir/tokenizer.model"), std::string::npos);
  EXPECT_NE(tok.status().message().find("hint"), std::string::npos);
}

TEST(TokenizerErrors, CorruptModelNamesPathAndHint) {
  TempDir dir("tokcorrupt");
  std::string path = dir.path() + "/tokenizer.model";
  std::ofstream(path) << "this is not a sentencepiece model";
  auto tok = Tokenizer::Load(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find(path), std::string::npos);
  EXPECT_NE(tok.status().message().find("hint"), std::string::npos);
}

TEST(TokenizerErrors, BadVocabSize) {
  TempDir dir("tokvocab");
  Status st = Tokenizer::Train({"hello world"}, dir.path() + "/t", 100);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocab_size=100"), std::string::npos);
}

}  // namespace
}  // namespace myriad
