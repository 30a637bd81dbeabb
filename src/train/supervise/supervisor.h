// The supervisor behind `myriad launch`: starts a training job (one
// `myriad train` process, or `mpirun ... myriad train` for several ranks),
// watches its heartbeats (heartbeat.h), and keeps it going until it
// completes:
//
//   - pre-flight checks first (preflight.h), every problem in one report;
//   - every rank runs the device health check at start (health.h), so after
//     every restart too; a failing rank exits with code 4 and names its host;
//   - hang detection: when no rank makes progress (step, phase, or the
//     sequence number of its communication ops) for hang_timeout_s, the job
//     is ended and the report names each rank's host, step, phase and the
//     collective it is in (and for how long);
//   - restart policy: on a crash, a hang, a numerical fault (NaN, loss
//     spike), a failed health check or failing checkpoints the job restarts
//     from its newest valid checkpoint (the trainer falls back past a torn
//     one), after an exponential backoff, within a restart budget;
//   - host history: failures are counted per host in
//     <state_dir>/hosts.json (kept across launches); a host at
//     exclude_after failures is excluded and the job continues on the other
//     hosts, data parallelism shrunk to fit (the checkpoint reshards);
//   - stragglers: a rank whose step time exceeds straggler_factor x the
//     median over ranks (over a window of steps) is reported with its host;
//   - a report at the end (also <state_dir>/report.json): attempts and their
//     outcomes, effective training time ratio (ETTR = productive step time /
//     wall time), time lost per fault, checkpoint blocking time per save.
//
// In parts, each unit-tested alone: the attempt runner (attempt_runner.h:
// starts one attempt, feeds its heartbeats to an AttemptMonitor (attempt.h)
// that detects hangs and classes the exit), the restart policy
// (restart_policy.h: backoff, budget, host exclusion, the next layout) and
// the report (report.h). Supervise is the loop that composes them; RunLaunch
// prepares it (config, pre-flight, the real processes). Every file the
// supervisor writes (report.json, hosts.json) goes through Env and
// WriteFileAtomic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/status.h"
#include "train/supervise/attempt_runner.h"
#include "train/supervise/faults.h"
#include "train/supervise/restart_policy.h"

namespace myriad::supervise {

// "a:2,b:2" (":N" optional, default 1).
Result<std::vector<HostSlots>> ParseHosts(const std::string& s);

struct LaunchOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key=value for every attempt
  std::string myriad_bin;              // the myriad executable ("": this process's own)
  int np = 1;                          // ranks (when no hosts are given)
  std::vector<HostSlots> hosts;        // ranks per host; empty: np ranks on this machine
  bool emulate_hosts = false;          // hosts are names only, all ranks run here (tests, drills)
  std::string launcher = "mpirun";
  std::vector<std::string> launcher_args;  // extra arguments to mpirun (e.g. --oversubscribe)
  bool always_mpirun = false;          // use mpirun even for one rank
  double hang_timeout_s = 120;
  double startup_timeout_s = 300;      // from start to the first heartbeat of every rank
  double heartbeat_s = 0.5;
  int max_restarts = 10;
  double backoff_s = 1, backoff_max_s = 60;
  int exclude_after = 2;               // failures of one host before it is excluded
  double straggler_factor = 1.5;
  int straggler_window = 8;
  std::string faults;                  // fault plan (faults.h), for drills and tests
  std::string state_dir;               // "": <train.out_dir>/supervisor
  bool preflight = true;
  bool reset_hosts = false;            // forget the persisted host history
  std::vector<std::string> train_args; // extra arguments to `myriad train` (e.g. -q)
  Env* env = nullptr;                  // the supervisor's files and clock (nullptr: Env::Default())
};

// Runs the job to completion (or until the restart budget is spent, or the
// supervisor is asked to stop with SIGINT/SIGTERM, which it forwards so the
// job writes a final checkpoint). *report gets the report either way. Holds
// train.out_dir's launch lock throughout (run_lock.h): a folder in use is an
// error naming its holder, before anything starts.
Status RunLaunch(const LaunchOptions& options, nlohmann::json* report);

// What RunLaunch has worked out before the first attempt.
struct LaunchSetup {
  std::string state_dir;   // exists; report.json, hosts.json and faults/ go here
  std::string myriad_bin;  // the executable the attempts run
  int dp = 1;              // the configured [parallel] dp (tp*pp*ep*cp = ranks / dp)
  int64_t ckpt_every = 0;  // train.ckpt_every
  std::vector<Fault> plan; // the fault plan
};

// The supervision loop: attempts (RunAttempt on `runtime`) until the
// restart policy ends it, then the report: printed, written to
// <state_dir>/report.json through options.env, and stored in *report.
// launch_start: runtime->Now() when the launch began (the report's wall
// time counts from it). A report that cannot be written is an error naming
// the file, the job's outcome and that the report is printed; hosts.json and
// an earlier report.json are left as they were. A stop request that the job
// honoured (or that came between attempts) is not an error: the state is
// "stopped" and the result Ok; a job that did not stop cleanly is one.
Status Supervise(const LaunchOptions& options, const LaunchSetup& setup, Runtime* runtime, double launch_start,
                 nlohmann::json* report);

}  // namespace myriad::supervise
