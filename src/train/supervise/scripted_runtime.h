// For tests: a Runtime (attempt_runner.h) that plays scripted jobs on a fake
// clock -- no processes, no sockets, no sleeping. Each Start takes the next
// ScriptedJob; its messages arrive at their scripted times (seconds after the
// start), it exits on its own at exit_after_s, or when signalled as its
// script says. Receive(timeout) advances the clock to the next message or by
// the timeout; Sleep advances it. Header-only; used by the *_test.cc files.
#pragma once

#include <signal.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/supervise/attempt_runner.h"

namespace myriad::supervise::testing {

// Messages in heartbeat.h's format ("attempt" is filled in by the runtime).
inline nlohmann::json Beat(int rank, const std::string& host, int64_t step, const std::string& phase,
                           const std::string& op = "", const std::string& comm = "", int64_t op_seq = 0,
                           int in_op = 0, double op_s = 0) {
  return {{"kind", "beat"}, {"rank", rank}, {"host", host}, {"step", step}, {"phase", phase}, {"op", op},
          {"comm", comm}, {"op_seq", op_seq}, {"in_op", in_op}, {"op_s", op_s}};
}
inline nlohmann::json StepMsg(int rank, const std::string& host, int64_t step, double step_s, double compute_s = -1) {
  nlohmann::json m = {{"kind", "step"}, {"rank", rank}, {"host", host}, {"step", step}, {"phase", "step"},
                      {"step_s", step_s}};
  if (compute_s >= 0) m["compute_s"] = compute_s;
  return m;
}
inline nlohmann::json EventMsg(int rank, const std::string& host, const std::string& event,
                               nlohmann::json fields = nlohmann::json::object(), int64_t step = 0,
                               const std::string& phase = "step") {
  nlohmann::json m = std::move(fields);
  m.update({{"kind", "event"}, {"event", event}, {"rank", rank}, {"host", host}, {"step", step}, {"phase", phase}});
  return m;
}

struct ScriptedJob {
  std::vector<std::pair<double, nlohmann::json>> messages;  // (seconds after start, message), in time order
  double exit_after_s = -1;                                 // exits on its own then (< 0: never)
  JobExit exit;                                             // ... this way
  double term_exit_after_s = -1;                            // after a SIGTERM to it: exits this much later (< 0: ignores it)
  JobExit term_exit{0, SIGTERM};
  double stop_exit_after_s = -1;                            // after kJobStopSignal: exits this much later (< 0: ignores it)
  JobExit stop_exit{0, 0};                                  // ... this way (checkpointed, exit 0)
  bool start_fails = false;
};

class ScriptedRuntime : public Runtime {
 public:
  struct Signalled {
    int attempt;
    double at;
    int sig;
    bool whole_group;
  };
  std::deque<ScriptedJob> jobs;       // the next Start takes the front
  double now = 1000;                  // the fake clock
  double stop_at = std::numeric_limits<double>::infinity();  // StopSignal() is stop_signal from then on
  int stop_signal = SIGTERM;
  std::vector<AttemptCommand> started;
  std::vector<double> start_times;
  std::vector<Signalled> signals;

  Result<std::unique_ptr<JobProcess>> Start(const AttemptCommand& command) override {
    if (jobs.empty()) return Status::Error("scripted runtime: no job left to start");
    current_ = jobs.front();
    jobs.pop_front();
    if (current_.start_fails) return Status::Error("launch: fork: injected");
    started.push_back(command);
    start_times.push_back(now);
    start_ = now;
    next_ = 0;
    exit_at_ = current_.exit_after_s >= 0 ? now + current_.exit_after_s : kNever;
    exit_how_ = current_.exit;
    reaped_ = false;
    return std::unique_ptr<JobProcess>(new Job(this));
  }
  bool Receive(double timeout_s, nlohmann::json* m) override {
    const int attempt = static_cast<int>(started.size()) - 1;
    if (attempt >= 0 && next_ < current_.messages.size()) {
      const double t = start_ + current_.messages[next_].first;
      if (t <= now + timeout_s && t <= exit_at_) {
        now = std::max(now, t);
        *m = current_.messages[next_++].second;
        if (!m->contains("attempt")) (*m)["attempt"] = attempt;
        return true;
      }
    }
    now += timeout_s;
    return false;
  }
  double Now() override { return now; }
  void Sleep(double s) override { now += s; }
  int StopSignal() override { return now >= stop_at ? stop_signal : 0; }
  std::string HeartbeatAddress() override { return "127.0.0.1:1"; }

 private:
  static constexpr double kNever = std::numeric_limits<double>::infinity();
  class Job : public JobProcess {
   public:
    explicit Job(ScriptedRuntime* rt) : rt_(rt) {}
    bool Exited(JobExit* exit) override {
      if (rt_->reaped_ || rt_->now < rt_->exit_at_) return false;
      rt_->reaped_ = true;
      *exit = rt_->exit_how_;
      return true;
    }
    void Signal(int sig, bool whole_group) override {
      ScriptedRuntime& r = *rt_;
      r.signals.push_back({static_cast<int>(r.started.size()) - 1, r.now, sig, whole_group});
      if (r.now >= r.exit_at_) return;  // already gone
      if (sig == SIGKILL) {
        r.exit_at_ = r.now;
        r.exit_how_ = {0, SIGKILL};
      } else if (sig == SIGTERM && r.current_.term_exit_after_s >= 0) {
        r.exit_at_ = r.now + r.current_.term_exit_after_s;
        r.exit_how_ = r.current_.term_exit;
      } else if (sig == kJobStopSignal && r.current_.stop_exit_after_s >= 0) {
        r.exit_at_ = r.now + r.current_.stop_exit_after_s;
        r.exit_how_ = r.current_.stop_exit;
      }
    }

   private:
    ScriptedRuntime* rt_;
  };

  ScriptedJob current_;
  double start_ = 0, exit_at_ = kNever;
  JobExit exit_how_;
  size_t next_ = 0;
  bool reaped_ = false;
};

}  // namespace myriad::supervise::testing
