#include "train/supervise/lifeline.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "train/supervise/heartbeat.h"

namespace myriad::supervise {
namespace {

[[noreturn]] void Die(const char* why, int64_t pid) {
  std::fprintf(stderr, "myriad train: %s (pid %lld) is gone: exiting\n", why, static_cast<long long>(pid));
  std::fflush(stderr);
  kill(getpid(), SIGKILL);
  std::_Exit(137);
}

bool Gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

void ChildDiesWithParent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // it died before the line above
}

int64_t SupervisorPid() {
  const char* v = std::getenv("MYRIAD_SUPERVISOR_PID");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long p = std::strtoll(v, &end, 10);
  return (*end == 0 && p > 0) ? p : 0;
}

void WatchSupervisor() {
  const int64_t sup = SupervisorPid();
  if (sup <= 0) return;
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent || parent == 1) Die("the process that started this rank", parent);
  const char* host = std::getenv("MYRIAD_SUPERVISOR_HOST");
  if (host && *host && MachineName() != host) return;  // another machine: the parent's death is the signal
  const pid_t pid = static_cast<pid_t>(sup);
#ifdef SYS_pidfd_open
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0 && errno == ESRCH) Die("the supervisor", sup);
  if (fd >= 0) {
    std::thread([fd, sup] {
      pollfd p{fd, POLLIN, 0};
      while (poll(&p, 1, -1) < 0 && errno == EINTR) {
      }
      Die("the supervisor", sup);
    }).detach();
    return;
  }
#endif
  if (Gone(pid)) Die("the supervisor", sup);
  std::thread([pid, sup] {
    while (!Gone(pid)) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Die("the supervisor", sup);
  }).detach();
}

}  // namespace myriad::supervise
