// Asynchronous checkpoints: training blocks only for an in-memory snapshot;
// persisting it (SaveCheckpoint: safetensors, checksums, fsyncs, renames,
// `latest`, pruning) happens on a background thread.
//
//   auto snap = std::make_unique<CheckpointSnapshot>();   // training paused
//   snap->step = step; snap->meta = {...};
//   snap->AddModel(name, shape, params + offset, numel); ...
//   Status earlier = writer.Submit(std::move(snap), snapshot_s);  // training resumes
//   ...
//   Status last = writer.Wait();                          // before exiting
//
// Memory: at most one persist is in flight, so at most two snapshots exist at
// once (the one being written and the one being handed over); a snapshot is
// freed as soon as it is on disk.
//
// Failure: a failed persist never crashes anything and, by SaveCheckpoint's
// contract, leaves the previous checkpoint and `latest` intact. It is logged
// when it happens and reported (once) by the next Submit or Wait.
//
// The writer is the one writer of its root (see checkpoint.h): do not call
// SaveCheckpoint on the same root while it may be persisting.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "train/checkpoint/checkpoint.h"

namespace myriad {

// Host buffers that outlive the snapshots they are lent to: a snapshot's
// adopted vectors come back here when it is destroyed (once persisted), so
// the next snapshot reuses their pages: no page faults and no zeroing on
// the training thread after the first save. The pool keeps that host memory
// for the run (at most the two snapshots that may exist at once). Thread-safe.
class SnapshotBufferPool {
 public:
  // A vector of n floats, contents unspecified (the returned one with the
  // smallest capacity for n, else a new zeroed one).
  std::vector<float> Take(size_t n);
  void Give(std::vector<float>&& v);

 private:
  std::mutex mu_;
  std::vector<std::vector<float>> free_;
};

// An owned copy of everything a checkpoint holds. The Add* methods copy the
// tensor data now, so the source may change right after they return. Not
// copyable (views point into the owned buffers); movable.
struct CheckpointSnapshot {
  int64_t step = 0;
  nlohmann::json meta;  // as CheckpointData::meta

  // F32 tensors of `numel` floats; `shape` should have numel elements (a
  // mismatch is reported when the snapshot is persisted).
  void AddModel(const std::string& name, const std::vector<int64_t>& shape, const float* src,
                int64_t numel);
  void AddOptimizer(const std::string& name, const std::vector<int64_t>& shape, const float* src,
                    int64_t numel);
  // Any dtype: copies view.nbytes bytes from view.data.
  void AddModel(const TensorView& view);
  void AddOptimizer(const TensorView& view);
  // Takes `data` over without a copy (the caller built it for this snapshot)
  // and returns its first element; tensors added with AddModelView /
  // AddOptimizerView may point into it.
  const float* Adopt(std::vector<float>&& data);
  // F32 tensors that point into adopted data (no copy).
  void AddModelView(const std::string& name, const std::vector<int64_t>& shape, const float* adopted,
                    int64_t numel);
  void AddOptimizerView(const std::string& name, const std::vector<int64_t>& shape, const float* adopted,
                        int64_t numel);
  // A snapshot of `data` (every tensor copied) at `step`.
  static std::unique_ptr<CheckpointSnapshot> CopyOf(int64_t step, const CheckpointData& data);

  // Views into the owned buffers, valid while this snapshot lives unchanged.
  CheckpointData View() const;
  // Bytes of tensor data held.
  int64_t bytes() const { return bytes_; }

  // Adopted vectors go back to `pool` when this snapshot is destroyed.
  void ReturnAdoptedTo(std::shared_ptr<SnapshotBufferPool> pool) { pool_ = std::move(pool); }

  CheckpointSnapshot() = default;
  ~CheckpointSnapshot();
  CheckpointSnapshot(CheckpointSnapshot&&) = default;
  CheckpointSnapshot& operator=(CheckpointSnapshot&&) = default;

