#include "data/corpus.h"

#include <iconv.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "core/checksum.h"
#include "core/env.h"
#include "core/log.h"
#include "core/utf8.h"

namespace myriad {

namespace fs = std::filesystem;

namespace corpus_text {

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const size_t len = Utf8SequenceLength(s, i, &cp);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

Result<std::string> ConvertToUtf8(std::string_view bytes, const std::string& charset) {
  iconv_t cd = iconv_open("UTF-8", charset.c_str());
  if (cd == reinterpret_cast<iconv_t>(-1)) {
    return Status::Error("iconv: cannot convert from charset '" + charset +
                         "': " + std::strerror(errno) + " (hint: see `iconv -l`)");
  }
  std::string out(bytes.size() * 2 + 16, '\0');
  char* in_ptr = const_cast<char*>(bytes.data());
  size_t in_left = bytes.size();
  size_t produced = 0;
  Status status;
  while (in_left > 0) {
    char* out_ptr = out.data() + produced;
    size_t out_left = out.size() - produced;
    size_t r = iconv(cd, &in_ptr, &in_left, &out_ptr, &out_left);
    produced = out.size() - out_left;
    if (r != static_cast<size_t>(-1)) break;
    if (errno == E2BIG) {
      out.resize(out.size() * 2);
      continue;
    }
    status = Status::Error("iconv: input is not valid " + charset + " at byte " +
                           std::to_string(bytes.size() - in_left) + " of " +
                           std::to_string(bytes.size()));
    break;
  }
  iconv_close(cd);
  if (!status.ok()) return status;
  out.resize(produced);
  return out;
}

std::string CleanText(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(in[i]);
    if (c == 0x1B) {  // ESC: CSI "ESC [ params final" or a two-byte escape.
      if (i + 1 < in.size() && in[i + 1] == '[') {
        i += 2;
        while (i < in.size() && !(in[i] >= 0x40 && in[i] <= 0x7E)) ++i;
      } else {
        ++i;
      }
      continue;
    }
    if (c == '\b') {  // overstrike: drop the previous code point of the line
      if (!out.empty() && out.back() != '\n') {
        while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) {
          out.pop_back();
        }
        if (!out.empty()) out.pop_back();
      }
      continue;
    }
    if (c == '\t' || c == '\n' || (c >= 0x20 && c != 0x7F)) out.push_back(static_cast<char>(c));
    // Everything else (CR, other C0 controls, DEL) is dropped.
  }
  return out;
}

namespace {

std::string TrimEntry(std::string s) {
  size_t begin = 0;
  while (begin < s.size() && s[begin] == '\n') ++begin;
  size_t end = s.size();
  while (end > begin && (s[end - 1] == '\n' || s[end - 1] == ' ' || s[end - 1] == '\t')) --end;
  return s.substr(begin, end - begin);
}

}  // namespace

std::vector<std::string> SplitFortunes(std::string_view file_text) {
  std::vector<std::string> entries;
  std::string current;
  auto flush = [&] {
    std::string entry = TrimEntry(CleanText(current));
    if (!entry.empty()) entries.push_back(std::move(entry));
    current.clear();
  };
  size_t pos = 0;
  while (pos < file_text.size()) {
    size_t nl = file_text.find('\n', pos);
    size_t end = nl == std::string_view::npos ? file_text.size() : nl;
    std::string_view line = file_text.substr(pos, end - pos);
    if (line == "%" || line == "%\r") {
      flush();
    } else {
      current.append(line);
      current.push_back('\n');
    }
    pos = end + 1;
  }
  flush();
  return entries;
}

}  // namespace corpus_text

using corpus_text::CleanText;
using corpus_text::ConvertToUtf8;
using corpus_text::IsValidUtf8;
using corpus_text::SplitFortunes;

int64_t Corpus::total_bytes() const {
  int64_t total = 0;
  for (const auto& s : sources) total += s.bytes;
  return total;
}

std::string Corpus::Summary() const {
  std::string out;
  for (const auto& s : sources) {
    char line[256];
    std::snprintf(line, sizeof(line),
                  "%s: %lld docs, %.2f MB from %lld files (%lld skipped, %lld capped)\n",
                  s.source.c_str(), static_cast<long long>(s.documents), s.bytes / 1e6,
                  static_cast<long long>(s.files), static_cast<long long>(s.skipped_files),
                  static_cast<long long>(s.capped_files));
    out += line;
  }
  return out;
}

