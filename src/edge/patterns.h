// Pattern detectors with validators: resident IDs (GB 11643), phones,
// payment cards (Luhn), e-mail, URLs, IPv4/IPv6, passports, licence plates,
// unified social credit codes (GB 32100) and US SSNs. They run on the
// normalised text (edge/normalize.h) and answer spans on the ORIGINAL text.
//
// What each one accepts and refuses is in docs/edge.md ("Desensitisation").
// In short: a digit match never starts or ends inside a longer digit run or
// an alphanumeric token; checksum types are validated (an 18-digit run with
// a wrong check character is a decoy, never a span); timestamps are decoys;
// order/invoice/tracking keywords just before an ambiguous number lower its
// confidence below the redaction threshold.
#pragma once

#include <vector>

#include "edge/entity.h"

namespace myriad::edge {

// Every pattern span in `original`, overlaps already resolved (ResolveOverlaps),
// sorted by start, with its confidence: callers drop those below their
// threshold (RedactorOptions::min_confidence).
std::vector<Span> DetectPatterns(std::u32string_view original);

// Non-overlapping spans sorted by start: greedily the longest first, then
// the most confident, then the earliest; a span that overlaps one already
// kept is dropped.
std::vector<Span> ResolveOverlaps(std::vector<Span> spans);

// A plausible birth date "YYYYMMDD" (1900..2099, real month and day, leap years).
bool PlausibleDate(std::u32string_view yyyymmdd);

}  // namespace myriad::edge
