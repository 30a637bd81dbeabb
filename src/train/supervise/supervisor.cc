#include "train/supervise/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/log.h"
#include "train/supervise/faults.h"
#include "train/supervise/health.h"
#include "train/supervise/heartbeat.h"
#include "train/supervise/preflight.h"
#include "train/trainer.h"

namespace myriad::supervise {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double Since(Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); }

std::atomic<int> g_launch_signal{0};
void OnLaunchSignal(int sig) { g_launch_signal.store(sig); }

// What the supervisor knows about one rank of the running attempt.
struct RankState {
  bool seen = false;
  std::string host;
  int64_t step = 0;
  std::string phase, op, comm;
  int64_t op_seq = 0;
  int in_op = 0;
  double op_s = 0;
  Clock::time_point last_msg, last_progress;
  std::deque<double> step_s;
  bool exited = false, exit_ok = false;
  std::string exit_message;
};

struct Attempt {
  int index = 0;
  int ranks = 0, dp = 0;
  std::vector<std::string> hosts;  // host of each rank
  Clock::time_point start, end;
  int64_t resumed_step = -1, last_step = 0;
  std::map<int64_t, std::pair<double, double>> steps;  // rank 0: step -> (done at, since launch start; step_s)
  std::string outcome, detail;
  int exit_code = 0;
  std::set<std::string> blamed_hosts;
  bool completed = false;
};

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "myriad";
}

class HostHistory {
 public:
  explicit HostHistory(std::string path) : path_(std::move(path)) {}
  void Load(bool reset) {
    if (reset) return;
    std::ifstream in(path_);
    if (!in) return;
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("hosts") || !j["hosts"].is_object()) {
      LOG_WARN("launch: %s is not a host history; starting a new one", path_.c_str());
      return;
    }
    j_ = j;
  }
  int Failures(const std::string& h) const {
    return j_["hosts"].contains(h) && j_["hosts"][h].is_object() ? j_["hosts"][h].value("failures", 0) : 0;
  }
  bool Excluded(const std::string& h) const {
    return j_["hosts"].contains(h) && j_["hosts"][h].is_object() && j_["hosts"][h].value("excluded", false);
  }
  void Fail(const std::string& h, const std::string& why) {
    auto& e = j_["hosts"][h];
    if (!e.is_object()) e = nlohmann::json::object();
    e["failures"] = e.value("failures", 0) + 1;
    e["events"].push_back(why);
  }
  void Exclude(const std::string& h) {
    auto& e = j_["hosts"][h];
    if (!e.is_object()) e = nlohmann::json::object();
    e["excluded"] = true;
  }
  Status Save() const {
    std::error_code ec;
    fs::create_directories(fs::path(path_).parent_path(), ec);
    const std::string tmp = path_ + ".tmp";
    {
      std::ofstream out(tmp);
      out << j_.dump(2) << "\n";
      if (!out) return Status::Error(tmp + ": cannot write the host history");
    }
    fs::rename(tmp, path_, ec);
    if (ec) return Status::Error(path_ + ": " + ec.message());
    return Status::Ok();
  }
  const nlohmann::json& json() const { return j_; }

 private:
  std::string path_;
  nlohmann::json j_ = {{"hosts", nlohmann::json::object()}};
};

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

