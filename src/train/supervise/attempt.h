// One attempt of a supervised job, as the supervisor sees it: what it hears
// from the ranks (heartbeats, steps, events), whether it has hung, and how it
// ended. AttemptMonitor is pure logic over messages and times -- no sockets,
// no processes, no clock of its own -- so unit tests drive it with synthetic
// heartbeat streams; the attempt runner (attempt_runner.h) feeds it the real
// ones. Not thread-safe: one thread owns a monitor.
//
// Times are seconds since the launch started (the caller's clock), so that an
// attempt's steps can be placed on the launch's timeline by the report.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace myriad::supervise {

// How an attempt ended: outcome is one of
//   "completed"   exit 0 after rank 0 reported the last step;
//   "stopped"     exit 0 before that (asked by a forwarded signal, or not),
//                 or, after a forwarded stop, any exit of the launcher once
//                 every rank reported a clean exit (the ranks checkpointed
//                 and stopped; mpirun's own exit code aside);
//   "crash"       a signal or an unknown exit code;
//   "hang"        the monitor found no progress and ended the job;
//   "numerical"   exit 3 or a "numerical" event (NaN/Inf, loss spike);
//   "health"      exit 4 or a failed "health" event;
//   "checkpoint"  exit 5 (checkpoints kept failing).
struct AttemptOutcome {
  int index = 0;
  int ranks = 0, dp = 0;
  std::vector<std::string> hosts;  // host of each rank
  double start_s = 0, end_s = 0;
  int64_t resumed_step = -1;  // from rank 0's "start" event; -1: never heard
  int64_t last_step = 0;
  struct StepTime {
    double done_s = 0;  // when rank 0 reported it
    double step_s = 0;  // its own duration
  };
  std::map<int64_t, StepTime> steps;  // rank 0's finished steps
  std::string outcome, detail;
  int exit_code = 0;                     // 128 + signal when killed
  std::set<std::string> blamed_hosts;    // the hosts this attempt's failure is counted against
  bool rank0_completed = false;          // rank 0's exit event said the run completed
  bool stop_forwarded = false;           // a stop request was passed on to the job
  std::vector<nlohmann::json> stragglers;   // {attempt, rank, host, step_s, median_s, ratio}
  std::vector<nlohmann::json> checkpoints;  // the "checkpoint" events of this attempt
};

// How a job process ended: killed by `signal` (non-zero), else exited `code`.
struct JobExit {
  int code = 0;
  int signal = 0;
  bool ok() const { return signal == 0 && code == 0; }
  int exit_code() const { return signal != 0 ? 128 + signal : code; }
};

struct WatchOptions {
  double hang_timeout_s = 120;
  double startup_timeout_s = 300;  // from start to the first message of every rank
  double heartbeat_s = 0.5;        // ranks beat this often (to tell "heartbeats stopped")
  double straggler_factor = 1.5;
  int straggler_window = 8;
};

// "a, b, c" for sep ", ": the supervisor's one join (messages, host lists).
std::string JoinNames(const std::vector<std::string>& names, const std::string& sep);

class AttemptMonitor {
 public:
  // `outcome` carries the attempt's index, ranks, dp, hosts and start_s.
  AttemptMonitor(AttemptOutcome outcome, WatchOptions options);

  // One message from a rank (heartbeat.h's format). Messages of other
  // attempts (late datagrams) are ignored.
  void OnMessage(const nlohmann::json& m, double now_s);

  // Hang detection at now_s: when every rank that has reported has made no
  // progress (step, phase or comm op sequence) for hang_timeout_s -- or some
  // rank never reported within startup_timeout_s -- the attempt is classed as
  // a hang, the hosts of the ranks outside a collective are blamed, and true
  // is returned with hang_report() naming every rank: those not inside a
  // collective first (the likely cause), then those waiting in one, with the
  // collective, its communicator, op number and how long. Once it has
  // returned true it is not checked again.
  bool CheckHang(double now_s);
  bool hung() const { return hung_; }
  const std::string& hang_report() const { return hang_report_; }

  // The supervisor forwarded a stop request (SIGINT/SIGTERM) to the job.
  void NoteStopForwarded() { out_.stop_forwarded = true; }
  // Every rank of the attempt has sent a message (so its training has set
  // up its stop handler: the trainer installs it before it reports).
  bool AllRanksHeard() const;

  // Classifies the attempt by its exit and what it heard (see AttemptOutcome),
  // names the ranks that died without an exit event on a crash, and returns
  // the outcome. Call once, after the job exited.
  AttemptOutcome Finish(JobExit exit, double now_s);

  const AttemptOutcome& outcome() const { return out_; }

 private:
  struct RankState {
    bool seen = false;
    std::string host;
    int64_t step = 0;
    std::string phase, op, comm;
    int64_t op_seq = 0;
    int in_op = 0;
    double op_s = 0;
    double last_msg_s = 0, last_progress_s = 0;
    std::deque<double> step_s;  // compute time of the last straggler_window steps
    bool exited = false, exit_ok = false;
    std::string exit_message;
  };
  void OnRank0Step(int64_t step, double step_s, double now_s);

  AttemptOutcome out_;
  WatchOptions opt_;
  std::map<int, RankState> ranks_;
  bool hung_ = false;
  std::string hang_report_;
};

}  // namespace myriad::supervise
