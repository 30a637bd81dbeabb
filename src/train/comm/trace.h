// What this process's communication is doing, for hang reports: every
// collective and point-to-point op of a QueuedComm (sync, async on the
// progress thread, and waits on requests) enters and leaves a process-wide
// trace. A supervisor's heartbeat reads it: when a rank stops making
// progress, the op it is in (name, communicator, sequence number, for how
// long) names where it hangs.
#pragma once

#include <cstdint>
#include <string>

namespace myriad::comm {

class Comm;

struct OpTrace {
  std::string op;          // last op entered, e.g. "AllReduce", "Wait(IReduceScatter)"
  std::string comm;        // its communicator's name(), e.g. "mpi 4"
  int64_t seq = 0;         // ops entered so far by this process
  int in_progress = 0;     // ops entered and not yet left (any thread)
  double seconds_in = 0;   // since the last op was entered (0 when none in progress)
};

// Thread-safe; cheap (one mutex). An empty comm_name marks a wait on a
// request: it keeps the last op's name (as "Wait(<op>)" when nothing else is
// in progress).
void TraceEnter(const char* op, const std::string& comm_name);
void TraceLeave();
OpTrace CurrentTrace();
// Seconds the calling thread has spent inside traced ops (outermost scopes
// only) since it started: a rank's time blocked in communication, which a
// step's time minus it turns into the rank's own compute time.
double ThreadBlockedSeconds();

class TraceScope {
 public:
  TraceScope(const char* op, const std::string& comm_name) { TraceEnter(op, comm_name); }
  ~TraceScope() { TraceLeave(); }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
};

}  // namespace myriad::comm
