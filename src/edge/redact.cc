// The Redactor (patterns and tagger merged) and Restore / StreamRestorer.
#include "edge/redact.h"

#include <algorithm>

#include "core/utf8.h"
#include "edge/normalize.h"
#include "edge/patterns.h"

namespace myriad::edge {

// ---- Redactor ---------------------------------------------------------------

Redactor::Redactor(const SpanTagger* tagger, RedactorOptions opt) : tagger_(tagger), opt_(opt) {}

namespace {

std::vector<Span> DetectOn(std::u32string_view text, const SpanTagger* tagger, float min_confidence) {
  std::vector<Span> spans;
  for (const Span& s : DetectPatterns(text))
    if (s.confidence >= min_confidence) spans.push_back(s);
  if (tagger) {
    // Tagger spans never override a pattern's: one that overlaps a pattern
    // span is dropped; the rest resolve among themselves.
    const int64_t n = static_cast<int64_t>(text.size());
    std::vector<Span> tagged;
    for (Span t : tagger->Tag(text)) {
      t.start = std::clamp<int64_t>(t.start, 0, n);
      t.end = std::clamp<int64_t>(t.end, 0, n);
      if (t.end <= t.start || t.confidence < min_confidence) continue;
      // The pattern spans are sorted and disjoint: only the first one that
      // ends after t starts can overlap it.
      const auto p = std::upper_bound(spans.begin(), spans.end(), t.start,
                                      [](int64_t at, const Span& q) { return at < q.end; });
      if (p == spans.end() || p->start >= t.end) tagged.push_back(t);
    }
    for (const Span& t : ResolveOverlaps(std::move(tagged))) spans.push_back(t);
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  }
  return spans;
}

// Byte offset of every code point of `s` as DecodeUtf8 counts them, and the end.
std::vector<size_t> CodePointOffsets(std::string_view s) {
  std::vector<size_t> off;
  off.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    off.push_back(i);
    char32_t cp;
    const size_t n = Utf8SequenceLength(s, i, &cp);
    i += n ? n : 1;
  }
  off.push_back(s.size());
  return off;
}

}  // namespace

std::vector<Span> Redactor::Detect(std::string_view utf8) const {
  return DetectOn(DecodeUtf8(utf8), tagger_, opt_.min_confidence);
}

Redaction Redactor::Redact(std::string_view utf8, Vault* vault) const {
  Vault scratch;
  if (!vault) vault = &scratch;
  Redaction r;
  r.spans = Detect(utf8);
  // Text outside the spans is copied byte for byte (malformed bytes too).
  const std::vector<size_t> off = CodePointOffsets(utf8);
  size_t at = 0;
  for (const Span& s : r.spans) {
    const size_t b = off[s.start], e = off[s.end];
    r.text.append(utf8.substr(at, b - at));
    r.text += vault->Placeholder(s.type, utf8.substr(b, e - b));
    at = e;
  }
  r.text.append(utf8.substr(at));
  return r;
}

// ---- Restore ----------------------------------------------------------------

