// Test helpers for the data module (tests only).
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"

namespace myriad {

// A fresh, empty folder under $TMPDIR (or /tmp), removed with its contents
// when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/myriad_" + tag + "_XXXXXX";
    CHECK(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The source tree: $MYRIAD_SOURCE_DIR (ctest sets it), else, for a test
// binary run by hand from its build folder, the source folder that folder's
// CMakeCache.txt names; empty when neither is known.
inline std::string SourceDirForTests() {
  if (const char* env = std::getenv("MYRIAD_SOURCE_DIR")) return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  std::ifstream cache(exe.parent_path() / "CMakeCache.txt");
  const std::string key = "CMAKE_HOME_DIRECTORY:INTERNAL=";
  for (std::string line; std::getline(cache, line);) {
    if (line.compare(0, key.size(), key) == 0) return line.substr(key.size());
  }
  return "";
}

}  // namespace myriad
