// myriad launch --config FILE [--np N | --hosts a:2,b:2 [--emulate-hosts]] [--set k=v ...]
//               [--hang-timeout S] [--max-restarts N] [--exclude-after N] [--faults SPEC] ...
// myriad preflight --config FILE [--np N] [--set k=v ...]
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/verbs.h"
#include "train/supervise/preflight.h"
#include "train/supervise/supervisor.h"

namespace myriad::cli {

int RunLaunch(int argc, char** argv) {
  CLI::App app{"Run a training job under the supervisor: pre-flight checks, device health checks, heartbeats and "
               "hang detection, automatic restarts from the newest valid checkpoint, exclusion of failing hosts, "
               "and a report (docs/supervisor.md)",
               "myriad launch"};
  supervise::LaunchOptions o;
  std::string hosts, launcher_args;
  app.add_option("--config,-c", o.config_path, "TOML config (as for myriad train)")->required();
  app.add_option("--set", o.overrides, "override a config key (repeatable)");
  app.add_option("--np,-n", o.np, "ranks on this machine (default 1; >1 runs mpirun)");
  app.add_option("--hosts", hosts, "hosts and ranks per host, e.g. node0:4,node1:4 (passed to mpirun --host)");
  app.add_flag("--emulate-hosts", o.emulate_hosts,
               "treat --hosts as names only and run every rank here (drills and tests of host exclusion)");
  app.add_option("--launcher", o.launcher, "the MPI launcher (default mpirun)");
  app.add_option("--launcher-args", launcher_args, "extra arguments for the launcher, e.g. \"--oversubscribe\"");
  app.add_option("--hang-timeout", o.hang_timeout_s, "seconds without progress on every rank before the job is ended (default 120)");
  app.add_option("--startup-timeout", o.startup_timeout_s, "seconds for every rank to report after a start (default 300)");
  app.add_option("--heartbeat", o.heartbeat_s, "seconds between heartbeats (default 0.5)");
  app.add_option("--max-restarts", o.max_restarts, "restart budget (default 10)");
  app.add_option("--backoff", o.backoff_s, "first restart delay in seconds, doubled while restarts fail (default 1)");
  app.add_option("--backoff-max", o.backoff_max_s, "longest restart delay (default 60)");
  app.add_option("--exclude-after", o.exclude_after, "failures of a host before it is excluded (default 2)");
  app.add_option("--straggler-factor", o.straggler_factor, "step time over this x the median is a straggler (default 1.5)");
  app.add_option("--faults", o.faults, "fault plan for drills, e.g. \"kill:rank=0,step=7;hang:rank=1,step=12\"");
  app.add_option("--state-dir", o.state_dir, "supervisor folder (default <train.out_dir>/supervisor)");
  app.add_flag("--no-preflight", [&](int64_t) { o.preflight = false; }, "skip the pre-flight checks");
  app.add_flag("--reset-hosts", o.reset_hosts, "forget the persisted host history (excluded hosts come back)");
  app.add_flag("--quiet,-q", [&](int64_t) { o.train_args.push_back("-q"); }, "no progress line from the job");
  CLI11_PARSE(app, argc, argv);
  if (!hosts.empty()) {
    auto h = supervise::ParseHosts(hosts);
    if (!h.ok()) {
      std::fprintf(stderr, "myriad launch: %s\n", h.status().message().c_str());
      return 2;
    }
    o.hosts = *h;
  }
  if (!launcher_args.empty()) {
    std::string cur;
    for (char c : launcher_args + " ") {
      if (c == ' ') {
        if (!cur.empty()) o.launcher_args.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
  }
  nlohmann::json report;
  Status s = supervise::RunLaunch(o, &report);
  if (!s.ok()) {
    std::fprintf(stderr, "myriad launch: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}

int RunPreflight(int argc, char** argv) {
  CLI::App app{"Check a training job before it starts: config and layout, memory per rank, data and tokenizer, "
               "checkpoint folder, MPI launcher. Every problem is named in one report.",
               "myriad preflight"};
  supervise::PreflightOptions o;
  bool json = false;
  app.add_option("--config,-c", o.config_path, "TOML config")->required();
  app.add_option("--set", o.overrides, "override a config key (repeatable)");
  app.add_option("--np,-n", o.ranks, "ranks the job will run (default 1)");
  app.add_option("--ranks-per-host", o.ranks_per_host, "ranks on each machine (default: all on this one)");
  app.add_option("--launcher", o.launcher, "the MPI launcher to look for (default mpirun)");
  app.add_flag("--json", json, "print the report as JSON");
  CLI11_PARSE(app, argc, argv);
  const supervise::PreflightReport r = supervise::RunPreflight(o);
  if (json) std::printf("%s\n", r.ToJson().dump(2).c_str());
  else std::printf("%s", r.Format().c_str());
  return r.ok() ? 0 : 1;
}

}  // namespace myriad::cli
