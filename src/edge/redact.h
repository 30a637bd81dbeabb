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

// One session's placeholders and the originals behind them (device-local).
class Vault {
 public:
  // The placeholder of (type, value): the same one every time for the same
  // entity (the value compared after normalisation: case for e-mails, digit
  // forms and separators for numbers, whitespace), a new ⟦TYPE_n⟧ otherwise.
  std::string Placeholder(EntityType type, std::string_view value);
  // The original text behind a placeholder's (type, index), or null.
  const std::string* Original(EntityType type, int index) const;
  int64_t size() const;
  // JSON (the CLI's --vault file). Load refuses a malformed file with one line naming it.
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
  std::vector<Entry> entries_;
};

struct Redaction {
  std::string text;            // the redacted text (UTF-8)
  std::vector<Span> spans;     // on the original text, sorted, non-overlapping
};

struct RedactorOptions {
  float min_confidence = 0.5f;  // spans below this are left in the text
};

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
// (case, inner spaces, ⟦⟧ / [[ ]] / 【】 / full-width brackets, repeated,
// reordered), replaced by its original.
Restored Restore(std::string_view answer, const Vault& vault);

// Restore over a stream of chunks (SSE deltas): text that may still be the
// start of a placeholder is held back until it completes or cannot.
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