std::string FormatReport(const nlohmann::json& r) {
  std::ostringstream o;
  char buf[512];
  o << "== myriad launch report ==\n";
  std::snprintf(buf, sizeof buf, "outcome: %s after %d attempt(s), %.1f s wall\n",
                r.value("completed", false) ? "completed" : "NOT completed", static_cast<int>(r["attempts"].size()),
                r.value("wall_s", 0.0));
  o << buf;
  for (const auto& a : r["attempts"]) {
    std::snprintf(buf, sizeof buf, "  attempt %d: %d rank(s) on %s, steps %lld..%lld, %s%s%s (lost %lld steps, %.1f s)\n",
                  a.value("attempt", 0), a.value("ranks", 0), a.value("hosts", std::string()).c_str(),
                  static_cast<long long>(a.value("resumed_step", 0)), static_cast<long long>(a.value("last_step", 0)),
                  a.value("outcome", std::string()).c_str(), a.value("detail", std::string()).empty() ? "" : ": ",
                  a.value("detail", std::string()).c_str(), static_cast<long long>(a.value("lost_steps", 0)),
                  a.value("lost_s", 0.0));
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "ETTR %.3f (productive step time %.1f s of %.1f s wall)\n", r.value("ettr", 0.0),
                r.value("productive_s", 0.0), r.value("wall_s", 0.0));
  o << buf;
  if (r.contains("checkpoints") && r["checkpoints"].value("saves", 0) > 0) {
    const auto& c = r["checkpoints"];
    std::snprintf(buf, sizeof buf,
                  "checkpoints: %d saves; training blocked %.3f s per save on average (max %.3f s), "
                  "%.1f%% of a save's %.2f s\n",
                  c.value("saves", 0), c.value("blocked_mean_s", 0.0), c.value("blocked_max_s", 0.0),
                  100 * c.value("blocked_fraction", 0.0), c.value("save_mean_s", 0.0));
    o << buf;
  }
  if (!r["excluded_hosts"].empty()) o << "excluded hosts: " << r["excluded_hosts"].dump() << "\n";
  for (const auto& s : r["stragglers"]) o << "straggler: " << s.dump() << "\n";
  return o.str();
}

