#include "core/checksum.h"

#include <xxhash.h>

#include <cstdio>

namespace myriad {
uint64_t Checksum64(const void* data, size_t size) { return XXH64(data, size, 0); }
std::string ChecksumHex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace myriad
