// Fault injection for drills and tests: a plan of faults, written as a spec
// string, that `myriad launch --faults SPEC` hands to each attempt of a job
// (as $MYRIAD_FAULTS) and that the training ranks fire at the named step.
//
// Spec: faults separated by ';', each KIND[:key=value,...]:
//   kill:rank=R,step=S      rank R kills itself (SIGKILL) after step S
//   hang:rank=R,step=S      rank R stops (sleeps forever) after step S
//   nan:rank=R,step=S       the loss of step S on rank R becomes NaN
//   tear:step=S             after checkpoint S is written, its model file is
//                           truncated to half, then the process dies (SIGKILL)
//   corrupt:step=S          same with one byte of the model file flipped
//   slow:rank=R,ms=N        rank R computes N ms longer in every step from
//                           step S on (step=S, default 1): a straggler
//   health:host=H           the health check of every rank on host H fails
//                           (at every start: a host that keeps failing;
//                           with once=1 only at the next start)
//   diskfull:step=S         the disk "fills" while checkpoint S is written
//                           (the save fails with ENOSPC part-way)
//   crashsave:step=S        rank 0 dies (SIGKILL) half-way through writing
//                           checkpoint S to disk, after its shared-memory
//                           copy is complete
// rank defaults to 0. Every fault gets an id (its index in the spec, or
// id=N). A rank about to fire a one-shot fault first creates
// $MYRIAD_FAULT_DIR/fired_<id> (and sends a "fault" event), so the
// supervisor drops it from the next attempt's spec; health faults stay.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace myriad::supervise {

enum class FaultKind { kKill, kHang, kNan, kTear, kCorrupt, kHealth, kDiskFull, kSlow, kCrashSave };
const char* FaultKindName(FaultKind k);

struct Fault {
  int id = 0;
  FaultKind kind = FaultKind::kKill;
  int rank = 0;
  int64_t step = 0;
  std::string host;   // health
  bool once = false;  // health: fire at one start only
  int64_t ms = 0;     // slow
  bool one_shot() const { return (kind != FaultKind::kHealth || once) && kind != FaultKind::kSlow; }
  std::string ToSpec() const;  // one fault, parseable again (with its id)
};

Result<std::vector<Fault>> ParseFaults(const std::string& spec);
std::string FaultsToSpec(const std::vector<Fault>& faults);

// The rank's side: the faults of $MYRIAD_FAULTS that concern this rank/host.
class FaultInjector {
 public:
  // Reads $MYRIAD_FAULTS and $MYRIAD_FAULT_DIR; a bad spec is an error.
  static Result<FaultInjector> FromEnv(int rank, const std::string& host);
  explicit FaultInjector(std::vector<Fault> faults = {}, int rank = 0, std::string host = "",
                         std::string fired_dir = "");

  bool empty() const { return faults_.empty(); }
  // A health fault for this host: the reason to fail with, else "".
  std::string HealthFailure();
  // Sleeps inside the step when this rank is planned to be slow from `step` on.
  void SlowDown(int64_t step);
  // True when step's loss must be replaced by NaN on this rank.
  bool NanAt(int64_t step);
  // Kill or hang after `step` (never returns when one fires).
  void AfterStep(int64_t step);
  // The checkpoint of `step` should fail with ENOSPC part-way (rank 0).
  bool DiskFullAt(int64_t step);
  // The process is to die half-way through writing checkpoint `step` to
  // disk (rank 0; marked fired first).
  bool CrashInSaveAt(int64_t step);
  // Whether checkpoint `step` is to be torn or corrupted (rank 0): the
  // caller then waits until it is durable and calls AfterCheckpoint.
  bool DamageAt(int64_t step) const;
  // Tears or corrupts the model file of checkpoint `step` in `dir` and dies
  // (a crash in the middle of writing it), when planned.
  void AfterCheckpoint(int64_t step, const std::string& dir);

 private:
  void MarkFired(const Fault& f);
  // Rank 0: a one-shot fault of `kind` planned for checkpoint `step` (marked fired).
  bool FireAtCheckpoint(FaultKind kind, int64_t step);
  std::vector<Fault> faults_;
  int rank_ = 0;
  std::string host_, fired_dir_;
};

// Which one-shot faults of `faults` have fired (their marker files exist in
// dir, as `env` sees it).
std::vector<int> FiredFaults(const std::string& dir, const std::vector<Fault>& faults, Env* env = Env::Default());

}  // namespace myriad::supervise
