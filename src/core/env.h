// Env: the seam through which checkpoints, the KV disk tier and the supervisor
// touch files and clocks, so that tests can inject faults (torn writes, full
// disk, slow disk). Default() is the real POSIX implementation; it is
// thread-safe. Paths are plain strings; errors name the path and errno text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace myriad {

class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(std::string_view data) = 0;
  virtual Status Sync() = 0;   // fsync: data is durable when this returns ok
  virtual Status Close() = 0;  // idempotent
};

class Env {
 public:
  virtual ~Env() = default;
  static Env* Default();

  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  virtual Result<std::string> ReadFile(const std::string& path) = 0;
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual Status RemoveAll(const std::string& path) = 0;
  virtual Status CreateDirs(const std::string& path) = 0;
  virtual Status SyncDir(const std::string& path) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual uint64_t NowMicros() = 0;
};

// Writes `data` to `path` durably and atomically: path.tmp, fsync, rename,
// fsync of the directory. On failure the old file at `path`, if any, is intact.
// With sync = false the two fsyncs are skipped: still atomic for readers and
// across a killed process (the page cache outlives it), but a power loss may
// leave the new file empty or partial -- for data that verifies itself.
Status WriteFileAtomic(Env* env, const std::string& path, std::string_view data, bool sync = true);

}  // namespace myriad
