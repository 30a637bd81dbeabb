// printf into a std::string (the one formatting helper for messages and reports).
#pragma once

#include <string>

namespace myriad {

std::string StrFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace myriad