namespace {

Result<std::string> ReadWholeFile(const std::string& path) {
  return Env::Default()->ReadFile(path);
}

bool EndsWith(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Adds documents to `corpus`, keeping `sources` in step.
class CorpusBuilder {
 public:
  explicit CorpusBuilder(Corpus* corpus) : corpus_(corpus) {}
  SourceStats& Source(const std::string& name) {
    for (auto& s : corpus_->sources) {
      if (s.source == name) return s;
    }
    corpus_->sources.push_back(SourceStats{name});
    return corpus_->sources.back();
  }
  void Add(const std::string& source, std::string origin, std::string text) {
    SourceStats& s = Source(source);
    s.documents += 1;
    s.bytes += static_cast<int64_t>(text.size());
    corpus_->documents.push_back(CorpusDocument{source, std::move(origin), std::move(text)});
  }

 private:
  Corpus* corpus_;
};

// Reads one fortune file, converting it to UTF-8 from `fallback_charset` when
// it is not UTF-8 already; returns false when it could not be read.
bool AddFortuneFile(CorpusBuilder& builder, const std::string& source, const std::string& path,
                    const std::string& fallback_charset) {
  auto raw = ReadWholeFile(path);
  if (!raw.ok()) {
    LOG_WARN("corpus: skipping %s", raw.status().message().c_str());
    return false;
  }
  std::string text = std::move(raw.value());
  if (!IsValidUtf8(text)) {
    auto converted = ConvertToUtf8(text, fallback_charset);
    if (!converted.ok()) {
      LOG_WARN("corpus: skipping %s: neither UTF-8 nor %s", path.c_str(), fallback_charset.c_str());
      return false;
    }
    text = std::move(converted.value());
  }
  std::vector<std::string> entries = SplitFortunes(text);
  for (size_t i = 0; i < entries.size(); ++i) {
    builder.Add(source, path + "#" + std::to_string(i), std::move(entries[i]));
  }
  return !entries.empty();
}

// The Chinese fortune files: those dpkg lists for fortunes-zh, else the known names.
std::set<std::string> ChineseFortuneNames(const DefaultCorpusOptions& options) {
  std::set<std::string> names;
  auto list = ReadWholeFile(options.fortunes_zh_list);
  if (list.ok()) {
    std::string prefix = "/usr/share/games/fortunes/";
    size_t pos = 0;
    const std::string& text = list.value();
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      std::string line = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.rfind(prefix, 0) != 0) continue;
      std::string name = line.substr(prefix.size());
      if (name.empty() || name.find('/') != std::string::npos) continue;
      if (EndsWith(name, ".dat") || EndsWith(name, ".u8")) continue;
      names.insert(name);
    }
  }
  if (names.empty()) names = {"chinese", "song100", "tang300"};
  return names;
}

std::vector<std::string> SortedFileNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::error_code fec;
    if (!it->is_regular_file(fec)) continue;  // follows symlinks; skips off/ and other dirs
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool IsSkippedPythonDir(const std::string& name) {
  return name == "site-packages" || name == "dist-packages" || name == "test" || name == "tests" ||
         name == "idle_test" || name == "__pycache__" || (!name.empty() && name[0] == '.');
}

struct CodeFile {
  std::string relative;
  std::string path;
  int64_t bytes;
};

Status AddPythonStdlib(CorpusBuilder& builder, const DefaultCorpusOptions& options,
                       int64_t text_bytes) {
  const std::string source = "python-stdlib";
  SourceStats& stats = builder.Source(source);
  std::vector<CodeFile> files;
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(options.python_dir, ec);
  if (ec) {
    return Status::Error(options.python_dir + ": cannot read the Python standard library: " +
                         ec.message() + " (hint: run scripts/install-deps.sh; it installs libpython3-stdlib)");
  }
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    const fs::path& p = it->path();
    std::error_code fec;
    if (it->is_directory(fec)) {
      if (IsSkippedPythonDir(p.filename().string()) || it->is_symlink(fec)) it.disable_recursion_pending();
      continue;
    }
    if (p.extension() != ".py" || !it->is_regular_file(fec)) continue;
    int64_t size = static_cast<int64_t>(it->file_size(fec));
    if (fec || size == 0) continue;
    if (size > options.max_code_file_bytes) {
      stats.capped_files += 1;
      continue;
    }
    files.push_back({fs::relative(p, options.python_dir).string(), p.string(), size});
  }
  if (files.empty()) {
    return Status::Error(options.python_dir + ": no .py files found (hint: run scripts/install-deps.sh; it installs libpython3-stdlib)");
  }
  // Pick files in the order of a hash of their relative path until the cap is
  // reached, so the subset is spread over the library; then restore path order.
  int64_t cap = options.max_code_to_text_ratio > 0
                    ? static_cast<int64_t>(options.max_code_to_text_ratio * static_cast<double>(text_bytes))
                    : INT64_MAX;
  std::vector<CodeFile> by_hash = files;
  std::sort(by_hash.begin(), by_hash.end(), [](const CodeFile& a, const CodeFile& b) {
    uint64_t ha = Checksum64(a.relative), hb = Checksum64(b.relative);
    return ha != hb ? ha < hb : a.relative < b.relative;
  });
  std::vector<CodeFile> kept;
  int64_t used = 0;
  for (auto& f : by_hash) {
    if (used + f.bytes > cap) {
      stats.capped_files += 1;
      continue;
    }
    used += f.bytes;
    kept.push_back(f);
  }
  std::sort(kept.begin(), kept.end(),
            [](const CodeFile& a, const CodeFile& b) { return a.relative < b.relative; });
  for (auto& f : kept) {
    auto text = ReadWholeFile(f.path);
    if (!text.ok() || !IsValidUtf8(text.value()) ||
        text.value().find('\0') != std::string::npos) {
      builder.Source(source).skipped_files += 1;
      continue;
    }
    builder.Source(source).files += 1;
    builder.Add(source, f.path, std::move(text.value()));
  }
  return Status::Ok();
}

