// The check characters of the identifiers desensitisation validates, one
// place for the detectors and the corpus generator:
//   GB 11643  mainland resident ID: 17 digits, then "10X98765432"[sum(d_i * 2^(17-i) mod 11) mod 11]
//   Luhn      payment cards
//   GB 32100  unified social credit code: 17 characters of
//             "0123456789ABCDEFGHJKLMNPQRTUWXY", then 31 - (sum(c_i * 3^i mod 31) mod 31), 31 -> 0
#pragma once

#include <optional>
#include <string_view>

namespace myriad::edge {

// The 18th character of an ID from its first 17 ASCII digits; nullopt when
// they are not 17 digits.
std::optional<char> ResidentIdCheckChar(std::string_view first17);
// An 18-character ID (upper or lower x) whose last character is its check character.
bool ResidentIdCheckValid(std::string_view id18);

// The Luhn check digit that completes `body` (digits only); nullopt otherwise.
std::optional<char> LuhnCheckDigit(std::string_view body);
bool LuhnValid(std::string_view digits);

// The 18th character of a credit code from its first 17; nullopt when one is
// outside the code's alphabet (I, O, S, V, Z and lower case are not in it).
std::optional<char> CreditCodeCheckChar(std::string_view first17);
bool CreditCodeCheckValid(std::string_view code18);

}  // namespace myriad::edge
