// The one logger: printf-style, to stderr, with a level and elapsed seconds.
#pragma once
#include <cstdarg>

namespace myriad {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogF(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace myriad

#define LOG_DEBUG(...) ::myriad::LogF(::myriad::LogLevel::kDebug, __VA_ARGS__)
#define LOG_INFO(...) ::myriad::LogF(::myriad::LogLevel::kInfo, __VA_ARGS__)
#define LOG_WARN(...) ::myriad::LogF(::myriad::LogLevel::kWarn, __VA_ARGS__)
#define LOG_ERROR(...) ::myriad::LogF(::myriad::LogLevel::kError, __VA_ARGS__)
