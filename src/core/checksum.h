// The one checksum: xxHash64 (seed 0), printed as 16 lowercase hex digits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace myriad {
uint64_t Checksum64(const void* data, size_t size);
inline uint64_t Checksum64(std::string_view s) { return Checksum64(s.data(), s.size()); }
std::string ChecksumHex(uint64_t h);
}  // namespace myriad
