// myriad simulate: the failure simulator on a [failures] description --
// ETTR with and without checkpoints and automatic recovery, and the best
// checkpoint interval (docs/planning.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "plan/failure.h"
#include "plan/planner.h"
#include "plan/report.h"

namespace myriad::cli {
namespace {

struct Scenario {
  std::string name;
  plan::FailureSpec spec;
  plan::FailureResult r;
};

}  // namespace

int RunSimulate(int argc, char** argv) {
  CLI::App app{"Simulate failures over a long training run: ETTR, where the time goes, and the best checkpoint "
               "interval (docs/planning.md)",
               "myriad simulate"};
  std::string config;
  std::vector<std::string> overrides;
  double work_hours = 0;
  bool json = false, sweep = true;
  app.add_option("-c,--config", config, "description with a [failures] section (configs/plan/*.toml)")->required();
  app.add_option("--set", overrides, "override a key, e.g. --set failures.ckpt_interval_minutes=10 (repeatable)");
  app.add_option("--work-hours", work_hours, "hours of failure-free training the job needs (e.g. from myriad plan)")
      ->check(CLI::PositiveNumber);
  app.add_flag("!--no-sweep", sweep, "skip the checkpoint-interval sweep");
  app.add_flag("--json", json, "print JSON");
  CLI11_PARSE(app, argc, argv);
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "myriad simulate: %s\n", s.message().c_str());
    return 2;
  };
  auto doc = ConfigDoc::Load(config, overrides);
  if (!doc.ok()) return fail(doc.status());
  auto spec = plan::ParseFailureSpec(**doc);
  if (!spec.ok()) return fail(spec.status());
  // The rest of a plan description is read (and not used) so that Finish()
  // can name any key nobody reads, typos in [failures] included.
  (void)plan::ReadCluster(doc->get());
  (void)plan::ReadJob(doc->get());
  (void)plan::ReadSearchSpace(doc->get());
  if (Status st = (*doc)->Finish(); !st.ok()) return fail(st);
  if (work_hours > 0) spec->work_hours = work_hours;
  if (Status st = plan::ValidateFailureSpec(*spec); !st.ok()) return fail(st);

  const double mtbf_h = plan::JobMtbfSeconds(*spec) / 3600;
  std::vector<Scenario> runs;
  auto add = [&](const std::string& name, plan::FailureSpec s) {
    runs.push_back({name, s, plan::SimulateFailures(s)});
  };
  plan::FailureSpec s = *spec;
  s.ckpt_interval_seconds = 0, s.auto_recovery = false;
  add("no checkpoints, manual restarts", s);
  s = *spec;
  s.auto_recovery = false;
  add("checkpoints, manual restarts", s);
  s = *spec;
  s.ckpt_interval_seconds = 0, s.auto_recovery = true;
  add("no checkpoints, automatic recovery", s);
  add("checkpoints, automatic recovery", *spec);
  plan::IntervalSweep sw;
  if (sweep) {
    if (!json) std::fprintf(stderr, "sweeping checkpoint intervals...\n");
    sw = plan::BestCheckpointInterval(*spec);
    if (sw.best_interval_s > 0) {
      s = *spec;
      s.ckpt_interval_seconds = sw.best_interval_s;
      add("automatic recovery, best interval", s);
    }
  }
  if (json) {
    nlohmann::json j;
    j["mtbf_hours"] = mtbf_h;
    j["work_hours"] = spec->work_hours;
    for (const auto& r : runs)
      j["scenarios"].push_back({{"name", r.name},
                                {"ckpt_interval_s", r.spec.ckpt_interval_seconds},
                                {"auto_recovery", r.spec.auto_recovery},
                                {"ettr", r.r.ettr},
                                {"ettr_stderr", r.r.ettr_stderr},
                                {"wall_hours", r.r.wall_hours},
                                {"failures", r.r.failures},
                                {"lost_work_hours", r.r.lost_work_hours},
                                {"truncated_trials", r.r.truncated_trials}});
    if (sweep) {
      j["sweep"]["best_interval_s"] = sw.best_interval_s;
      j["sweep"]["best_ettr"] = sw.best_ettr;
      j["sweep"]["young_daly_s"] = sw.young_daly_s;
      for (auto [t, e] : sw.curve) j["sweep"]["curve"].push_back({t, e});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("job         %lld devices (%lld nodes, %lld spare), %s of work, checkpoint every %s (%s stall)\n",
              (long long)spec->devices, (long long)spec->nodes(), (long long)spec->spare_nodes,
              plan::Duration(spec->work_hours).c_str(), plan::Seconds(spec->ckpt_interval_seconds).c_str(),
              plan::Seconds(spec->ckpt_blocking_seconds).c_str());
  std::printf("failures   ");
  for (const auto& c : spec->components)
    std::printf(" %s %.3g/1000 %s-days;", c.name.c_str(), c.rate_per_hour * 24 * 1000, c.per_node ? "node" : "device");
  std::printf("\n            job MTBF %.2f hours; restart %s + load %s\n\n", mtbf_h,
              plan::Seconds(spec->restart_seconds).c_str(), plan::Seconds(spec->load_seconds).c_str());
  std::printf("  %-36s %-16s %-16s %-10s %-12s\n", "scenario", "ETTR", "wall time", "failures", "work lost");
  for (const auto& r : runs) {
    char ettr[64];
    std::snprintf(ettr, sizeof ettr, "%.4f +- %.4f%s", r.r.ettr, r.r.ettr_stderr, r.r.truncated_trials ? "*" : "");
    std::printf("  %-36s %-16s %-16s %-10.1f %-12s\n", r.name.c_str(), ettr, plan::Duration(r.r.wall_hours).c_str(),
                r.r.failures, plan::Duration(r.r.lost_work_hours).c_str());
  }
  if (sweep && sw.best_interval_s > 0) {
    std::printf("\nbest checkpoint interval %s (ETTR %.4f); Young/Daly sqrt(2 C MTBF) = %s\n",
                plan::Seconds(sw.best_interval_s).c_str(), sw.best_ettr, plan::Seconds(sw.young_daly_s).c_str());
    std::printf("  interval     ETTR\n");
    for (size_t i = 0; i < sw.curve.size(); i += 3)
      std::printf("  %-12s %.4f\n", plan::Seconds(sw.curve[i].first).c_str(), sw.curve[i].second);
  }
  for (const auto& r : runs)
    if (r.r.truncated_trials) {
      std::printf("\n* runs stopped at %lld failures without finishing: that ETTR is an upper bound\n",
                  (long long)spec->max_failures_per_trial);
      break;
    }
  return 0;
}

}  // namespace myriad::cli
