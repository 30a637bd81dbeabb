// Test helpers for the data module (tests only).
#pragma once

#include <stdlib.h>

#include <filesystem>
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

}  // namespace myriad
