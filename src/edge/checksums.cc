#include "edge/checksums.h"

#include <cstring>

namespace myriad::edge {
namespace {
constexpr char kCreditAlphabet[] = "0123456789ABCDEFGHJKLMNPQRTUWXY";  // 31 characters

int CreditValue(char c) {
  const char* p = c ? std::strchr(kCreditAlphabet, c) : nullptr;
  return p ? static_cast<int>(p - kCreditAlphabet) : -1;
}
bool AllDigits(std::string_view s) {
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return !s.empty();
}
}  // namespace

std::optional<char> ResidentIdCheckChar(std::string_view first17) {
  if (first17.size() != 17 || !AllDigits(first17)) return std::nullopt;
  int sum = 0, weight = 1;  // 2^(17-i) mod 11, built from the last digit up
  for (int i = 16; i >= 0; --i) {
    weight = weight * 2 % 11;
    sum += (first17[i] - '0') * weight;
  }
  return "10X98765432"[sum % 11];
}

bool ResidentIdCheckValid(std::string_view id18) {
  if (id18.size() != 18) return false;
  const auto c = ResidentIdCheckChar(id18.substr(0, 17));
  const char last = id18[17] == 'x' ? 'X' : id18[17];
  return c && *c == last;
}

std::optional<char> LuhnCheckDigit(std::string_view body) {
  if (!AllDigits(body)) return std::nullopt;
  int sum = 0;
  bool twice = true;  // the digit left of the check digit is doubled
  for (size_t k = body.size(); k-- > 0;) {
    int d = body[k] - '0';
    if (twice) d = d * 2 > 9 ? d * 2 - 9 : d * 2;
    sum += d;
    twice = !twice;
  }
  return static_cast<char>('0' + (10 - sum % 10) % 10);
}

bool LuhnValid(std::string_view digits) {
  if (digits.size() < 2) return false;
  const auto c = LuhnCheckDigit(digits.substr(0, digits.size() - 1));
  return c && *c == digits.back();
}

std::optional<char> CreditCodeCheckChar(std::string_view first17) {
  if (first17.size() != 17) return std::nullopt;
  int sum = 0, weight = 1;
  for (char c : first17) {
    const int v = CreditValue(c);
    if (v < 0) return std::nullopt;
    sum += v * weight;
    weight = weight * 3 % 31;
  }
  return kCreditAlphabet[(31 - sum % 31) % 31];
}

bool CreditCodeCheckValid(std::string_view code18) {
  if (code18.size() != 18) return false;
  const auto c = CreditCodeCheckChar(code18.substr(0, 17));
  return c && *c == code18[17];
}

}  // namespace myriad::edge
