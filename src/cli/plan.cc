// myriad plan: the cost model and the parallel planner on a job and a
// cluster description (docs/planning.md).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/plan_calibrate.h"
#include "cli/verbs.h"
#include <optional>

#include "plan/failure.h"
#include "plan/planner.h"
#include "plan/report.h"

namespace myriad::cli {

int RunPlan(int argc, char** argv) {
  CLI::App app{"Plan a training job: the parallel layout with the best estimated throughput that fits, its step "
               "time, MFU and time to train (docs/planning.md)",
               "myriad plan"};
  std::string config, cluster_preset, layout_spec, buckets, show_preset, micro_batches, interleave;
  std::vector<std::string> overrides;
  int64_t devices = 0, rounds = 10;
  int top = 5;
  bool json = false;
  plan::SearchSpace flags;  // degrees and limits given on the command line (0: from [search])
  app.add_option("-c,--config", config,
                 "plan description: [model], [job], [cluster] (configs/plan/*.toml), or a training config "
                 "(configs/*.toml, with --cluster)");
  app.add_option("--set", overrides, "override a key, e.g. --set job.seq_len=32768 (repeatable)");
  app.add_option("--cluster", cluster_preset, "cluster preset: 910b, a100, h100, cpu (instead of [cluster])");
  app.add_option("--devices", devices, "number of devices (overrides cluster.devices)")->check(CLI::PositiveNumber);
  app.add_option("--layout", layout_spec, "estimate this layout only, e.g. dp=6,tp=8,pp=64,mb=1,zero=1,rc=full,v=2");
  app.add_option("--dp", flags.dp, "fix the data-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--tp", flags.tp, "fix the tensor-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--pp", flags.pp, "fix the pipeline degree")->check(CLI::PositiveNumber);
  app.add_option("--ep", flags.ep, "fix the expert-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--cp", flags.cp, "fix the context-parallel degree")->check(CLI::PositiveNumber);
  app.add_option("--max-tp", flags.max_tp, "largest tensor-parallel degree (default: the node's size)");
  app.add_option("--min-devices", flags.min_devices,
                 "layouts may leave whole nodes idle (spares) down to this many devices in use");
  app.add_option("--micro-batches", micro_batches, "micro-batch sizes to try (default 1,2,4,8,16)");
  app.add_option("--interleave", interleave, "pipeline chunks per stage to try (default 1: Myriad's 1F1B)");
  app.add_option("--buckets", buckets,
                 "dynamic mode: sequence-length distribution LENGTH:FRACTION,... planned per bucket and "
                 "compared with the best static layout");
  app.add_option("--rounds", rounds, "dynamic mode: passes over the buckets (each re-shards every layout once)");
  app.add_option("--top", top, "runners-up to show");
  app.add_flag("--json", json, "print JSON instead of text");
  app.add_option("--show-preset", show_preset, "print a cluster preset's TOML and exit");
  CalibrateOptions cal;
  bool calibrate = false;
  std::string measure_comm;
  app.add_flag("--calibrate", calibrate,
               "measure this machine's kernels and MPI collectives, predict the step time of each of --layouts for "
               "the training config -c, run each with mpirun and compare");
  app.add_option("--layouts", cal.layouts, "calibration: layouts separated by ';'")->capture_default_str();
  app.add_option("--steps", cal.steps, "calibration: training steps per run (default 12)")->check(CLI::Range(3, 100000));
  app.add_option("--repeats", cal.rounds, "calibration: runs of every layout, interleaved (default 3)")->check(CLI::Range(1, 100));
  app.add_option("--report", cal.report, "calibration: write a JSON report here");
  app.add_option("--work-dir", cal.work_dir, "calibration: keep the runs' logs and metrics here");
  app.add_option("--measure-comm", measure_comm, "(internal) one rank of the collective benchmark, under mpirun")
      ->group("");
  CLI11_PARSE(app, argc, argv);
  if (!measure_comm.empty()) return RunMeasureComm(measure_comm, config, overrides);
  if (calibrate) {
    if (config.empty()) {
      std::fprintf(stderr, "myriad plan --calibrate: no training config (hint: -c configs/demo-moe.toml)\n");
      return 2;
    }
    cal.config = config;
    cal.overrides = overrides;
    return RunCalibrate(cal);
  }

  auto fail = [](const Status& s) {
    std::fprintf(stderr, "myriad plan: %s\n", s.message().c_str());
    return 2;
  };
  if (!show_preset.empty()) {
    const std::string t = plan::ClusterPresetToml(show_preset);
    if (t.empty()) return fail(plan::ClusterPreset(show_preset).status());
    std::fputs(t.c_str(), stdout);
    return 0;
  }
  if (config.empty()) return fail(Status::Error("no description (hint: -c configs/plan/spark-293b.toml)"));
  if (!cluster_preset.empty()) overrides.push_back("cluster.preset=\"" + cluster_preset + "\"");
  if (devices > 0) overrides.push_back("cluster.devices=" + std::to_string(devices));
  auto doc = ConfigDoc::Load(config, overrides);
  if (!doc.ok()) return fail(doc.status());
  auto cluster = plan::ReadCluster(doc->get());
  if (!cluster.ok()) return fail(cluster.status());
  // A training config ([train], no [job]: configs/*.toml) is planned as
  // Myriad trains it (plan::TrainingJob), over the knobs Myriad has: plain
  // 1F1B and no recomputation.
  const bool training_config = (*doc)->Has("train") && !(*doc)->Has("job");
  TrainConfig tc;
  auto job = training_config ? JobFromTrainDoc(doc->get(), config, &tc) : plan::ReadJob(doc->get());
  if (!job.ok()) return fail(job.status());
  auto read_space = plan::ReadSearchSpace(doc->get());
  if (!read_space.ok()) return fail(read_space.status());
  if (training_config) read_space->recompute = {plan::Recompute::kNone}, read_space->interleave = {1};
  // A [failures] section: the time to train is also given with failures
  // (ETTR from the simulator, `myriad simulate` for the details).
  std::optional<plan::FailureSpec> failures;
  if ((*doc)->Has("failures")) {
    auto f = plan::ParseFailureSpec(**doc);
    if (!f.ok()) return fail(f.status());
    failures = *f;
  }
  if (Status st = (*doc)->Finish(); !st.ok()) return fail(st);
  auto with_failures = [&](double hours) {
    if (!failures || json) return;
    plan::FailureSpec f = *failures;
    f.work_hours = hours;
    f.trials = std::min<int64_t>(f.trials, 100);
    if (!plan::ValidateFailureSpec(f).ok()) return;
    const plan::FailureResult r = plan::SimulateFailures(f);
    std::printf("failures    ETTR %.3f (%.1f failures, checkpoint every %s, %s recovery): %s to train\n", r.ettr,
                r.failures, plan::Seconds(f.ckpt_interval_seconds).c_str(), f.auto_recovery ? "automatic" : "manual",
                plan::Duration(r.wall_hours).c_str());
  };
  plan::SearchSpace space = *read_space;
  for (auto [dst, src] : {std::pair{&space.dp, flags.dp}, {&space.tp, flags.tp}, {&space.pp, flags.pp},
                          {&space.ep, flags.ep}, {&space.cp, flags.cp}, {&space.max_tp, flags.max_tp},
                          {&space.min_devices, flags.min_devices}})
    if (src > 0) *dst = src;
  if (!micro_batches.empty()) {
    auto v = plan::ParseIntList("--micro-batches", micro_batches);
    if (!v.ok()) return fail(v.status());
    space.micro_batches = *v;
  }
  if (!interleave.empty()) {
    auto v = plan::ParseIntList("--interleave", interleave);
    if (!v.ok()) return fail(v.status());
    space.interleave = *v;
  }

  const plan::ParamCounts pc = plan::CountParams(job->model);
  if (!json)
    std::printf("model       %s: %.4g params, %.4g active; %lld-token sequences, %.4g tokens per step\n"
                "cluster     %s: %lld x %s (%.4g TFLOP/s, %s)\n",
                job->model_name.c_str(), pc.total, pc.active, (long long)job->seq_len,
                (double)job->global_batch_tokens, cluster->name.c_str(), (long long)cluster->devices,
                cluster->device.name.c_str(), cluster->device.peak_flops / 1e12,
                plan::Bytes(cluster->device.memory_bytes).c_str());

  if (!layout_spec.empty()) {
    auto l = plan::ParseLayout(layout_spec);
    if (!l.ok()) return fail(l.status());
    // A layout may use fewer devices than the cluster has (whole nodes idle).
    const plan::ClusterDesc used = plan::UsingDevices(*cluster, l->devices());
    if (l->devices() > cluster->devices || l->devices() % cluster->devices_per_node())
      return fail(Status::Error("layout uses " + std::to_string(l->devices()) + " devices; the cluster has " +
                                std::to_string(cluster->devices) + " in nodes of " +
                                std::to_string(cluster->devices_per_node()) + " (hint: a multiple of the node size, at most the cluster)"));
    if (Status st = plan::CheckLayout(*job, used, *l); !st.ok()) return fail(st);
    const plan::StepEstimate e = plan::Estimate(*job, used, *l);
    if (json) std::printf("%s\n", plan::EstimateJson(*job, used, *l, e).dump(2).c_str());
    else std::fputs(plan::FormatEstimate(*job, used, *l, e).c_str(), stdout);
    return e.feasible ? 0 : 1;
  }
  if (!buckets.empty()) {
    auto b = plan::ParseBuckets(buckets);
    if (!b.ok()) return fail(b.status());
    if (!json) std::fprintf(stderr, "planning %zu length buckets...\n", b->size());
    const plan::DynamicPlan p = plan::PlanDynamic(*job, *cluster, space, *b, rounds);
    if (json) std::printf("%s\n", plan::DynamicJson(*job, *cluster, p).dump(2).c_str());
    else std::fputs(plan::FormatDynamic(*job, *cluster, p).c_str(), stdout);
    if (p.found) {
      std::printf("static:  ");
      std::fflush(stdout);
      with_failures(p.static_hours);
      std::printf("dynamic: ");
      std::fflush(stdout);
      with_failures(p.dynamic_hours);
    }
    return p.found ? 0 : 1;
  }
  const plan::PlanResult r = plan::FindBest(*job, *cluster, space, top);
  if (json) {
    nlohmann::json j;
    j["found"] = r.found;
    j["layouts"] = r.layouts;
    j["evaluated"] = r.evaluated;
    if (r.found) {
      j["best"] = plan::EstimateJson(*job, *cluster, r.layout, r.est);
      for (const auto& [l, e] : r.runners_up) j["runners_up"].push_back(plan::EstimateJson(*job, *cluster, l, e));
    } else {
      j["why"] = r.why;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else if (!r.found) {
    std::fprintf(stderr, "myriad plan: no feasible layout among %lld (hint: more devices, a smaller micro-batch "
                 "or model, or --min-devices): closest: %s\n", (long long)r.layouts, r.why.c_str());
  } else {
    std::fputs(plan::FormatPlan(*job, *cluster, r).c_str(), stdout);
    with_failures(job->train_tokens / r.est.tokens_per_s / 3600);
  }
  return r.found ? 0 : 1;
}

}  // namespace myriad::cli
