// The supervisor's lifeline: a job never outlives the `myriad launch` that
// started it. Killing the supervisor -- even with SIGKILL, which it cannot
// catch -- kills mpirun and every rank within moments, so a relaunch never
// trains beside an orphan.
//
//   - The supervisor's child (mpirun, or a lone `myriad train`) gets SIGKILL
//     when the supervisor dies (PR_SET_PDEATHSIG, set between fork and exec:
//     ChildDiesWithParent). Linux ties that signal to the *thread* that
//     forked, so the supervisor forks from the thread that supervises.
//   - mpirun puts every rank in a process group of its own, so the
//     supervisor's group kill does not reach them; instead each rank, told
//     the supervisor's pid and host ($MYRIAD_SUPERVISOR_PID,
//     $MYRIAD_SUPERVISOR_HOST), watches it (WatchSupervisor): PDEATHSIG on
//     its own parent (mpirun or its daemon), and on the supervisor's machine
//     a thread that blocks on a pidfd of the supervisor (or polls its pid
//     every 0.2 s where pidfds are missing) and kills the rank when it ends.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace myriad::supervise {

// In a forked child before exec: SIGKILL when `parent` (the forking
// process) dies; exits 127 at once when it is already gone.
// Async-signal-safe.
void ChildDiesWithParent(pid_t parent);

// $MYRIAD_SUPERVISOR_PID: the launch this process runs under (0: none).
int64_t SupervisorPid();

// In a rank, first thing: when $MYRIAD_SUPERVISOR_PID is set, dies (SIGKILL,
// after one line on stderr) with its parent, and -- on the supervisor's
// machine -- with the supervisor. A supervisor already gone: dies now.
// Without $MYRIAD_SUPERVISOR_PID: does nothing.
void WatchSupervisor();

}  // namespace myriad::supervise