Status RunLaunch(const LaunchOptions& opt, nlohmann::json* report_out) {
  const auto launch_start = Clock::now();
  ModelConfig mc;
  TrainConfig tc;
  RETURN_IF_ERROR(LoadRunConfig(opt.config_path, opt.overrides, &mc, &tc));
  const std::string state_dir = opt.state_dir.empty() ? tc.out_dir + "/supervisor" : opt.state_dir;
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) return Status::Error(state_dir + ": cannot create the supervisor's folder: " + ec.message());
  const std::string fault_dir = state_dir + "/faults";

  // Hosts and ranks.
  std::vector<HostSlots> hosts = opt.hosts;
  const bool have_hosts = !hosts.empty();
  if (!have_hosts) hosts.push_back({"", opt.np});
  HostHistory history(state_dir + "/hosts.json");
  history.Load(opt.reset_hosts);
  const int base_ranks = [&] {
    int n = 0;
    for (const auto& h : hosts) n += h.slots;
    return n;
  }();
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
    if (have_hosts && !opt.emulate_hosts) po.ranks_per_host = hosts[0].slots;
    const PreflightReport pr = RunPreflight(po);
    std::fprintf(stderr, "%s", pr.Format().c_str());
    if (!pr.ok()) return Status::Error("launch: pre-flight found problems (above); nothing was started");
  }

  ASSIGN_OR_RETURN(std::vector<Fault> plan, ParseFaults(opt.faults));
  ASSIGN_OR_RETURN(auto listener, HeartbeatListener::Open("127.0.0.1", 0));

  struct sigaction sa {}, old_term {}, old_int {};
  sa.sa_handler = OnLaunchSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGINT, &sa, &old_int);
  struct Restore {
    struct sigaction t, i;
    ~Restore() {
      sigaction(SIGTERM, &t, nullptr);
      sigaction(SIGINT, &i, nullptr);
    }
  } restore{old_term, old_int};

  const std::string bin = opt.myriad_bin.empty() ? SelfExe() : opt.myriad_bin;
  std::vector<Attempt> attempts;
  std::set<int> fired;
  std::vector<nlohmann::json> stragglers, ckpt_all;
  std::vector<std::string> excluded;
  for (const auto& h : hosts)
    if (have_hosts && history.Excluded(h.name)) excluded.push_back(h.name);
  int restarts = 0, consecutive = 0;
  bool completed = false, stopped = false;
  std::string final_error;

  for (int index = 0;; ++index) {
    // This attempt's ranks: the hosts not excluded.
    std::vector<HostSlots> live;
    for (const auto& h : hosts)
      if (std::find(excluded.begin(), excluded.end(), h.name) == excluded.end()) live.push_back(h);
    int ranks = 0;
    for (const auto& h : live) ranks += h.slots;
    if (ranks == 0) {
      final_error = "every host is excluded";
      break;
    }
    Attempt at;
    at.index = index;
    at.ranks = ranks;
    for (const auto& h : live)
      for (int i = 0; i < h.slots; ++i) at.hosts.push_back(h.name.empty() ? "localhost" : h.name);
    // Data parallelism shrinks with the ranks (the other dimensions stay).
    std::vector<std::string> sets = opt.overrides;
    at.dp = pc.dp;
    if (ranks != base_ranks) {
      const int per_replica = base_ranks / pc.dp;
      if (ranks % per_replica != 0) {
        final_error = "cannot continue on " + std::to_string(ranks) + " ranks: tp*pp*ep*cp = " +
                      std::to_string(per_replica) + " does not divide them";
        break;
      }
      at.dp = ranks / per_replica;
      sets.push_back("parallel.dp=" + std::to_string(at.dp));
    }
    // Faults still to fire.
    std::vector<Fault> pending;
    for (const Fault& f : plan)
      if (!fired.count(f.id)) pending.push_back(f);

    // The command.
    std::vector<std::string> argv;
    const bool use_mpi = ranks > 1 || opt.always_mpirun;
    if (use_mpi) {
      argv = {opt.launcher, "-np", std::to_string(ranks)};
      for (const auto& a : opt.launcher_args) argv.push_back(a);
      if (have_hosts && !opt.emulate_hosts) {
        std::string hl;
        for (const auto& h : live) hl += (hl.empty() ? "" : ",") + h.name + ":" + std::to_string(h.slots);
        argv.insert(argv.end(), {"--host", hl});
      }
      for (const char* v : {"MYRIAD_SUPERVISOR", "MYRIAD_ATTEMPT", "MYRIAD_FAULTS", "MYRIAD_FAULT_DIR",
                            "MYRIAD_HEARTBEAT_S", "MYRIAD_EMULATED_HOSTS"})
        argv.insert(argv.end(), {"-x", v});
    }
    argv.insert(argv.end(), {bin, "train", "--config", opt.config_path});
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    for (const auto& a : opt.train_args) argv.push_back(a);

    std::vector<std::pair<std::string, std::string>> env = {
        {"MYRIAD_SUPERVISOR", listener->address()},
        {"MYRIAD_ATTEMPT", std::to_string(index)},
        {"MYRIAD_FAULTS", FaultsToSpec(pending)},
        {"MYRIAD_FAULT_DIR", fault_dir},
        {"MYRIAD_HEARTBEAT_S", std::to_string(opt.heartbeat_s)},
        {"MYRIAD_EMULATED_HOSTS", have_hosts && opt.emulate_hosts ? Join(at.hosts, ",") : ""}};
    LOG_INFO("launch: attempt %d: %d rank(s)%s%s: %s", index, ranks, have_hosts ? " on " : "",
             have_hosts ? Join(at.hosts, ",").c_str() : "", Join(argv, " ").c_str());

    at.start = Clock::now();
    const pid_t pid = fork();
    if (pid < 0) return Status::Error(std::string("launch: fork: ") + std::strerror(errno));
    if (pid == 0) {
      setpgid(0, 0);
      for (const auto& [k, v] : env) {
        if (v.empty()) unsetenv(k.c_str());
        else setenv(k.c_str(), v.c_str(), 1);
      }
      std::vector<char*> cargv;
      for (auto& a : argv) cargv.push_back(a.data());
      cargv.push_back(nullptr);
      execvp(cargv[0], cargv.data());
      std::fprintf(stderr, "launch: cannot run %s: %s\n", cargv[0], std::strerror(errno));
      std::_Exit(127);
    }
    setpgid(pid, pid);

    std::map<int, RankState> rs;
    int status = 0;
    bool exited = false, hang = false, forwarded_stop = false;
    std::string hang_report;
    Clock::time_point kill_sent{};
    bool kill_escalated = false;
    auto handle = [&](const nlohmann::json& m) {
      if (m.value("attempt", -1) != index) return;  // a straggling datagram of an earlier attempt
      const int r = m.value("rank", 0);
      RankState& s = rs[r];
      const auto now = Clock::now();
      if (!s.seen) s.last_progress = now;
      s.seen = true;
      s.last_msg = now;
      s.host = m.value("host", std::string());
      const std::string kind = m.value("kind", std::string());
      const int64_t step = m.value("step", int64_t{0});
      const std::string phase = m.value("phase", std::string());
      int64_t op_seq = s.op_seq;
      if (kind == "beat") {
        op_seq = m.value("op_seq", int64_t{0});
        s.op = m.value("op", std::string());
        s.comm = m.value("comm", std::string());
        s.in_op = m.value("in_op", 0);
        s.op_s = m.value("op_s", 0.0);
      }
      if (step != s.step || phase != s.phase || op_seq != s.op_seq) s.last_progress = now;
      s.step = step;
      s.phase = phase;
      s.op_seq = op_seq;
      if (kind == "step") {
        // A rank's own compute time: in a synchronous step every rank's wall
        // time is the slowest one's, the others waiting in collectives.
        s.step_s.push_back(m.contains("compute_s") ? m.value("compute_s", 0.0) : m.value("step_s", 0.0));
        while (static_cast<int>(s.step_s.size()) > opt.straggler_window) s.step_s.pop_front();
        if (r == 0) {
          at.steps[step] = {Since(launch_start), m.value("step_s", 0.0)};
          at.last_step = std::max(at.last_step, step);
          // Stragglers, judged when rank 0 finishes a step.
          std::vector<std::vector<double>> by_rank;
          for (int i = 0; i < ranks; ++i)
            by_rank.push_back(rs.count(i) ? std::vector<double>(rs[i].step_s.begin(), rs[i].step_s.end())
                                          : std::vector<double>());
          for (const Straggler& sg : FindStragglers(by_rank, opt.straggler_factor, opt.straggler_window)) {
            bool known = false;
            for (const auto& k : stragglers)
              known = known || (k["attempt"] == index && k["rank"] == sg.rank);
            if (known) continue;
            const std::string host = rs[sg.rank].host;
            LOG_WARN("launch: rank %d on host %s is a straggler: its steps compute %.3f s, %.2fx the median %.3f s",
                     sg.rank, host.c_str(), sg.rank_median_s, sg.ratio, sg.all_median_s);
            stragglers.push_back({{"attempt", index}, {"rank", sg.rank}, {"host", host},
                                  {"step_s", sg.rank_median_s}, {"median_s", sg.all_median_s}, {"ratio", sg.ratio}});
          }
        }
      } else if (kind == "event") {
        const std::string ev = m.value("event", std::string());
        if (ev == "start" && r == 0) {
          at.resumed_step = m.value("resumed_step", int64_t{0});
          for (const auto& sk : m.value("skipped_checkpoints", std::vector<std::string>()))
            LOG_WARN("launch: attempt %d skipped a damaged checkpoint: %s", index, sk.c_str());
        } else if (ev == "health" && !m.value("ok", true)) {
          LOG_WARN("launch: rank %d on host %s failed its health check: %s", r, s.host.c_str(),
                   m.value("report", nlohmann::json::object()).value("failure", std::string()).c_str());
          at.blamed_hosts.insert(s.host);
          if (at.outcome.empty()) at.outcome = "health", at.detail = "rank " + std::to_string(r) + " on " + s.host;
        } else if (ev == "numerical") {
          if (at.outcome.empty()) at.outcome = "numerical", at.detail = m.value("message", std::string());
        } else if (ev == "fault") {
          LOG_INFO("launch: injected fault fired on rank %d: %s", r, m.value("fault", std::string()).c_str());
        } else if (ev == "exit") {
          s.exited = true;
          s.exit_ok = m.value("ok", false);
          s.exit_message = m.value("message", std::string());
          if (r == 0 && m.value("completed", false)) at.completed = true;
        }
      }
    };
    std::vector<nlohmann::json> ckpt_events;
    auto receive = [&](double timeout) {
      nlohmann::json m;
      if (listener->Receive(timeout, &m)) {
        if (m.value("kind", std::string()) == "event" && m.value("event", std::string()) == "checkpoint" &&
            m.value("attempt", -1) == index)
          ckpt_events.push_back(m);
        handle(m);
        return true;
      }
      return false;
    };

    while (!exited) {
      receive(0.05);
      while (receive(0)) {
      }
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) {
        exited = true;
        break;
      }
      // Forward a stop request once: the job writes a checkpoint and exits.
      if (g_launch_signal.load() != 0 && !forwarded_stop) {
        LOG_WARN("launch: signal %d: asking the job to checkpoint and stop", g_launch_signal.load());
        kill(pid, SIGTERM);
        forwarded_stop = true;
        stopped = true;
      }
      if (hang) {
        // Escalate when the job does not go after SIGTERM.
        if (!kill_escalated && Since(kill_sent) > 10) {
          kill(-pid, SIGKILL);
          kill_escalated = true;
        }
        continue;
      }
      // Hang detection.
      const auto now = Clock::now();
      bool stuck = false;
      std::string why;
      int seen = 0;
      for (auto& [r, s] : rs) seen += s.seen;
      if (seen < ranks && Since(at.start) > opt.startup_timeout_s) {
        stuck = true;
        why = std::to_string(ranks - seen) + " rank(s) never reported within " +
              std::to_string(static_cast<int>(opt.startup_timeout_s)) + " s";
      }
      if (!stuck && seen > 0) {
        double newest = 1e30;
        for (auto& [r, s] : rs)
          if (s.seen) newest = std::min(newest, std::chrono::duration<double>(now - s.last_progress).count());
        // Every rank that has reported is idle: no step, phase or comm op changed.
        bool all_idle = seen == ranks || Since(at.start) > opt.startup_timeout_s;
        if (all_idle && newest > opt.hang_timeout_s) {
          stuck = true;
          char b[128];
          std::snprintf(b, sizeof b, "no progress for %.1f s", newest);
          why = b;
        }
      }
      if (stuck) {
        // Name the ranks: those not inside a collective first (the likely
        // cause), then those waiting in one.
        std::vector<std::string> lines;
        for (int pass = 0; pass < 2; ++pass)
          for (int r = 0; r < ranks; ++r) {
            const bool present = rs.count(r) && rs[r].seen;
            const RankState& s = rs[r];
            const bool in_coll = present && s.in_op > 0;
            if ((pass == 0) == in_coll) continue;
            char b[512];
            if (!present)
              std::snprintf(b, sizeof b, "rank %d: never reported", r);
            else if (in_coll)
              std::snprintf(b, sizeof b, "rank %d (host %s): step %lld, phase %s, waiting in %s on \"%s\" (op #%lld) for %.1f s",
                            r, s.host.c_str(), static_cast<long long>(s.step), s.phase.c_str(), s.op.c_str(),
                            s.comm.c_str(), static_cast<long long>(s.op_seq), s.op_s);
            else
              std::snprintf(b, sizeof b, "rank %d (host %s): step %lld, phase %s, not in a collective (last: %s)%s",
                            r, s.host.c_str(), static_cast<long long>(s.step), s.phase.c_str(),
                            s.op.empty() ? "none" : s.op.c_str(),
                            Since(s.last_msg) > 3 * opt.heartbeat_s + 1 ? ", heartbeats stopped" : "");
            lines.push_back(b);
            if (pass == 0 && present) at.blamed_hosts.insert(s.host);
          }
        hang_report = why + "; " + Join(lines, "; ");
        LOG_ERROR("launch: hang: %s", hang_report.c_str());
        hang = true;
        at.outcome = "hang";
        at.detail = hang_report;
        kill_sent = Clock::now();
        // mpirun turns SIGTERM into SIGTERM then SIGKILL for every rank; a
        // lone trainer that hangs cannot checkpoint anyway.
        kill(use_mpi ? pid : -pid, use_mpi ? SIGTERM : SIGKILL);
      }
    }
    for (int i = 0; i < 10 && receive(0.02);) {
    }
    at.end = Clock::now();
    at.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const bool ok_exit = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    for (int id : FiredFaults(fault_dir, plan)) fired.insert(id);

    // Outcome.
    if (ok_exit && at.completed) {
      at.outcome = "completed";
      completed = true;
    } else if (ok_exit && stopped) {
      at.outcome = "stopped";
      at.detail = "by signal; checkpoint written";
    } else if (at.outcome.empty()) {
      if (at.exit_code == kExitNumerical) at.outcome = "numerical";
      else if (at.exit_code == kExitHealth) at.outcome = "health";
      else if (at.exit_code == kExitCheckpoint) at.outcome = "checkpoint";
      else if (ok_exit) at.outcome = "stopped", at.detail = "exited before the last step without being asked";
      else at.outcome = "crash";
      if (at.outcome == "crash") {
        // Ranks that died without saying why: those whose heartbeats
        // stopped first and sent no exit event.
        std::vector<std::string> dead;
        for (auto& [r, s] : rs)
          if (s.seen && !s.exited) {
            dead.push_back("rank " + std::to_string(r) + " (host " + s.host + ")");
            at.blamed_hosts.insert(s.host);
          }
        at.detail = "exit " + std::to_string(at.exit_code) + (dead.empty() ? "" : "; no exit report from " + Join(dead, ", "));
        if (dead.size() == static_cast<size_t>(ranks) && ranks > 1) at.blamed_hosts.clear();  // cannot tell
      }
      for (auto& [r, s] : rs)
        if (s.exited && !s.exit_ok && at.detail.empty()) at.detail = "rank " + std::to_string(r) + ": " + s.exit_message;
    }
    LOG_INFO("launch: attempt %d ended: %s%s%s (exit %d, steps %lld..%lld)", index, at.outcome.c_str(),
             at.detail.empty() ? "" : ": ", at.detail.c_str(), at.exit_code,
             static_cast<long long>(std::max<int64_t>(0, at.resumed_step)), static_cast<long long>(at.last_step));
    attempts.push_back(at);
    for (const auto& e : ckpt_events) ckpt_all.push_back(e);
    if (completed || stopped) break;

    // Host history and exclusion.
    if (have_hosts) {
      for (const std::string& h : at.blamed_hosts) {
        if (h.empty() || h == "localhost") continue;
        history.Fail(h, "attempt " + std::to_string(index) + ": " + at.outcome);
        if (history.Failures(h) >= opt.exclude_after &&
            std::find(excluded.begin(), excluded.end(), h) == excluded.end() && live.size() > 1) {
          history.Exclude(h);
          excluded.push_back(h);
          LOG_WARN("launch: host %s failed %d times: excluded; continuing on the other hosts", h.c_str(),
                   history.Failures(h));
        }
      }
      if (Status s = history.Save(); !s.ok()) LOG_WARN("launch: %s", s.message().c_str());
    }
    if (restarts >= opt.max_restarts) {
      final_error = "restart budget spent (" + std::to_string(opt.max_restarts) + " restarts); last: " +
                    at.outcome + (at.detail.empty() ? "" : ": " + at.detail);
      break;
    }
    ++restarts;
    // Backoff: doubles while attempts fail without moving past their checkpoint.
    const bool progressed = at.last_step > std::max<int64_t>(0, at.resumed_step) &&
                            tc.ckpt_every > 0 && at.last_step - std::max<int64_t>(0, at.resumed_step) >= tc.ckpt_every;
    consecutive = progressed ? 1 : consecutive + 1;
    const double delay = std::min(opt.backoff_max_s, opt.backoff_s * std::pow(2.0, consecutive - 1));
    LOG_INFO("launch: restarting in %.1f s (restart %d of at most %d)", delay, restarts, opt.max_restarts);
    const auto until = Clock::now() + std::chrono::duration<double>(delay);
    while (Clock::now() < until && g_launch_signal.load() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (g_launch_signal.load() != 0) {
      stopped = true;
      break;
    }
  }

  // ---- the report
  const double wall = Since(launch_start);
  nlohmann::json rep;
  rep["completed"] = completed;
  rep["wall_s"] = wall;
  double productive = 0, lost_total = 0;
  nlohmann::json atts = nlohmann::json::array();
  for (size_t k = 0; k < attempts.size(); ++k) {
    const Attempt& a = attempts[k];
    const int64_t resumed = std::max<int64_t>(0, a.resumed_step);
    // Steps of this attempt that count: up to where the next attempt resumed.
    const int64_t kept_until = k + 1 < attempts.size() ? std::max<int64_t>(0, attempts[k + 1].resumed_step) : INT64_MAX;
    int64_t lost_steps = 0;
    for (const auto& [st, v] : a.steps) {
      if (st <= kept_until) productive += v.second;
      else ++lost_steps;
    }
    // Time lost to this attempt's failure: from the end of the step the next
    // attempt resumed from (or this attempt's start) to the end of the next
    // attempt's first step, less that step's own time.
    double lost_s = 0;
    if (a.outcome != "completed" && a.outcome != "stopped") {
      const double start_s = std::chrono::duration<double>(a.start - launch_start).count();
      double ref = start_s;
      if (auto it = a.steps.find(kept_until); it != a.steps.end()) ref = it->second.first;
      // ... until the next attempt computes again: its first step's start,
      // or (when it computed nothing) its own start -- its time is then its
      // own failure's.
      double next = wall;
      if (k + 1 < attempts.size()) {
        const Attempt& n = attempts[k + 1];
        next = std::chrono::duration<double>(n.start - launch_start).count();
        if (!n.steps.empty()) next = n.steps.begin()->second.first - n.steps.begin()->second.second;
      }
      lost_s = std::max(0.0, next - ref);
      lost_total += lost_s;
    }
    std::string hl;
    {
      std::map<std::string, int> count;
      for (const auto& h : a.hosts) count[h]++;
      for (const auto& [h, n] : count) hl += (hl.empty() ? "" : ",") + h + ":" + std::to_string(n);
    }
    atts.push_back({{"attempt", a.index}, {"ranks", a.ranks}, {"dp", a.dp}, {"hosts", hl},
                    {"resumed_step", resumed}, {"last_step", a.last_step}, {"outcome", a.outcome},
                    {"detail", a.detail}, {"exit_code", a.exit_code}, {"lost_steps", lost_steps}, {"lost_s", lost_s},
                    {"seconds", std::chrono::duration<double>(a.end - a.start).count()}});
  }
  rep["attempts"] = atts;
  rep["productive_s"] = productive;
  rep["ettr"] = wall > 0 ? productive / wall : 0;
  rep["lost_s"] = lost_total;
  rep["restarts"] = restarts;
  rep["faults_planned"] = plan.size();
  rep["faults_fired"] = fired.size();
  rep["excluded_hosts"] = excluded;
  rep["stragglers"] = stragglers;
  rep["host_history"] = history.json()["hosts"];
  // Checkpoints: rank 0's "checkpoint" events (one per finished write).
  {
    int saves = 0, failed = 0;
    double blocked = 0, blocked_max = 0, full = 0;
    nlohmann::json per = nlohmann::json::array();
    for (const auto& e : ckpt_all) {
      if (!e.value("ok", false)) {
        ++failed;
        continue;
      }
      const double b = e.value("blocked_s", 0.0), p = e.value("persist_s", 0.0);
      ++saves;
      blocked += b;
      blocked_max = std::max(blocked_max, b);
      full += b + p;
      per.push_back({{"step", e.value("step", int64_t{0})}, {"attempt", e.value("attempt", 0)}, {"blocked_s", b},
                     {"persist_s", p}, {"snapshot_s", e.value("snapshot_s", 0.0)}});
    }
    rep["checkpoints"] = {{"saves", saves}, {"failed", failed},
                          {"blocked_mean_s", saves ? blocked / saves : 0.0}, {"blocked_max_s", blocked_max},
                          {"save_mean_s", saves ? full / saves : 0.0},
                          {"blocked_fraction", full > 0 ? blocked / full : 0.0}, {"per_save", per}};
  }
  if (!final_error.empty()) rep["error"] = final_error;
  const std::string text = FormatReport(rep);
  std::fprintf(stderr, "%s", text.c_str());
  {
    std::ofstream out(state_dir + "/report.json");
    out << rep.dump(2) << "\n";
  }
  if (report_out) *report_out = rep;
  if (completed) return Status::Ok();
  if (stopped) return Status::Error("launch: stopped by signal (the job wrote a checkpoint; launch again to resume)");
  return Status::Error("launch: " + (final_error.empty() ? std::string("job did not complete") : final_error));
}

}  // namespace myriad::supervise