const std::set<std::string>& TextExtensions() {
  static const std::set<std::string> kExt = {
      ".txt", ".md",   ".rst",  ".text", ".py",    ".pyi",  ".c",    ".cc",   ".cpp",  ".cxx",
      ".h",   ".hh",   ".hpp",  ".hxx",  ".cu",    ".cuh",  ".java", ".js",   ".ts",   ".go",
      ".rs",  ".rb",   ".sh",   ".bash", ".zsh",   ".toml", ".yaml", ".yml",  ".json", ".ini",
      ".cfg", ".tex",  ".html", ".htm",  ".css",   ".xml",  ".csv",  ".tsv",  ".lua",  ".pl",
      ".php", ".swift", ".kt",  ".scala", ".sql",  ".cmake", ".mk",  ".proto", ".el", ".hs",
      ".ml",  ".m",    ".r",    ".jl",   ".org",   ".adoc", ".asm",  ".s",    ".f90", ".zig"};
  return kExt;
}

}  // namespace

Result<Corpus> LoadDefaultCorpus(const DefaultCorpusOptions& options) {
  Corpus corpus;
  CorpusBuilder builder(&corpus);
  const std::set<std::string> chinese = ChineseFortuneNames(options);
  std::vector<std::string> names = SortedFileNames(options.fortunes_dir);

  builder.Source("fortunes-en");
  for (const auto& name : names) {
    if (name[0] == '.' || EndsWith(name, ".dat") || EndsWith(name, ".u8") || chinese.count(name)) continue;
    bool ok = AddFortuneFile(builder, "fortunes-en", options.fortunes_dir + "/" + name, "ISO-8859-1");
    (ok ? builder.Source("fortunes-en").files : builder.Source("fortunes-en").skipped_files) += 1;
  }
  builder.Source("fortunes-zh");
  for (const auto& name : names) {
    if (!chinese.count(name)) continue;
    bool ok = AddFortuneFile(builder, "fortunes-zh", options.fortunes_dir + "/" + name, "GB18030");
    (ok ? builder.Source("fortunes-zh").files : builder.Source("fortunes-zh").skipped_files) += 1;
  }
  if (builder.Source("fortunes-en").documents == 0) {
    return Status::Error(options.fortunes_dir + ": no English fortunes found (hint: run scripts/install-deps.sh; it installs the `fortunes` package)");
  }
  if (builder.Source("fortunes-zh").documents == 0) {
    return Status::Error(options.fortunes_dir + ": no Chinese fortunes found (hint: run scripts/install-deps.sh; it installs the `fortunes-zh` package)");
  }
  int64_t text_bytes = builder.Source("fortunes-en").bytes + builder.Source("fortunes-zh").bytes;
  RETURN_IF_ERROR(AddPythonStdlib(builder, options, text_bytes));
  return corpus;
}

Result<Corpus> LoadFolderCorpus(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Status::Error(dir + ": input folder does not exist or is not a folder (hint: pass a folder of .txt/.md/code files, or omit --input for the built-in corpus)");
  }
  struct Entry {
    std::string relative, path;
  };
  std::vector<Entry> entries;
  auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path& p = it->path();
    std::string name = p.filename().string();
    std::error_code fec;
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory(fec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(fec)) continue;
    entries.push_back({fs::relative(p, dir).generic_string(), p.string()});
  }
  if (ec) return Status::Error(dir + ": cannot walk the input folder: " + ec.message());
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.relative < b.relative; });

  Corpus corpus;
  CorpusBuilder builder(&corpus);
  for (const auto& e : entries) {
    size_t slash = e.relative.find('/');
    std::string source = slash == std::string::npos ? "." : e.relative.substr(0, slash);
    std::string ext = fs::path(e.relative).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
    if (!ext.empty() && !TextExtensions().count(ext)) {
      builder.Source(source).skipped_files += 1;
      continue;
    }
    auto text = ReadWholeFile(e.path);
    if (!text.ok() || text.value().empty() || text.value().find('\0') != std::string::npos ||
        !IsValidUtf8(text.value())) {
      builder.Source(source).skipped_files += 1;
      continue;
    }
    builder.Source(source).files += 1;
    builder.Add(source, e.path, std::move(text.value()));
  }
  if (corpus.documents.empty()) {
    return Status::Error(dir + ": no text documents found in " + std::to_string(entries.size()) +
                         " files (hint: files must be valid UTF-8 with a text extension such as .txt, .md, .py, or none)");
  }
  return corpus;
}

}  // namespace myriad
