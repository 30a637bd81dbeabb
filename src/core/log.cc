#include "core/log.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace myriad {
namespace {
LogLevel InitialLevel() {
  const char* e = std::getenv("MYRIAD_LOG");
  if (!e) return LogLevel::kInfo;
  if (!std::strcmp(e, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(e, "warn")) return LogLevel::kWarn;
  if (!std::strcmp(e, "error")) return LogLevel::kError;
  return LogLevel::kInfo;
}
LogLevel g_level = InitialLevel();
const auto g_start = std::chrono::steady_clock::now();
std::mutex g_mu;
}  // namespace

void SetLogLevel(LogLevel level) { g_level = level; }
LogLevel GetLogLevel() { return g_level; }

void LogF(LogLevel level, const char* fmt, ...) {
  if (level < g_level) return;
  static const char* kTag[] = {"debug", "info", "warn", "error"};
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_start).count();
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "[%8.2fs %s] ", t, kTag[static_cast<int>(level)]);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
}

}  // namespace myriad
