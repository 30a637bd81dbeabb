// The normalizers and pre-tokenizers of Hugging Face tokenizer.json files
// (internal to src/data; the public face is data/tokenizer.h).
//
// Semantics are those of Hugging Face's reference library (Rust `tokenizers`,
// whose regexes are Oniguruma's): patterns are translated to PCRE2 (UTF + UCP)
// so that \s is Unicode White_Space (U+0009..U+000D, U+0085, Z*), \w is
// L|M|N|Pc, (?i:...) folds case by Unicode, ^ and $ match at line feeds.
// Constructs whose meaning differs between the two engines and that a
// translation cannot keep are refused with a clear message, never run with a
// different meaning. Text given to these functions is valid UTF-8.
//
// Thread safety: everything here is immutable once built; matching may run
// on any number of threads at once.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

struct pcre2_real_code_8;

namespace myriad::hf {

// Translates a tokenizer.json regex (Oniguruma syntax) to PCRE2 syntax with
// the same meaning. Errors say what is not supported, e.g. "\b (word
// boundary) is not supported".
Result<std::string> OnigurumaToPcre2(std::string_view pattern);

// A compiled pattern (PCRE2, JIT where available).
class Regex {
 public:
  // `pattern` in tokenizer.json's (Oniguruma) syntax.
  static Result<Regex> Compile(std::string_view pattern);
  // Calls on_match(begin, end) for each match, left to right, not
  // overlapping; after an empty match the search goes on one character
  // further. `text` must be valid UTF-8.
  template <typename OnMatch>
  void ForEachMatch(std::string_view text, OnMatch&& on_match) const {
    size_t pos = 0, begin = 0, end = 0;
    while (NextMatch(text, pos, &begin, &end)) {
      on_match(begin, end);
      pos = end;
      if (end == begin) {
        if (begin >= text.size()) break;
        pos = begin + 1;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
  }

 private:
  bool NextMatch(std::string_view text, size_t from, size_t* begin, size_t* end) const;
  std::shared_ptr<pcre2_real_code_8> code_;
  std::string pattern_;  // as written in tokenizer.json, for messages
};

// What Split does with the text its pattern matches (the delimiter).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Unicode normalization forms (utf8proc).
enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

// The normalizer: null, one form, or a Sequence of forms.
class Normalizer {
 public:
  // `origin` (the file name) prefixes error messages.
  static Result<Normalizer> FromJson(const nlohmann::json& config, const std::string& origin);
  static Normalizer Forms(std::vector<NormalForm> forms);
  bool empty() const { return forms_.empty(); }
  // `text` must be valid UTF-8; so is the result.
  std::string Apply(std::string_view text) const;

 private:
  std::vector<NormalForm> forms_;
};

// Pieces are views into the text given to Run or into `arena` (for pieces
// the pre-tokenizer made, e.g. with a prefix space).
using Pieces = std::vector<std::string_view>;

// The pre-tokenizer: a sequence of steps (Split, Digits, ByteLevel), the last
// of which is ByteLevel, which marks the pieces as byte-level words.
class PreTokenizer {
 public:
  static Result<PreTokenizer> FromJson(const nlohmann::json& config, const std::string& origin);
  // The pieces of `text` (valid UTF-8), appended to *out.
  void Run(std::string_view text, Pieces* out, std::deque<std::string>* arena) const;

  struct Step;

 private:
  std::vector<std::shared_ptr<const Step>> steps_;
};

// Cuts `text` by the matches of `regex` and applies `behavior`; with
// `invert`, the matches are what is kept and the text between them is the
// delimiter. Empty pieces are dropped. Exposed for tests.
void SplitByRegex(const Regex& regex, SplitBehavior behavior, bool invert, std::string_view text,
                  Pieces* out);

}  // namespace myriad::hf
