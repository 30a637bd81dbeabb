// Desensitisation with exact restore: the detectors (patterns with
// validators, and the tagger behind SpanTagger) find spans; the Vault gives
// each distinct entity one typed placeholder for a session (⟦PERSON_1⟧ for
// every mention of the same person) and keeps the originals on the device;
// Restore puts them back into an answer, even when the cloud reformatted
// the placeholders, and fails closed on one it cannot resolve.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "edge/entity.h"

namespace myriad::edge {

// Names, addresses and organisations: a learned detector (edge/tagger.h).
class SpanTagger {
 public:
  virtual ~SpanTagger() = default;
  // Spans over `text` (code points), any order, may overlap the patterns'.
  virtual std::vector<Span> Tag(std::u32string_view text) const = 0;
};

// "⟦PERSON_1⟧": U+27E6, the type's name (EntityTypeName), '_', the index, U+27E7.
std::string PlaceholderText(EntityType type, int index);
// The value a Vault compares, so that one entity written two ways gets one
// placeholder: full-width forms and zero-width characters normalised
// (edge/normalize.h); phones, IDs, cards and SSNs by their digits only
// (an ID's X kept; a mobile's +86/0086 dropped); e-mails and IPs lower-cased
// without spaces; credit codes, passports and plates upper-cased without
// spaces, dashes or middle dots; anything else with whitespace collapsed.
std::string EntityKey(EntityType type, std::string_view value);

// One session's placeholders and the originals behind them (device-local).
// Indices count from 1 per type in order of first appearance. An entity seen
// in several forms is restored in the form first seen.
class Vault {
 public:
  // The placeholder of (type, value): the same one every time for the same
  // entity (the value compared after normalisation: case for e-mails, digit
  // forms and separators for numbers, whitespace), a new ⟦TYPE_n⟧ otherwise.
  std::string Placeholder(EntityType type, std::string_view value);
  // The original text behind a placeholder's (type, index), or null.
  const std::string* Original(EntityType type, int index) const;
  int64_t size() const;
  // JSON (the CLI's --vault file):
  //   {"format": "myriad-vault-1", "entries": [{"type": "PHONE", "index": 1, "original": "138 0013 8000"}]}
  // FromJson refuses malformed input with one line ("malformed vault: ...");
  // Load prefixes the file's name.
  std::string ToJson() const;
  static Result<Vault> FromJson(std::string_view json);
  Status Save(const std::string& path) const;  // atomic write with fsync
  static Result<Vault> Load(const std::string& path);

 private:
  struct Entry {
    EntityType type;
    int index;
    std::string original;
    std::string key;  // normalised value
  };
  void Add(Entry e);
  std::vector<Entry> entries_;                                // in order of first appearance
  std::map<std::pair<int, std::string>, size_t> by_key_;     // (type, key) -> entry
  std::map<std::pair<int, int>, size_t> by_index_;           // (type, index) -> entry
  std::map<int, int> next_index_;                            // type -> the next free index
};

struct Redaction {
  std::string text;            // the redacted text (UTF-8)
  std::vector<Span> spans;     // on the original text, sorted, non-overlapping
};

struct RedactorOptions {
  float min_confidence = 0.5f;  // spans below this are left in the text
};

// Detect and Redact are const and keep no state: one Redactor may serve
// every thread at once when its tagger may. A Vault is not thread-safe.
class Redactor {
 public:
  // `tagger` may be null (patterns only); not owned.
  explicit Redactor(const SpanTagger* tagger = nullptr, RedactorOptions opt = {});
  // The spans only (patterns and tagger merged; overlaps resolved).
  std::vector<Span> Detect(std::string_view utf8) const;
  // Detect, then replace every span by its vault placeholder.
  Redaction Redact(std::string_view utf8, Vault* vault) const;

 private:
  const SpanTagger* tagger_;
  RedactorOptions opt_;
};

struct Restored {
  std::string text;
  // Placeholder-like text found in the answer that names no vault entry
  // (e.g. "⟦PERSON_9⟧"): the answer then holds an explicit marker instead of
  // a guess. Empty: every placeholder was resolved.
  std::vector<std::string> unresolved;
  bool ok() const { return unresolved.empty(); }
};

// Every placeholder in `answer`, in any of the forms a model writes it
// (case, inner spaces, '-' or ' ' for '_', ⟦⟧ / 〚〛 / [[ ]] / [ ] / 【】 /
// 〖〗 / full-width brackets, full-width letters and digits, repeated,
// reordered), replaced by its original. What counts as a placeholder: an
// opening bracket, then a known type name and an index (spaces, '_' and '-'
// between), then a closing bracket; with ⟦⟧ or 〚〛 any NAME_n shape.
// Ordinary bracketed text ("[1]", "[see note]") is left alone. A placeholder
// with no vault entry becomes "⟦unresolved:TYPE_n⟧" and is listed (as
// written) in Restored::unresolved, once.
Restored Restore(std::string_view answer, const Vault& vault);

// Restore over a stream of chunks (SSE deltas): text that may still be the
// start of a placeholder is held back until it completes or cannot (at most
// a bracket and about 40 characters); everything else is emitted at once.
// The concatenation of every Push and Finish equals Restore(whole).text for
// any cutting of the whole into chunks, UTF-8 sequences cut included.
class StreamRestorer {
 public:
  explicit StreamRestorer(const Vault* vault);
  std::string Push(std::string_view chunk);  // restored text safe to emit now
  std::string Finish();                      // what was held back, restored
  const std::vector<std::string>& unresolved() const { return unresolved_; }

 private:
  const Vault* vault_;
  std::string pending_;
  std::vector<std::string> unresolved_;
};

}  // namespace myriad::edge
