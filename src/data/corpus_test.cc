#include "data/corpus.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/test_util.h"

namespace myriad {
namespace {

using corpus_text::CleanText;
using corpus_text::ConvertToUtf8;
using corpus_text::IsValidUtf8;
using corpus_text::SplitFortunes;

void Write(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(CorpusText, CleanTextStripsTerminalFormatting) {
  EXPECT_EQ(CleanText("\x1b[32m《感遇・其一》\x1b[m\n\x1b[33m作者：张九龄\x1b[m"), "《感遇・其一》\n作者：张九龄");
  EXPECT_EQ(CleanText("_\bB_\bo_\bl_\bd and B\bBo\bol\bld\bd"), "Bold and Bold");
  EXPECT_EQ(CleanText("e\xCC\x81\b"), "e");  // backspace removes a whole code point
  EXPECT_EQ(CleanText("a\r\nb\tc\x07\x7f"), "a\nb\tc");
  EXPECT_EQ(CleanText("\n\bx"), "\nx");  // never eats the newline
}

TEST(CorpusText, SplitFortunes) {
  auto e = SplitFortunes("one\n%\ntwo\n  lines\n%\n\n%\n\nthree\n\n%\n");
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0], "one");
  EXPECT_EQ(e[1], "two\n  lines");
  EXPECT_EQ(e[2], "three");
  EXPECT_EQ(SplitFortunes("100%\nsure\n").at(0), "100%\nsure");
}

TEST(CorpusText, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("中文 😀 é"));
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_FALSE(IsValidUtf8("\xE4\xB8"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
}

TEST(CorpusText, ConvertToUtf8FromLegacyCharsets) {
  auto gb = ConvertToUtf8("\xD6\xD0\xCE\xC4", "GB18030");  // "中文" in GB2312/GBK/GB18030
  ASSERT_TRUE(gb.ok()) << gb.status().message();
  EXPECT_EQ(gb.value(), "中文");
  auto latin = ConvertToUtf8("caf\xE9", "ISO-8859-1");
  ASSERT_TRUE(latin.ok());
  EXPECT_EQ(latin.value(), "café");
  auto bad = ConvertToUtf8("ok\x81", "GB18030");  // a lead byte with nothing after it
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(ConvertToUtf8("x", "NO-SUCH-CHARSET").ok());
}

TEST(FolderCorpus, ReadsTextSkipsBinaryAndHidden) {
  TempDir dir("corpus");
  const std::string d = dir.path();
  Write(d + "/a.txt", "hello\n  world\n");
  Write(d + "/README", "no extension but text");
  Write(d + "/blob", std::string("has\0nul", 7));
  Write(d + "/image.png", "\x89PNG\r\n");
  Write(d + "/bad.txt", "caf\xE9 is latin-1");
  Write(d + "/empty.txt", "");
  Write(d + "/.hidden/x.txt", "hidden");
  Write(d + "/code/z.py", "def f():\n\treturn 1\n");
  Write(d + "/code/deep/y.cc", "int main() {}\n");
  Write(d + "/zh/poem.md", "床前明月光");

  auto corpus = LoadFolderCorpus(d);
  ASSERT_TRUE(corpus.ok()) << corpus.status().message();
  const auto& docs = corpus->documents;
  ASSERT_EQ(docs.size(), 5u);
  // Sorted by relative path: README, a.txt, code/deep/y.cc, code/z.py, zh/poem.md.
  EXPECT_EQ(docs[0].text, "no extension but text");
  EXPECT_EQ(docs[1].text, "hello\n  world\n");
  EXPECT_EQ(docs[2].text, "int main() {}\n");
  EXPECT_EQ(docs[3].text, "def f():\n\treturn 1\n");
  EXPECT_EQ(docs[4].text, "床前明月光");
  EXPECT_EQ(docs[0].source, ".");
  EXPECT_EQ(docs[2].source, "code");
  EXPECT_EQ(docs[4].source, "zh");
  ASSERT_EQ(corpus->sources.size(), 3u);
  EXPECT_EQ(corpus->sources[0].source, ".");
  EXPECT_EQ(corpus->sources[0].documents, 2);
  EXPECT_EQ(corpus->sources[0].skipped_files, 4);  // blob, image.png, bad.txt, empty.txt
  EXPECT_EQ(corpus->sources[1].bytes, 14 + 19);
  EXPECT_EQ(corpus->total_bytes(), 21 + 14 + 14 + 19 + 15);
  EXPECT_NE(corpus->Summary().find("code: 2 docs"), std::string::npos) << corpus->Summary();
}

TEST(FolderCorpus, ErrorsNameTheFolder) {
  auto missing = LoadFolderCorpus("/nonexistent/corpus");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/corpus"), std::string::npos);
  TempDir dir("corpusempty");
  Write(dir.path() + "/x.bin", "\x01\x02");
  auto empty = LoadFolderCorpus(dir.path());
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("no text documents"), std::string::npos);
}

TEST(DefaultCorpus, ReadsInstalledPackages) {
  DefaultCorpusOptions options;
  if (!std::filesystem::exists(options.fortunes_dir + "/tang300") ||
      !std::filesystem::exists(options.python_dir + "/os.py")) {
    GTEST_SKIP() << "fortunes, fortunes-zh or python3.11 not installed (scripts/install-deps.sh)";
  }
  auto corpus = LoadDefaultCorpus(options);
  ASSERT_TRUE(corpus.ok()) << corpus.status().message();
  ASSERT_EQ(corpus->sources.size(), 3u);
  EXPECT_EQ(corpus->sources[0].source, "fortunes-en");
  EXPECT_EQ(corpus->sources[1].source, "fortunes-zh");
  EXPECT_EQ(corpus->sources[2].source, "python-stdlib");
  for (const auto& s : corpus->sources) EXPECT_GT(s.documents, 100) << s.source;
  const int64_t text = corpus->sources[0].bytes + corpus->sources[1].bytes;
  EXPECT_LE(corpus->sources[2].bytes, text);
  EXPECT_GT(corpus->sources[2].bytes, text / 2);

  bool found_poem = false;
  for (const auto& doc : corpus->documents) {
    ASSERT_FALSE(doc.text.empty()) << doc.origin;
    ASSERT_TRUE(IsValidUtf8(doc.text)) << doc.origin;
    if (doc.source != "python-stdlib") {
      ASSERT_EQ(doc.text.find('\x1b'), std::string::npos) << doc.origin;
      ASSERT_EQ(doc.text.find('\b'), std::string::npos) << doc.origin;
      ASSERT_EQ(doc.origin.find(".dat"), std::string::npos);
      ASSERT_EQ(doc.origin.find("/off/"), std::string::npos);
    } else {
      ASSERT_EQ(doc.origin.find("/test/"), std::string::npos) << doc.origin;
      ASSERT_EQ(doc.origin.find("-packages/"), std::string::npos) << doc.origin;
      ASSERT_EQ(doc.origin.substr(doc.origin.size() - 3), ".py");
    }
    found_poem |= doc.source == "fortunes-zh" && doc.text.find("床前明月光") != std::string::npos;
  }
  EXPECT_TRUE(found_poem) << "静夜思 should be among the Tang poems";
}

}  // namespace
}  // namespace myriad
