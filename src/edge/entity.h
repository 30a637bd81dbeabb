// What desensitisation finds: the entity types, a span of text that holds
// one, and code-point text helpers. Shared by the pattern detectors, the
// tagger, the corpus generator, the evaluation and the edge front.
//
// Offsets are Unicode code points of the ORIGINAL input text (what
// `myriad redact --json` prints), never bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace myriad::edge {

enum class EntityType : int {
  kPerson = 0,    // PERSON       names (tagger)
  kAddress,       // ADDRESS      postal addresses (tagger)
  kOrg,           // ORG          organisations (tagger)
  kResidentId,    // ID_CN        mainland resident ID, 18-digit (GB 11643 check) or 15-digit
  kPhone,         // PHONE        mainland mobile/landline, international numbers
  kBankCard,      // BANK_CARD    UnionPay 62..., other cards (Luhn raises confidence)
  kEmail,         // EMAIL
  kUrl,           // URL
  kIp,            // IP           IPv4 / IPv6
  kPassport,      // PASSPORT
  kPlate,         // PLATE        licence plates, new-energy plates included
  kCreditCode,    // CREDIT_CODE  unified social credit code (GB 32100 check)
  kSsn,           // SSN          US social security number
};
constexpr int kNumEntityTypes = 13;

// "PERSON", "ADDRESS", ... as in the comments above (placeholders use them).
const char* EntityTypeName(EntityType t);
// The inverse, case-insensitive; nullopt for an unknown name.
std::optional<EntityType> ParseEntityType(std::string_view name);
// Types found by checksum-validated patterns (recall target 100%).
bool IsChecksumValidated(EntityType t);

struct Span {
  int64_t start = 0, end = 0;  // [start, end) in code points of the original text
  EntityType type = EntityType::kPerson;
  float confidence = 1.0f;     // (0, 1]
  bool operator==(const Span& o) const { return start == o.start && end == o.end && type == o.type; }
};

// UTF-8 <-> code points. Malformed bytes decode to U+FFFD one byte at a time,
// so offsets stay defined for any input.
std::u32string DecodeUtf8(std::string_view s);
std::string EncodeUtf8(std::u32string_view s);

}  // namespace myriad::edge
