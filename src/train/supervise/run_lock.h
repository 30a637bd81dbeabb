// One writer per run directory (train.out_dir): two jobs training into the
// same folder share its checkpoints and its shared-memory copy, and each
// deletes what the other writes. A run directory holds two lock files,
// taken with flock(2) -- so "the holder is alive" is the kernel's word, and
// a holder that died (even by SIGKILL) holds nothing -- each with its
// holder's {"pid", "host", "role", "supervisor"} for the messages:
//
//   <dir>/launch.lock  held by `myriad launch` for as long as it supervises;
//   <dir>/train.lock   held by rank 0 of `myriad train`, supervised or not.
//
// `launch` takes launch.lock, then checks that no train.lock holder is alive
// (a job left running by a supervisor that died). `train` takes train.lock,
// then checks that no launch.lock holder is alive -- unless that holder is its
// own supervisor ($MYRIAD_SUPERVISOR_PID, lifeline.h). Each takes its own
// lock before it checks the other's, so of two that start together at most
// one gets both. A lock file left by a holder that is gone is taken over with
// a warning naming the old pid and host. Released locks are emptied, never
// deleted (deleting a flock'ed file lets two holders lock two files).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "train/comm/comm.h"

namespace myriad::supervise {

inline constexpr const char* kLaunchLockFile = "launch.lock";
inline constexpr const char* kTrainLockFile = "train.lock";

class RunLock {
 public:
  // `myriad launch`: the error names the live holder (pid, host, file).
  static Result<std::unique_ptr<RunLock>> ForLaunch(const std::string& dir);
  // Rank 0 of `myriad train`; supervisor_pid: the launch that started it
  // (0: none), whose launch.lock is then no obstacle.
  static Result<std::unique_ptr<RunLock>> ForTrain(const std::string& dir, int64_t supervisor_pid);
  ~RunLock();  // empties the file and releases it
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }

  RunLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}  // takes an flock'ed fd

 private:
  int fd_;
  std::string path_;
};

// The trainer's call: rank 0 takes the lock for train (with its supervisor
// from $MYRIAD_SUPERVISOR_PID), every rank of `world` learns whether it got
// it (one broadcast), and the others return an error when it did not. The
// lock is null on the other ranks.
Result<std::unique_ptr<RunLock>> LockRunDirForTraining(comm::Comm* world, const std::string& dir);

}  // namespace myriad::supervise
