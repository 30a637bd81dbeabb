// LocalComm: n ranks as threads of one process sharing memory, for fast unit
// tests of anything written against Comm (and the size-1 world of a run
// started without mpirun).
//
// - Reductions are computed in rank order 0..n-1 for every element
//   ((x0 op x1) op x2 ...), so results are bitwise reproducible and equal on
//   every rank.
// - Send is buffered (copies into the destination's mailbox) and never
//   blocks; messages from one source with one tag are received in send order.
//   A receive must name the exact element count that was sent.
// - Split and SplitShared give LocalComms too (SplitShared: every rank).
// - A rank that throws inside RunLocalRanks aborts the job: every other rank
//   blocked in (or later entering) an op of any communicator of the job
//   throws LocalAborted, and RunLocalRanks rethrows the first real error.
// - A mismatch between ranks (different counts to a collective, a receive of
//   the wrong size) is a bug and aborts the process with a [comm] message.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/comm/comm.h"

namespace myriad::comm {

// Thrown on the other ranks when one rank of a local job failed.
class LocalAborted : public std::runtime_error {
 public:
  LocalAborted() : std::runtime_error("[comm] local job aborted: another rank failed") {}
};

// Runs fn on n threads, each with its own rank's communicator (name
// "local world n"), joins them, and rethrows the first exception a rank
// threw (the original error, not the LocalAborted it caused elsewhere).
void RunLocalRanks(int n, const std::function<void(Comm&)>& fn);

// The n communicators of one local job, for callers that run the threads
// themselves. Each must be used (and destroyed) by its own thread; ops block
// until every rank takes part.
std::vector<std::unique_ptr<Comm>> MakeLocalComms(int n, const std::string& name = "local world");

// A communicator of one rank (every op is a local copy or nothing).
std::unique_ptr<Comm> MakeSelfComm();

}  // namespace myriad::comm
