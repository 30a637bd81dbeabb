// The attempt runner: starts one attempt of a supervised job (mpirun, or a
// single `myriad train` process), feeds what the ranks send to an
// AttemptMonitor (attempt.h), forwards a stop request, ends the job when the
// monitor finds a hang, and returns the attempt's outcome once it exited.
//
// Everything it needs from the machine -- starting a process, hearing
// heartbeats, the clock, sleeping, stop requests -- is the Runtime below, so
// unit tests run it on a scripted job (synthetic heartbeats and exits, a fake
// clock) and the supervisor on the real one (ProcessRuntime).
#pragma once

#include <signal.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/status.h"
#include "train/supervise/attempt.h"

namespace myriad::supervise {

// The command line and environment of one attempt.
struct AttemptCommand {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;  // an empty value: unset
  bool use_mpi = false;                                  // argv[0] is the MPI launcher
};

// What BuildAttemptCommand needs to know.
struct CommandInputs {
  int attempt = 0;
  std::string myriad_bin, config_path;
  std::vector<std::string> sets;        // --set key=value (the overrides, and dp when it shrank)
  std::vector<std::string> train_args;  // extra arguments to `myriad train`
  int ranks = 1;
  bool always_mpirun = false;
  std::string launcher = "mpirun";
  std::vector<std::string> launcher_args;
  std::string mpi_hosts;                  // "a:2,b:2" for mpirun --host; "": none
  std::string emulated_hosts;             // $MYRIAD_EMULATED_HOSTS ("": unset)
  std::string supervisor_address;         // $MYRIAD_SUPERVISOR
  std::string faults_spec, fault_dir;     // $MYRIAD_FAULTS, $MYRIAD_FAULT_DIR
  double heartbeat_s = 0.5;
  int64_t supervisor_pid = 0;             // $MYRIAD_SUPERVISOR_PID (lifeline.h, run_lock.h)
  std::string supervisor_host;            // $MYRIAD_SUPERVISOR_HOST
};
// `[mpirun -np N ARGS [--host H] -x VAR...] myriad train --config C --set ...`
// with the supervisor's variables in env (mpirun passes them on with -x).
AttemptCommand BuildAttemptCommand(const CommandInputs& in);

// How the supervisor asks a running job to checkpoint and stop: SIGUSR1,
// which mpirun forwards to every rank (SIGTERM to mpirun is a kill: it
// SIGTERMs the ranks, SIGKILLs them a moment later and exits 1 whatever
// they did) and which a rank takes like SIGTERM (trainer.h).
inline constexpr int kJobStopSignal = SIGUSR1;

// A started job. Neither call blocks.
class JobProcess {
 public:
  virtual ~JobProcess() = default;
  // True once the job has exited (then *exit says how); it is reaped.
  virtual bool Exited(JobExit* exit) = 0;
  // Sends `sig` to the job's first process, or to its whole process group.
  virtual void Signal(int sig, bool whole_group) = 0;
};

// The machine, as the supervisor uses it.
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Result<std::unique_ptr<JobProcess>> Start(const AttemptCommand& command) = 0;
  // The next message from a rank, waiting up to timeout_s; false: none.
  virtual bool Receive(double timeout_s, nlohmann::json* message) = 0;
  virtual double Now() = 0;  // seconds on a monotonic clock
  virtual void Sleep(double seconds) = 0;
  // The signal (SIGINT/SIGTERM) that asked the supervisor to stop; 0: none.
  virtual int StopSignal() = 0;
  // Where ranks send heartbeats ("HOST:PORT", for $MYRIAD_SUPERVISOR).
  virtual std::string HeartbeatAddress() = 0;
};

// Runs one attempt to its end. `outcome` carries the attempt's index, ranks,
// dp and hosts; times are Now() - launch_start. On a stop request the job is
// sent kJobStopSignal once (it checkpoints and exits), as soon as every rank
// has reported (a rank takes the signal from then on; one still starting
// ignores it). On a hang: SIGTERM to mpirun
// (which ends every rank), SIGKILL to a lone process's group; a job still
// there 10 s later gets SIGKILL to its group. Fails only when the job cannot
// be started.
Result<AttemptOutcome> RunAttempt(const AttemptCommand& command, AttemptOutcome outcome, const WatchOptions& watch,
                                  Runtime* runtime, double launch_start);

// The real machine: fork/exec in a new process group (the child dies with
// the supervisor: lifeline.h; a job still running when its JobProcess is
// destroyed is killed with its group), a UDP heartbeat
// listener on 127.0.0.1, the clock of `env`, and SIGINT/SIGTERM caught for
// as long as it lives (the previous handlers come back when it is destroyed).
// One at a time per process.
class ProcessRuntime : public Runtime {
 public:
  static Result<std::unique_ptr<ProcessRuntime>> Open(Env* env = Env::Default());
  ~ProcessRuntime() override;
  Result<std::unique_ptr<JobProcess>> Start(const AttemptCommand& command) override;
  bool Receive(double timeout_s, nlohmann::json* message) override;
  double Now() override;
  void Sleep(double seconds) override;
  int StopSignal() override;
  std::string HeartbeatAddress() override;

 private:
  struct State;
  explicit ProcessRuntime(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace myriad::supervise
