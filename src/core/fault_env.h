// FaultEnv: an Env that wraps another one (default Env::Default()) and fails
// on command, for tests and for the trainer's fault drills (a full disk in the
// middle of a checkpoint, a failed rename of `latest`, ...). Everything not
// armed is passed through unchanged. Thread-safe: faults may be armed and
// disarmed while other threads write through it. The wrapped Env must outlive
// it, and it must outlive the files it opened.
//
// Faults (each kind is one slot; arming a kind replaces its previous setting):
//   enospc   Once `bytes` bytes have been written through this Env since the
//            fault was armed (all Appends count, whatever the file), every
//            Append to a file whose path contains `path` (empty: any file)
//            fails with "No space left on device". The Append that crosses
//            the budget writes the part that fits first: a torn file, as a
//            real full disk leaves. Stays in force until disarmed.
//   append   The n-th Append (1-based, counted from arming) to a file whose
//            path contains `path` (empty: any file) fails without writing
//            anything. Fires once.
//   rename   Every RenameFile whose target ends with `suffix` fails (nothing
//            is renamed). Stays in force until disarmed.
//   syncdir  Every SyncDir of a directory whose path ends with `suffix`
//            fails. Stays in force until disarmed.
//   crash    Like enospc, but the Append that crosses the budget writes the
//            part that fits and then the process dies (SIGKILL): a crash in
//            the middle of a write, for drills.
// Injected errors name the path and end in "(injected fault)".
//
// Spec strings (Arm): faults separated by ';', each "kind:key=value,...":
//   "enospc:bytes=1000000,path=step_"   "append:n=3"   "append:n=2,path=latest"
//   "rename:suffix=latest"              "syncdir:suffix=.tmp"
//   "enospc:bytes=0;rename:suffix=latest"   (two at once)
//   "crash:bytes=4096,path=step_00000012"
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace myriad {

class FaultEnv : public Env {
 public:
  explicit FaultEnv(Env* base = Env::Default());
  FaultEnv(const FaultEnv&) = delete;
  FaultEnv& operator=(const FaultEnv&) = delete;

  // Setters: each arms (or, with the "off" value, disarms) one kind.
  // bytes < 0: off. An empty path_substring matches every file.
  void SetEnospcAfterBytes(int64_t bytes, std::string path_substring = "");
  // n <= 0: off.
  void SetFailAppend(int64_t n, std::string path_substring = "");
  // Empty suffix: off.
  void SetFailRename(std::string target_suffix);
  void SetFailSyncDir(std::string dir_suffix);
  // bytes < 0: off.
  void SetCrashAfterBytes(int64_t bytes, std::string path_substring = "");

  // Parses `spec` (see above) and arms the faults it names; the kinds it does
  // not name keep their settings. All or nothing: a bad spec arms nothing and
  // the error quotes the spec and names the bad part, e.g.
  //   fault spec "enospc:bytez=1": unknown key "bytez" for enospc (expected bytes, path) (hint: ...)
  Status Arm(const std::string& spec);
  // Turns every fault off (counters of fired faults are kept).
  void Disarm();
  // The armed faults as a spec Arm accepts ("" when none): for logs.
  std::string Armed() const;

  // Faults that fired since construction (an Append, rename or SyncDir that
  // failed because of an armed fault; a failing ENOSPC Append counts once).
  int64_t faults_fired() const;
  // Appends and bytes passed through since construction (failed ones included;
  // bytes counts only what reached the wrapped Env).
  int64_t appends() const;
  int64_t bytes_written() const;

  Env* base() const { return base_; }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Result<std::string> ReadFile(const std::string& path) override;
  Status RenameFile(const std::string& from, const std::string& to) override;
  Status RemoveAll(const std::string& path) override;
  Status CreateDirs(const std::string& path) override;
  Status SyncDir(const std::string& path) override;
  bool FileExists(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override;
  uint64_t NowMicros() override;

 private:
  class File;
  struct Faults {
    int64_t enospc_bytes = -1;  // -1: off
    std::string enospc_path;
    int64_t append_n = 0;  // 0: off
    std::string append_path;
    std::string rename_suffix;  // "": off
    std::string syncdir_suffix;  // "": off
    int64_t crash_bytes = -1;    // -1: off
    std::string crash_path;
  };
  // Decides one Append of `size` bytes to `path`: how many bytes to pass
  // through, the injected error (ok: none), and whether the process is to
  // die once they are written (crash).
  Status BeforeAppend(const std::string& path, size_t size, size_t* pass, bool* die);

  Env* const base_;
  mutable std::mutex mu_;
  Faults faults_;
  int64_t enospc_used_ = 0;     // bytes written since enospc was armed
  int64_t crash_used_ = 0;      // bytes written since crash was armed
  int64_t append_seen_ = 0;     // matching Appends since append was armed
  int64_t fired_ = 0;
  int64_t appends_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace myriad