 private:
  TensorView Copy(const TensorView& view);
  // One heap buffer per tensor (8-byte aligned for any dtype); the buffers
  // never move, so the views stay valid as more tensors are added.
  std::vector<std::unique_ptr<uint64_t[]>> buffers_;
  std::vector<std::vector<float>> adopted_;  // vectors move without moving their data
  std::shared_ptr<SnapshotBufferPool> pool_;
  std::vector<TensorView> model_, optimizer_;
  int64_t bytes_ = 0;
};

// One Submit: its step and timings in seconds. snapshot_s is what the caller
// measured for building the snapshot; blocked_s what Submit took (waiting for
// the previous persist plus the hand-over); persist_s the background
// SaveCheckpoint. done is set when the persist has finished, ok if it worked.
struct SaveRecord {
  int64_t step = 0;
  double snapshot_s = 0, blocked_s = 0, persist_s = 0;
  double mirror_s = 0;       // the part of persist_s spent on the mirror (SetMirror)
  double mirror_wait_s = 0;  // how long WaitMirror waited for it (training blocked)
  bool done = false;
  bool ok = false;
  std::string error;
  std::string dir;  // the step directory written (when ok)
};

class AsyncCheckpointWriter {
 public:
  // Persists into `root` with SaveCheckpoint(env, root, step, data, keep_last).
  // `env` must be thread-safe and outlive the writer. Starts the persist
  // thread, which runs at lower CPU priority (nice 10) so it takes little from
  // the training threads.
  AsyncCheckpointWriter(Env* env, std::string root, int keep_last);
  // Waits for the persist in flight; an error nobody collected is logged.
  ~AsyncCheckpointWriter();
  // Each persist first writes the snapshot to `root` through `env` as well
  // (the shared-memory copy: fast, and done before the slower main root), keeping
  // `keep_last` there. A mirror write that fails turns the mirror off (logged,
  // its directory removed); the main root is written regardless. Call before
  // the first Submit.
  void SetMirror(Env* env, std::string root, int keep_last);
  // The mirror root, "" when there is none (or it was turned off).
  std::string mirror() const;
  // Waits until the snapshot handed over last is on the mirror (at once when
  // it is, or when there is no mirror); the wait is added to its record's
  // mirror_wait_s. The trainer calls it after the step that follows a save,
  // so the mirror write overlaps one step and a crash after that step never
  // loses the checkpoint.
  void WaitMirror();
  AsyncCheckpointWriter(const AsyncCheckpointWriter&) = delete;
  AsyncCheckpointWriter& operator=(const AsyncCheckpointWriter&) = delete;

  // Hands a snapshot over and returns once the persist thread owns it. If a
  // persist is still running it first waits for it (at most one in flight).
  // Returns the error of an earlier persist that failed and was not yet
  // reported (the new snapshot is still started), else Ok. A null snapshot is
  // an error (nothing started).
  Status Submit(std::unique_ptr<CheckpointSnapshot> s, double snapshot_s);
  // Waits for the persist in flight, if any. Returns the error of a failed
  // persist not yet reported by Submit or Wait, else Ok.
  Status Wait();
  // One per Submit, in order (in-flight ones with done = false). Thread-safe.
  std::vector<SaveRecord> records() const;
  // Whether a persist is in flight.
  bool busy() const;

 private:
  void Loop();

  Env* const env_;
  const std::string root_;
  const int keep_last_;
  Env* mirror_env_ = nullptr;
  std::string mirror_root_;  // guarded by mu_ once the thread runs
  bool mirror_pending_ = false;  // the job handed over last is not on the mirror yet
  int mirror_keep_ = 2;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<CheckpointSnapshot> job_;  // handed over, not yet taken
  size_t job_record_ = 0;                    // its index in records_
  bool busy_ = false;                        // from hand-over until persisted
  bool stop_ = false;
  Status unreported_;                        // a failed persist's error
  std::vector<SaveRecord> records_;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace myriad
