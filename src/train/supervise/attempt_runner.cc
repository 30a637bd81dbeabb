#include "train/supervise/attempt_runner.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "train/supervise/heartbeat.h"
#include "train/supervise/lifeline.h"

namespace myriad::supervise {

AttemptCommand BuildAttemptCommand(const CommandInputs& in) {
  AttemptCommand c;
  c.use_mpi = in.ranks > 1 || in.always_mpirun;
  if (c.use_mpi) {
    c.argv = {in.launcher, "-np", std::to_string(in.ranks)};
    for (const auto& a : in.launcher_args) c.argv.push_back(a);
    if (!in.mpi_hosts.empty()) c.argv.insert(c.argv.end(), {"--host", in.mpi_hosts});
    for (const char* v : {"MYRIAD_SUPERVISOR", "MYRIAD_ATTEMPT", "MYRIAD_FAULTS", "MYRIAD_FAULT_DIR",
                          "MYRIAD_HEARTBEAT_S", "MYRIAD_EMULATED_HOSTS", "MYRIAD_SUPERVISOR_PID",
                          "MYRIAD_SUPERVISOR_HOST"})
      c.argv.insert(c.argv.end(), {"-x", v});
  }
  c.argv.insert(c.argv.end(), {in.myriad_bin, "train", "--config", in.config_path});
  for (const auto& s : in.sets) c.argv.insert(c.argv.end(), {"--set", s});
  for (const auto& a : in.train_args) c.argv.push_back(a);
  c.env = {{"MYRIAD_SUPERVISOR", in.supervisor_address},
           {"MYRIAD_ATTEMPT", std::to_string(in.attempt)},
           {"MYRIAD_FAULTS", in.faults_spec},
           {"MYRIAD_FAULT_DIR", in.fault_dir},
           {"MYRIAD_HEARTBEAT_S", std::to_string(in.heartbeat_s)},
           {"MYRIAD_EMULATED_HOSTS", in.emulated_hosts},
           {"MYRIAD_SUPERVISOR_PID", in.supervisor_pid > 0 ? std::to_string(in.supervisor_pid) : ""},
           {"MYRIAD_SUPERVISOR_HOST", in.supervisor_host}};
  return c;
}

Result<AttemptOutcome> RunAttempt(const AttemptCommand& command, AttemptOutcome outcome, const WatchOptions& watch,
                                  Runtime* rt, double launch_start) {
  auto now = [&] { return rt->Now() - launch_start; };
  outcome.start_s = now();
  AttemptMonitor monitor(std::move(outcome), watch);
  ASSIGN_OR_RETURN(std::unique_ptr<JobProcess> job, rt->Start(command));

  auto receive = [&](double timeout) {
    nlohmann::json m;
    if (!rt->Receive(timeout, &m)) return false;
    monitor.OnMessage(m, now());
    return true;
  };
  JobExit exit;
  double kill_sent = 0;
  bool kill_escalated = false, stop_waiting = false;
  for (;;) {
    receive(0.05);
    while (receive(0)) {
    }
    if (job->Exited(&exit)) break;
    // Forward a stop request once: the job writes a checkpoint and exits.
    // Ranks take the stop signal once they report; until then it waits.
    if (rt->StopSignal() != 0 && !monitor.outcome().stop_forwarded && !monitor.hung()) {
      if (monitor.AllRanksHeard()) {
        LOG_WARN("launch: signal %d: asking the job to checkpoint and stop", rt->StopSignal());
        job->Signal(kJobStopSignal, /*whole_group=*/false);
        monitor.NoteStopForwarded();
      } else if (!stop_waiting) {
        LOG_WARN("launch: signal %d: the job will be asked to stop once every rank has started", rt->StopSignal());
        stop_waiting = true;
      }
    }
    if (monitor.hung()) {
      // Escalate when the job does not go after SIGTERM.
      if (!kill_escalated && now() - kill_sent > 10) {
        job->Signal(SIGKILL, /*whole_group=*/true);
        kill_escalated = true;
      }
      continue;
    }
    if (monitor.CheckHang(now())) {
      kill_sent = now();
      // mpirun turns SIGTERM into SIGTERM then SIGKILL for every rank; a
      // lone trainer that hangs cannot checkpoint anyway.
      if (command.use_mpi) job->Signal(SIGTERM, /*whole_group=*/false);
      else job->Signal(SIGKILL, /*whole_group=*/true);
    }
  }
  // The last messages (exit events) may arrive after the exit itself.
  while (receive(0.02)) {
  }
  return monitor.Finish(exit, now());
}

// ---- the real machine

namespace {

std::atomic<int> g_stop_signal{0};
void OnStopSignal(int sig) { g_stop_signal.store(sig); }

class ForkedJob : public JobProcess {
 public:
  explicit ForkedJob(pid_t pid) : pid_(pid) {}
  ~ForkedJob() override {
    if (reaped_) return;
    kill(-pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  bool Exited(JobExit* exit) override {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    reaped_ = true;
    exit->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    exit->code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    return true;
  }
  void Signal(int sig, bool whole_group) override { kill(whole_group ? -pid_ : pid_, sig); }

 private:
  pid_t pid_;
  bool reaped_ = false;
};

}  // namespace

struct ProcessRuntime::State {
  Env* env = nullptr;
  std::unique_ptr<HeartbeatListener> listener;
  struct sigaction old_term {}, old_int {};
};

ProcessRuntime::ProcessRuntime(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<ProcessRuntime>> ProcessRuntime::Open(Env* env) {
  auto st = std::make_unique<State>();
  st->env = env;
  ASSIGN_OR_RETURN(st->listener, HeartbeatListener::Open("127.0.0.1", 0));
  g_stop_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &st->old_term);
  sigaction(SIGINT, &sa, &st->old_int);
  return std::unique_ptr<ProcessRuntime>(new ProcessRuntime(std::move(st)));
}

ProcessRuntime::~ProcessRuntime() {
  sigaction(SIGTERM, &state_->old_term, nullptr);
  sigaction(SIGINT, &state_->old_int, nullptr);
}

Result<std::unique_ptr<JobProcess>> ProcessRuntime::Start(const AttemptCommand& command) {
  const pid_t self = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::Error(std::string("launch: fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    ChildDiesWithParent(self);
    for (const auto& [k, v] : command.env) {
      if (v.empty()) unsetenv(k.c_str());
      else setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> cargv;
    for (const auto& a : command.argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    execvp(cargv[0], cargv.data());
    std::fprintf(stderr, "launch: cannot run %s: %s\n", cargv[0], std::strerror(errno));
    std::_Exit(127);
  }
  setpgid(pid, pid);
  return std::unique_ptr<JobProcess>(new ForkedJob(pid));
}

bool ProcessRuntime::Receive(double timeout_s, nlohmann::json* message) {
  return state_->listener->Receive(timeout_s, message);
}

double ProcessRuntime::Now() { return static_cast<double>(state_->env->NowMicros()) * 1e-6; }

void ProcessRuntime::Sleep(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

int ProcessRuntime::StopSignal() { return g_stop_signal.load(); }

std::string ProcessRuntime::HeartbeatAddress() { return state_->listener->address(); }

}  // namespace myriad::supervise
