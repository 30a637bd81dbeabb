#include "edge/entity.h"

#include <cctype>

#include "core/utf8.h"

namespace myriad::edge {
namespace {
constexpr const char* kNames[kNumEntityTypes] = {"PERSON", "ADDRESS", "ORG",      "ID_CN", "PHONE",
                                                 "BANK_CARD", "EMAIL", "URL",    "IP",    "PASSPORT",
                                                 "PLATE",  "CREDIT_CODE", "SSN"};
}  // namespace

const char* EntityTypeName(EntityType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < kNumEntityTypes ? kNames[i] : "UNKNOWN";
}

std::optional<EntityType> ParseEntityType(std::string_view name) {
  for (int i = 0; i < kNumEntityTypes; ++i) {
    const std::string_view n = kNames[i];
    if (n.size() != name.size()) continue;
    bool same = true;
    for (size_t k = 0; k < n.size() && same; ++k)
      same = std::toupper(static_cast<unsigned char>(name[k])) == n[k];
    if (same) return static_cast<EntityType>(i);
  }
  return std::nullopt;
}

bool IsChecksumValidated(EntityType t) {
  return t == EntityType::kResidentId || t == EntityType::kBankCard || t == EntityType::kCreditCode;
}

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const size_t n = Utf8SequenceLength(s, i, &cp);
    if (n == 0) {
      out.push_back(U'\uFFFD');
      ++i;
    } else {
      out.push_back(cp);
      i += n;
    }
  }
  return out;
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) Utf8Append(c, &out);
  return out;
}

}  // namespace myriad::edge
