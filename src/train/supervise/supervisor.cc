#include "train/supervise/supervisor.h"

#include <unistd.h>

#include <set>
#include <sstream>

#include "core/log.h"
#include "train/supervise/preflight.h"
#include "train/supervise/report.h"
#include "train/supervise/heartbeat.h"
#include "train/supervise/run_lock.h"
#include "train/trainer.h"

namespace myriad::supervise {
namespace {

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "myriad";
}

// The command of attempt `index` on `layout`, with the faults still to fire.
AttemptCommand CommandFor(const LaunchOptions& opt, const LaunchSetup& setup, const AttemptLayout& layout, int index,
                          const std::vector<Fault>& pending, const std::string& heartbeat_address) {
  const bool have_hosts = !opt.hosts.empty();
  CommandInputs in;
  in.attempt = index;
  in.myriad_bin = setup.myriad_bin;
  in.config_path = opt.config_path;
  in.sets = opt.overrides;
  if (layout.dp_shrunk) in.sets.push_back("parallel.dp=" + std::to_string(layout.dp));
  in.train_args = opt.train_args;
  in.ranks = layout.ranks;
  in.always_mpirun = opt.always_mpirun;
  in.launcher = opt.launcher;
  in.launcher_args = opt.launcher_args;
  if (have_hosts && !opt.emulate_hosts)
    for (const auto& h : layout.live) in.mpi_hosts += (in.mpi_hosts.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
  if (have_hosts && opt.emulate_hosts) in.emulated_hosts = JoinNames(layout.rank_hosts, ",");
  in.supervisor_address = heartbeat_address;
  in.faults_spec = FaultsToSpec(pending);
  in.fault_dir = setup.state_dir + "/faults";
  in.heartbeat_s = opt.heartbeat_s;
  in.supervisor_pid = getpid();
  in.supervisor_host = MachineName();
  return BuildAttemptCommand(in);
}

}  // namespace

Result<std::vector<HostSlots>> ParseHosts(const std::string& s) {
  std::vector<HostSlots> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    HostSlots h;
    const size_t colon = item.find(':');
    h.name = item.substr(0, colon);
    if (colon != std::string::npos) {
      char* end = nullptr;
      h.slots = static_cast<int>(std::strtol(item.c_str() + colon + 1, &end, 10));
      if (*end != 0 || h.slots < 1)
        return Status::Error("--hosts: \"" + item + "\": slots must be a number >= 1 (hint: host:2)");
    }
    if (h.name.empty()) return Status::Error("--hosts: \"" + item + "\" has no host name");
    for (const auto& o : out)
      if (o.name == h.name) return Status::Error("--hosts: " + h.name + " is listed twice");
    out.push_back(h);
  }
  if (out.empty()) return Status::Error("--hosts: no hosts in \"" + s + "\" (hint: node0:2,node1:2)");
  return out;
}

Status RunLaunch(const LaunchOptions& opt, nlohmann::json* report_out) {
  Env* env = opt.env ? opt.env : Env::Default();
  const double launch_start = static_cast<double>(env->NowMicros()) * 1e-6;
  ModelConfig mc;
  TrainConfig tc;
  RETURN_IF_ERROR(LoadRunConfig(opt.config_path, opt.overrides, &mc, &tc));
  // One writer per run directory: held until the launch returns; its ranks
  // know it is their own supervisor's ($MYRIAD_SUPERVISOR_PID).
  auto lock = RunLock::ForLaunch(tc.out_dir);
  if (!lock.ok()) return Status::Error("launch: " + lock.status().message());
  LaunchSetup setup;
  setup.state_dir = opt.state_dir.empty() ? tc.out_dir + "/supervisor" : opt.state_dir;
  if (Status s = env->CreateDirs(setup.state_dir); !s.ok())
    return Status::Error("launch: cannot create the supervisor's folder: " + s.message() + " (hint: --state-dir)");

  int base_ranks = 0;
  for (const auto& h : opt.hosts) base_ranks += h.slots;
  if (opt.hosts.empty()) base_ranks = opt.np;
  const ParallelConfig& pc = tc.parallel;
  const int layout_ranks = pc.dp * pc.tp * pc.pp * pc.ep * pc.cp;
  if (layout_ranks != base_ranks)
    return Status::Error("launch: " + std::to_string(base_ranks) + " ranks but [parallel] dp*tp*pp*ep*cp = " +
                         std::to_string(layout_ranks) + " (hint: --np, --hosts or --set parallel.dp=...)");

  if (opt.preflight) {
    PreflightOptions po;
    po.config_path = opt.config_path;
    po.overrides = opt.overrides;
    po.ranks = base_ranks;
    po.launcher = opt.launcher;
    if (!opt.hosts.empty() && !opt.emulate_hosts) po.ranks_per_host = opt.hosts[0].slots;
    const PreflightReport pr = RunPreflight(po);
    std::fprintf(stderr, "%s", pr.Format().c_str());
    if (!pr.ok()) return Status::Error("launch: pre-flight found problems (above); nothing was started");
  }

  ASSIGN_OR_RETURN(setup.plan, ParseFaults(opt.faults));
  setup.myriad_bin = opt.myriad_bin.empty() ? SelfExe() : opt.myriad_bin;
  setup.dp = pc.dp;
  setup.ckpt_every = tc.ckpt_every;
  ASSIGN_OR_RETURN(std::unique_ptr<ProcessRuntime> runtime, ProcessRuntime::Open(env));
  return Supervise(opt, setup, runtime.get(), launch_start, report_out);
}

