// Corpus readers: turn files on disk into documents (UTF-8 strings tagged with
// the source they came from) for `myriad prepare`.
//
// Two corpora exist:
//  - the built-in default corpus, read from Debian packages that
//    scripts/install-deps.sh installs: English fortunes (package `fortunes`),
//    Chinese fortunes and classical poems (`fortunes-zh`), and Python code
//    (the standard library of python3.11, without tests and site-packages);
//  - any folder of text files (`myriad prepare --input DIR`).
//
// Every document returned is valid UTF-8 and non-empty. Order is
// deterministic: by source, then by path, then by position inside the file;
// two calls on the same files return identical corpora.
//
// Thread safety: the functions are reentrant; they only read files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace myriad {

struct CorpusDocument {
  std::string source;  // tag, e.g. "fortunes-en", "fortunes-zh", "python-stdlib"
  std::string origin;  // where it came from, e.g. "/usr/share/games/fortunes/art#12"
  std::string text;    // valid UTF-8, non-empty
};

struct SourceStats {
  std::string source;
  int64_t documents = 0;
  int64_t bytes = 0;
  int64_t files = 0;          // files that contributed at least one document
  int64_t skipped_files = 0;  // binary, undecodable or unreadable
  int64_t capped_files = 0;   // left out by a size cap (default corpus code)
};

struct Corpus {
  std::vector<CorpusDocument> documents;
  std::vector<SourceStats> sources;  // one entry per source, in document order
  int64_t total_bytes() const;
  // One line per source: "python-stdlib: 281 docs, 4.59 MB from 281 files (0 skipped, 354 capped)".
  std::string Summary() const;
};

struct DefaultCorpusOptions {
  std::string fortunes_dir = "/usr/share/games/fortunes";
  // dpkg's file list of fortunes-zh; the Chinese files are those it names.
  // When missing, the files "chinese", "song100" and "tang300" are used.
  std::string fortunes_zh_list = "/var/lib/dpkg/info/fortunes-zh.list";
  std::string python_dir = "/usr/lib/python3.11";
  // Code is capped at this multiple of the text bytes (English + Chinese) so
  // that code does not drown the text; <= 0 means no cap. Files are picked by
  // a hash of their relative path, so the kept subset is spread over the whole
  // library and is stable.
  double max_code_to_text_ratio = 1.0;
  // Python files larger than this are skipped (data tables, not code).
  int64_t max_code_file_bytes = 256 * 1024;
};

// Reads the default corpus. Fails, naming the folder and the package to
// install, when a source has no documents at all.
Result<Corpus> LoadDefaultCorpus(const DefaultCorpusOptions& options = {});

// Reads every text file under `dir`, recursively, one document per file.
// Files with a known text or code extension (.txt .md .rst .py .c .cc .h ...)
// and files without an extension are read; a file that is not valid UTF-8 or
// holds NUL bytes is skipped as binary. Hidden files and folders (".git")
// are skipped. The source tag is the first folder below `dir` ("." for files
// directly in it), so a folder per source gives a per-source report.
// Fails when `dir` is missing or yields no document.
Result<Corpus> LoadFolderCorpus(const std::string& dir);

// Building blocks, exposed for tests.
namespace corpus_text {

// Splits a fortune file into its entries (separated by lines holding only
// "%"), cleaning each with CleanText; empty entries are dropped.
std::vector<std::string> SplitFortunes(std::string_view file_text);

// Removes terminal formatting: ANSI escape sequences (ESC [ ... final byte),
// backspace overstriking ("_\bx" and "x\bx" become "x"), carriage returns
// before newlines, and other C0 control characters except tab and newline.
std::string CleanText(std::string_view text);

// True when `bytes` is well-formed UTF-8 (no overlongs, no surrogates).
bool IsValidUtf8(std::string_view bytes);

// Converts `bytes` from `charset` (an iconv name such as "GB18030" or
// "ISO-8859-1") to UTF-8.
Result<std::string> ConvertToUtf8(std::string_view bytes, const std::string& charset);

}  // namespace corpus_text

}  // namespace myriad
