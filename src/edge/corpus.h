// A labelled corpus for desensitisation: synthetic documents (weekly
// regional reports, e-mails, tables, chat logs, support tickets; Chinese,
// English and mixed) with every EntityType planted in the written forms
// people use, and decoys -- numbers that look like PII but must stay (order,
// invoice and tracking numbers, timestamps, amounts, 18-digit numbers whose
// ID check character is wrong).
//
// Deterministic in (seed, split, index). The name, address and organisation
// lexicons are cut in two by a hash of each entry (about 20% held out): a
// held-out document draws only held-out entries and a training document
// only training ones, so a tagger's held-out figures measure generalisation
// to names it never saw.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "edge/entity.h"

namespace myriad::edge {

struct LabelledDoc {
  std::string id, kind, lang, text;  // kind: report|email|table|chat|ticket; lang: zh|en|mixed
  std::vector<Span> spans;   // the planted entities, code points of `text`, sorted
  std::vector<Span> decoys;  // look-alikes that must NOT be redacted; type: the type they imitate
};

enum class Split { kTrain, kHeldOut };
const char* SplitName(Split s);                       // "train" | "held-out"
std::optional<Split> ParseSplit(std::string_view s);  // nullopt for anything else

// The lexicon categories split by hash: "cn_surname", "cn_given", "en_first",
// "en_last", "cn_place" (province/city/district triples), "cn_road",
// "en_street", "en_city", "org_brand", "en_org_word".
std::vector<std::string> LexiconCategories();
// A category both splits draw all of (Chinese surnames: a closed class).
bool IsClosedLexicon(std::string_view category);
// The entries of one category that documents of `split` draw from (disjoint
// between the splits, neither empty).
std::vector<std::string> LexiconEntries(std::string_view category, Split split);

// Document `index` of the corpus (seed, split).
LabelledDoc GenerateDoc(uint64_t seed, Split split, int64_t index);
// Documents 0..count-1.
std::vector<LabelledDoc> GenerateCorpus(uint64_t seed, Split split, int64_t count);

// Free text with no labelled entity (kind "plain"): pieces of `texts` (the
// built-in corpus: fortunes, Python sources) of 40..400 code points cut at
// line ends, each piece in the train or the held-out split by a hash of its
// text, up to `count` of them in a seeded order. The tagger learns from them
// to leave ordinary prose and code alone; held out, they measure what it
// redacts where there is nothing to redact.
std::vector<LabelledDoc> PlainTextDocs(const std::vector<std::string>& texts, Split split, int64_t count,
                                       uint64_t seed);

// The text a span covers (code points [start, end) of `text`, as UTF-8).
std::string SpanText(std::string_view text, const Span& s);

// JSONL: one document per line, {"id","kind","lang","text","spans":[{start,end,type}],"decoys":[...]}.
std::string DocToJsonLine(const LabelledDoc& d);
Result<LabelledDoc> DocFromJsonLine(std::string_view line);
Status WriteJsonl(const std::string& path, const std::vector<LabelledDoc>& docs);
// Errors name the file and the line.
Result<std::vector<LabelledDoc>> ReadJsonl(const std::string& path);

}  // namespace myriad::edge