namespace {

enum class Outcome { kNo, kYes, kNeedMore };

struct Token {
  Outcome outcome = Outcome::kNo;
  size_t len = 0;                 // bytes, opening to closing bracket
  std::optional<EntityType> type;
  std::string name;               // canonical NAME as written (upper case)
  int64_t index = 0;
};

Token NeedMore() {
  Token t;
  t.outcome = Outcome::kNeedMore;
  return t;
}

// Brackets a model may put around a placeholder. "[[" before "[".
constexpr std::string_view kOpeners[] = {"\u27E6", "\u301A", "\u3010", "\uFF3B", "\u3016", "[[", "["};
bool IsCloser(char32_t c) {  // after NormalizeChar: '］' is ']'
  return c == U']' || c == U'\u27E7' || c == U'\u301B' || c == U'\u3011' || c == U'\u3017';
}
constexpr size_t kMaxInner = 40;  // code points between the brackets

// The code point at s[i] (normalised) and its length; 0 when the bytes
// there are incomplete at the end of `s` (more may come), -1 malformed.
int NextCodePoint(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const size_t want = b0 < 0x80 ? 1 : (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : (b0 & 0xF8) == 0xF0 ? 4 : 0;
  if (want == 0) return -1;
  if (i + want > s.size()) return 0;
  const size_t n = Utf8SequenceLength(s, i, cp);
  if (n == 0) return -1;
  *cp = NormalizeChar(*cp);
  return static_cast<int>(n);
}

// "PERSON_1", "person 1", "BANK-CARD-2", "bankcard2" -> (name, index); false otherwise.
bool ParseInner(const std::u32string& inner, std::string* name, int64_t* index) {
  std::string c;  // upper case, runs of ' ', '_', '-' as one '_', trimmed
  for (char32_t ch : inner) {
    if (ch == U' ' || ch == U'_' || ch == U'-' || ch == U'\t') {
      if (!c.empty() && c.back() != '_') c.push_back('_');
    } else {
      c.push_back(static_cast<char>(ch >= U'a' && ch <= U'z' ? ch - 32 : ch));
    }
  }
  while (!c.empty() && c.back() == '_') c.pop_back();
  size_t d = c.size();
  while (d > 0 && c[d - 1] >= '0' && c[d - 1] <= '9') --d;
  if (d == c.size() || c.size() - d > 9) return false;
  std::string n = c.substr(0, d);
  if (!n.empty() && n.back() == '_') n.pop_back();
  if (n.empty()) return false;
  for (char ch : n)
    if (!((ch >= 'A' && ch <= 'Z') || ch == '_')) return false;
  *name = n;
  *index = std::stoll(c.substr(d));
  return true;
}

std::optional<EntityType> TypeOfName(const std::string& name) {
  if (auto t = ParseEntityType(name)) return t;
  auto squash = [](std::string_view s) {
    std::string o;
    for (char c : s)
      if (c != '_') o.push_back(c);
    return o;
  };
  const std::string want = squash(name);
  for (int i = 0; i < kNumEntityTypes; ++i)
    if (squash(EntityTypeName(static_cast<EntityType>(i))) == want) return static_cast<EntityType>(i);
  return std::nullopt;
}

// The placeholder that starts at s[i], if any. Decided only from bytes up to
// the decision point, so that a longer `s` never changes a kYes or kNo:
// that is what makes StreamRestorer equal Restore.
Token MatchToken(std::string_view s, size_t i, bool final) {
  Token tok;
  bool need_more = false;
  for (std::string_view open : kOpeners) {
    const size_t avail = s.size() - i;
    if (avail < open.size()) {
      if (!final && s.substr(i) == open.substr(0, avail)) need_more = true;
      continue;
    }
    if (s.substr(i, open.size()) != open) continue;
    const bool strong = open == kOpeners[0] || open == kOpeners[1];  // ⟦ 〚
    std::u32string inner;
    size_t k = i + open.size();
    for (;;) {
      if (k >= s.size()) {
        if (!final) return NeedMore();
        break;
      }
      char32_t cp;
      const int n = NextCodePoint(s, k, &cp);
      if (n == 0) {
        if (!final) return NeedMore();
        break;
      }
      if (n < 0) break;
      if (cp == kRemovedChar) {  // zero-width inside: ignored
        k += n;
        continue;
      }
      if (IsCloser(cp)) {
        size_t end = k + n;
        if (open == "[[" && cp == U']') {  // "]]" closes "[[" (a single "]" does too)
          if (end >= s.size() && !final) return NeedMore();
          char32_t cp2;
          const int n2 = end < s.size() ? NextCodePoint(s, end, &cp2) : -1;
          if (n2 == 0 && !final) return NeedMore();
          if (n2 > 0 && cp2 == U']') end += n2;
        }
        std::string name;
        int64_t index;
        if (!ParseInner(inner, &name, &index)) break;
        tok.type = TypeOfName(name);
        if (!tok.type && !strong) break;
        tok.outcome = Outcome::kYes;
        tok.len = end - i;
        tok.name = tok.type ? EntityTypeName(*tok.type) : name;
        tok.index = index;
        return tok;
      }
      const bool ok = (cp >= U'a' && cp <= U'z') || (cp >= U'A' && cp <= U'Z') || (cp >= U'0' && cp <= U'9') ||
                      cp == U' ' || cp == U'_' || cp == U'-' || cp == U'\t';
      if (!ok || inner.size() >= kMaxInner) break;
      inner.push_back(cp);
      k += n;
    }
  }
  tok.outcome = need_more ? Outcome::kNeedMore : Outcome::kNo;
  return tok;
}

bool MayOpen(unsigned char b) { return b == '[' || b == 0xE2 || b == 0xE3 || b == 0xEF; }

// Restores s into *out from the start; returns the bytes consumed: all of
// them when `final`, otherwise up to the first place that needs more text.
size_t RestoreInto(std::string_view s, const Vault& vault, bool final, std::string* out,
                   std::vector<std::string>* unresolved) {
  size_t i = 0;
  while (i < s.size()) {
    if (!MayOpen(static_cast<unsigned char>(s[i]))) {
      out->push_back(s[i++]);
      continue;
    }
    const Token tok = MatchToken(s, i, final);
    if (tok.outcome == Outcome::kNeedMore) return i;
    if (tok.outcome == Outcome::kNo) {
      out->push_back(s[i++]);
      continue;
    }
    const std::string* original =
        tok.type && tok.index <= 1000000000 ? vault.Original(*tok.type, static_cast<int>(tok.index)) : nullptr;
    if (original) {
      *out += *original;
    } else {
      *out += "\u27E6unresolved:" + tok.name + "_" + std::to_string(tok.index) + "\u27E7";
      std::string as_written(s.substr(i, tok.len));
      if (std::find(unresolved->begin(), unresolved->end(), as_written) == unresolved->end())
        unresolved->push_back(std::move(as_written));
    }
    i += tok.len;
  }
  return i;
}

}  // namespace

Restored Restore(std::string_view answer, const Vault& vault) {
  Restored r;
  RestoreInto(answer, vault, /*final=*/true, &r.text, &r.unresolved);
  return r;
}

StreamRestorer::StreamRestorer(const Vault* vault) : vault_(vault) {}

std::string StreamRestorer::Push(std::string_view chunk) {
  pending_.append(chunk);
  std::string out;
  const size_t used = RestoreInto(pending_, *vault_, /*final=*/false, &out, &unresolved_);
  pending_.erase(0, used);
  return out;
}

std::string StreamRestorer::Finish() {
  std::string out;
  RestoreInto(pending_, *vault_, /*final=*/true, &out, &unresolved_);
  pending_.clear();
  return out;
}

}  // namespace myriad::edge
