#include "train/comm/trace.h"

#include <chrono>
#include <mutex>

namespace myriad::comm {
namespace {

struct State {
  std::mutex mu;
  OpTrace t;
  std::chrono::steady_clock::time_point entered;
};

thread_local int t_depth = 0;
thread_local double t_blocked = 0;
thread_local std::chrono::steady_clock::time_point t_entered;

State& Global() {
  static State* s = new State();  // never destroyed: ops may run during exit
  return *s;
}

}  // namespace

void TraceEnter(const char* op, const std::string& comm_name) {
  if (t_depth++ == 0) t_entered = std::chrono::steady_clock::now();
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!comm_name.empty()) {
    s.t.op.assign(op);
    s.t.comm.assign(comm_name);
  } else if (s.t.in_progress == 0 && s.t.op.rfind("Wait(", 0) != 0) {
    // A wait on a request (no communicator at hand): it waits for the last
    // op issued, which keeps its name.
    s.t.op = std::string(op) + "(" + s.t.op + ")";
  }
  ++s.t.seq;
  ++s.t.in_progress;
  s.entered = std::chrono::steady_clock::now();
}

void TraceLeave() {
  if (t_depth > 0 && --t_depth == 0)
    t_blocked += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_entered).count();
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.t.in_progress > 0) --s.t.in_progress;
}

double ThreadBlockedSeconds() { return t_blocked; }

OpTrace CurrentTrace() {
  State& s = Global();
  std::lock_guard<std::mutex> lock(s.mu);
  OpTrace t = s.t;
  t.seconds_in = t.in_progress > 0
                     ? std::chrono::duration<double>(std::chrono::steady_clock::now() - s.entered).count()
                     : 0.0;
  return t;
}

}  // namespace myriad::comm
