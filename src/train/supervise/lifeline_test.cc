// The supervisor's lifeline (lifeline.h) with real processes: a rank that
// watches a supervisor which is not its parent (as under mpirun) dies within
// moments of the supervisor's SIGKILL; one whose supervisor is already gone
// dies at once; a child set to die with its parent does. The test process
// is a subreaper, so the orphans come back to it to be reaped and examined.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "train/supervise/lifeline.h"

namespace myriad::supervise {
namespace {

pid_t Sleeper() {
  const pid_t p = fork();
  if (p == 0) {
    for (;;) pause();
  }
  return p;
}

// A "rank": watches `supervisor` from the environment, then sleeps.
pid_t Rank(pid_t supervisor) {
  const pid_t p = fork();
  if (p == 0) {
    setenv("MYRIAD_SUPERVISOR_PID", std::to_string(supervisor).c_str(), 1);
    unsetenv("MYRIAD_SUPERVISOR_HOST");
    WatchSupervisor();
    for (;;) pause();
  }
  return p;
}

// Waits up to `seconds` for `pid` to end; its wait status, or -1.
int WaitFor(pid_t pid, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

bool Killed(int status) { return status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

TEST(Lifeline, ARankDiesWithItsSupervisorWhichIsNotItsParent) {
  const pid_t sup = Sleeper();
  const pid_t rank = Rank(sup);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // it watches by now
  EXPECT_EQ(waitpid(rank, nullptr, WNOHANG), 0) << "the rank died with its supervisor alive";
  kill(sup, SIGKILL);
  waitpid(sup, nullptr, 0);
  const int st = WaitFor(rank, 2.0);
  if (st == -1) kill(rank, SIGKILL), waitpid(rank, nullptr, 0);
  EXPECT_TRUE(Killed(st)) << "the rank outlived its supervisor by 2 s";
}

TEST(Lifeline, ARankWhoseSupervisorIsAlreadyGoneDiesAtOnce) {
  const pid_t sup = Sleeper();
  kill(sup, SIGKILL);
  waitpid(sup, nullptr, 0);
  const pid_t rank = Rank(sup);
  const int st = WaitFor(rank, 2.0);
  if (st == -1) kill(rank, SIGKILL), waitpid(rank, nullptr, 0);
  EXPECT_TRUE(Killed(st));
}

TEST(Lifeline, WithoutASupervisorNothingIsWatched) {
  const pid_t p = fork();
  if (p == 0) {
    unsetenv("MYRIAD_SUPERVISOR_PID");
    WatchSupervisor();
    _exit(7);
  }
  int st = 0;
  waitpid(p, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7);
  EXPECT_EQ(SupervisorPid(), 0);
}

// The supervisor's side: its child (mpirun, or a lone trainer) dies with it.
TEST(Lifeline, AChildSetToDieWithItsParentDoes) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t parent = fork();
  if (parent == 0) {
    const pid_t self = getpid();
    const pid_t child = fork();
    if (child == 0) {
      ChildDiesWithParent(self);
      for (;;) pause();
    }
    (void)!write(pipefd[1], &child, sizeof child);
    for (;;) pause();
  }
  pid_t child = 0;
  ASSERT_EQ(read(pipefd[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  const int st = WaitFor(child, 2.0);  // reparented to this subreaper
  if (st == -1) kill(child, SIGKILL), waitpid(child, nullptr, 0);
  EXPECT_TRUE(Killed(st));
  prctl(PR_SET_CHILD_SUBREAPER, 0);
}

}  // namespace
}  // namespace myriad::supervise