Status Supervise(const LaunchOptions& opt, const LaunchSetup& setup, Runtime* rt, double launch_start,
                 nlohmann::json* report_out) {
  Env* env = opt.env ? opt.env : Env::Default();
  const std::string fault_dir = setup.state_dir + "/faults";
  const std::string history_path = setup.state_dir + "/hosts.json";
  std::vector<HostSlots> hosts = opt.hosts;
  const bool have_hosts = !hosts.empty();
  if (!have_hosts) hosts.push_back({"", opt.np});
  HostHistory history = HostHistory::Load(env, history_path, opt.reset_hosts);
  RestartPolicy policy({opt.max_restarts, opt.backoff_s, opt.backoff_max_s, opt.exclude_after, setup.ckpt_every},
                       hosts, have_hosts, setup.dp, &history);
  const WatchOptions watch{opt.hang_timeout_s, opt.startup_timeout_s, opt.heartbeat_s, opt.straggler_factor,
                           opt.straggler_window};

  std::vector<AttemptOutcome> attempts;
  std::set<int> fired;
  bool completed = false, stopped = false, stopped_between = false;
  std::string final_error;
  for (int index = 0;; ++index) {
    auto layout = policy.NextLayout();
    if (!layout.ok()) {
      final_error = layout.status().message();
      break;
    }
    std::vector<Fault> pending;  // the faults still to fire
    for (const Fault& f : setup.plan)
      if (!fired.count(f.id)) pending.push_back(f);
    const AttemptCommand command = CommandFor(opt, setup, *layout, index, pending, rt->HeartbeatAddress());
    LOG_INFO("launch: attempt %d: %d rank(s)%s%s: %s", index, layout->ranks, have_hosts ? " on " : "",
             have_hosts ? JoinNames(layout->rank_hosts, ",").c_str() : "", JoinNames(command.argv, " ").c_str());

    AttemptOutcome seed;
    seed.index = index;
    seed.ranks = layout->ranks;
    seed.dp = layout->dp;
    seed.hosts = layout->rank_hosts;
    ASSIGN_OR_RETURN(AttemptOutcome at, RunAttempt(command, std::move(seed), watch, rt, launch_start));
    for (int id : FiredFaults(fault_dir, setup.plan, env)) fired.insert(id);
    completed = at.outcome == "completed";
    stopped = at.stop_forwarded;
    attempts.push_back(at);

    const RestartDecision d = policy.AfterAttempt(at, *layout);
    if (d.kind == RestartDecision::kEnd) break;
    if (d.history_changed)
      if (Status s = history.Save(env, history_path); !s.ok()) LOG_WARN("launch: %s", s.message().c_str());
    if (d.kind == RestartDecision::kGiveUp) {
      final_error = d.error;
      break;
    }
    const double until = rt->Now() + d.delay_s;
    while (rt->Now() < until && rt->StopSignal() == 0) rt->Sleep(0.02);
    if (rt->StopSignal() != 0) {
      stopped = stopped_between = true;
      break;
    }
  }

  LaunchSummary sum;
  sum.attempts = std::move(attempts);
  sum.wall_s = rt->Now() - launch_start;
  sum.state = completed ? FinalState::kCompleted : stopped ? FinalState::kStopped : FinalState::kFailed;
  sum.error = final_error;
  sum.restarts = policy.restarts();
  sum.faults_planned = setup.plan.size();
  sum.faults_fired = fired.size();
  sum.excluded_hosts = policy.excluded();
  sum.host_history = history.json()["hosts"];
  const nlohmann::json rep = BuildReport(sum);
  std::fprintf(stderr, "%s", FormatReport(rep).c_str());
  if (report_out) *report_out = rep;

  Status result = Status::Ok();
  if (stopped && !completed) {
    // Asked to stop, and stopped: not a failure (exit 0), unless the job
    // did not stop cleanly.
    const AttemptOutcome* last = sum.attempts.empty() ? nullptr : &sum.attempts.back();
    const std::string sig = "launch: stopped by signal " + std::to_string(rt->StopSignal());
    if (stopped_between)
      LOG_WARN("%s between attempts; launch again to resume from the newest checkpoint", sig.c_str());
    else if (last && last->outcome == "stopped")
      LOG_WARN("%s: the job wrote a checkpoint at step %lld; launch again to resume", sig.c_str(),
               static_cast<long long>(last->last_step));
    else
      result = Status::Error(sig + ", but the job did not stop cleanly (" + (last ? last->outcome : "?") +
                             "); launch again to resume from the newest checkpoint");
  } else if (!completed)
    result = Status::Error("launch: " + (final_error.empty() ? std::string("job did not complete") : final_error));
  const std::string report_path = setup.state_dir + "/report.json";
  if (Status w = WriteReport(env, report_path, rep); !w.ok()) {
    // The run's state (checkpoints, hosts.json) is untouched and the report
    // was printed above: say so, with what became of the job.
    const std::string outcome = completed ? "the job completed" : result.ok() ? "the job stopped" : result.message();
    return Status::Error("launch: " + w.message() + "; " + outcome + "; the report is printed above (hint: room and "
                         "permissions in " + setup.state_dir + ")");
  }
  return result;
}

}  // namespace myriad::supervise
