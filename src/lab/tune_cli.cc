// myriad tune [--task NAME | --all] [--shapes KEYS] [--reps 7] [--warmup 2]
//             [--table tuned/kernels.json] [--log FILE] [--candidate JSON] [--json]
//             [--export-folder DIR] [--no-floors] [--list]
// The verb's body; src/cli wires `myriad tune` to RunTuneCli.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/env.h"
#include "lab/lab.h"

namespace myriad::lab {
namespace {

using json = nlohmann::json;

Result<std::vector<Shape>> ParseShapes(const std::string& arg) {
  std::vector<Shape> shapes;
  size_t pos = 0;
  while (pos <= arg.size()) {
    size_t semi = arg.find(';', pos);
    std::string part = arg.substr(pos, semi == std::string::npos ? std::string::npos : semi - pos);
    if (!part.empty()) {
      Result<Shape> s = Shape::Parse(part);
      if (!s.ok()) return s.status().With("--shapes");
      shapes.push_back(std::move(s.value()));
    }
    if (semi == std::string::npos) break;
    pos = semi + 1;
  }
  if (shapes.empty() && !arg.empty()) return Status::Error("--shapes: no shape in '" + arg + "'");
  return shapes;
}

std::string TaskNames() {
  std::string names;
  for (const Task* t : AllTasks()) names += (names.empty() ? "" : ", ") + t->name;
  return names;
}

// The verdict on one proposed candidate, from a run of {baseline, proposed}.
json Verdict(const Task& task, const Params& params, const TaskReport& report) {
  constexpr const char* kName = "proposed";
  json v = {{"task", task.name}, {"candidate", params}, {"baseline", task.baseline},
            {"floors", report.floors.ToJson()}};
  if (const Candidate* b = FindCandidate(task, task.baseline)) v["baseline_params"] = b->params;
  bool accepted = true;
  std::string reason;
  double log_sum = 0;
  int n_speedups = 0;
  json shapes = json::array();
  std::vector<std::string> noisy_shapes;
  for (const ShapeResult& s : report.shapes) {
    const Evaluation* e = report.Find(s.shape, kName);
    const Evaluation* b = report.Find(s.shape, task.baseline);
    json j = {{"shape", s.shape},         {"verified", e->verified},   {"max_error", e->max_error},
              {"post_verified", e->post_verified}, {"median_s", e->median_s}, {"min_s", e->min_s},
              {"floor_s", e->floor_s},    {"floor_ok", e->floor_ok},   {"accepted", e->accepted},
              {"reason", e->reason},      {"spread", e->spread()}};
    double base_median = b && b->timed ? b->median_s : 0;
    j["baseline_median_s"] = base_median;
    if (e->accepted && base_median > 0 && e->median_s > 0) {
      double sp = base_median / e->median_s;
      j["speedup"] = sp;
      log_sum += std::log(sp);
      ++n_speedups;
    } else {
      j["speedup"] = nullptr;
    }
    const bool noisy = e->spread() > 1.5 || (b && b->spread() > 1.5);
    j["noisy"] = noisy;
    if (noisy) noisy_shapes.push_back(s.shape);
    if (!e->accepted && accepted) {
      accepted = false;
      reason = "shape " + s.shape + ": " + e->reason;
    }
    shapes.push_back(std::move(j));
  }
  auto rej = report.rejected.find(kName);
  if (rej != report.rejected.end()) reason = rej->second;
  v["accepted"] = accepted;
  v["reason"] = reason;
  v["shapes"] = shapes;
  v["geomean_speedup"] = accepted && n_speedups > 0 ? json(std::exp(log_sum / n_speedups)) : json(nullptr);
  // Other processes hold the cores: parallel kernels' timings are mostly
  // scheduling latency (the speedups are not to be trusted; rerun later).
  v["machine_noisy"] = report.floors.machine_noisy();
  if (!noisy_shapes.empty()) {
    std::string list;
    for (const std::string& k : noisy_shapes) list += (list.empty() ? "" : "; ") + k;
    v["warning"] = "noisy timings (median > 1.5x min) on " + list +
                   ": those speedups are unreliable; rerun, or pass a larger --reps";
  }
  return v;
}

int EvaluateCandidate(const Task& task, const std::string& candidate_json, const RunOptions& options,
                      bool as_json) {
  json params = json::parse(candidate_json, nullptr, /*allow_exceptions=*/false);
  auto reject = [&](const std::string& why) {
    json v = {{"task", task.name}, {"candidate", params.is_discarded() ? json(candidate_json) : params},
              {"accepted", false}, {"reason", why}, {"shapes", json::array()}, {"geomean_speedup", nullptr}};
    if (as_json)
      std::printf("%s\n", v.dump().c_str());
    else
      std::printf("candidate rejected: %s\n", why.c_str());
    return 1;
  };
  if (params.is_discarded()) return reject("invalid parameters: '" + candidate_json + "' is not valid JSON");
  Result<Candidate> c = MakeCandidate(task, "proposed", params);
  if (!c.ok()) return reject("invalid parameters: " + c.status().message());

  Task run = task;  // the baseline and the proposal, alternating
  run.candidates.clear();
  if (const Candidate* b = FindCandidate(task, task.baseline)) run.candidates.push_back(*b);
  run.candidates.push_back(std::move(c.value()));
  Result<TaskReport> report = RunTask(run, options);
  if (!report.ok()) {
    std::fprintf(stderr, "myriad tune: %s\n", report.status().message().c_str());
    return 1;
  }
  json v = Verdict(run, params, report.value());
  if (as_json) {
    std::printf("%s\n", v.dump().c_str());
  } else {
    std::printf("%s\n", report->ToText().c_str());
    if (v.contains("warning")) std::printf("warning: %s\n", v["warning"].get<std::string>().c_str());
    if (v["accepted"].get<bool>())
      std::printf("candidate %s accepted: geomean speedup %.3fx over %s\n", params.dump().c_str(),
                  v["geomean_speedup"].is_number() ? v["geomean_speedup"].get<double>() : 0.0,
                  task.baseline.c_str());
    else
      std::printf("candidate %s rejected: %s\n", params.dump().c_str(), v["reason"].get<std::string>().c_str());
  }
  std::fflush(stdout);
  return v["accepted"].get<bool>() ? 0 : 1;
}

}  // namespace

int RunTuneCli(int argc, char** argv) {
  CLI::App app{"The kernel lab: verify every candidate kernel of a task against its reference, time them "
               "side by side, reject impossible timings, and record the winner per shape in the tuned table",
               "myriad tune"};
  std::string task_name, shapes_arg, table_path = "tuned/kernels.json", log_path, candidate, export_dir;
  bool all = false, as_json = false, no_floors = false, list = false;
  int reps = 7, warmup = 2;
  app.add_option("--task,-t", task_name, "the task to tune (see --list)");
  app.add_flag("--all", all, "tune every registered task");
  app.add_flag("--list", list, "list the tasks and exit");
  app.add_option("--shapes", shapes_arg, "only these shapes, ';'-separated keys: \"N=64,C=100;N=64,C=4097\"");
  app.add_option("--reps", reps, "timed runs per candidate and shape (median reported)")->check(CLI::Range(1, 100000));
  app.add_option("--warmup", warmup, "untimed runs per candidate and shape before timing")->check(CLI::Range(0, 1000));
  app.add_option("--table", table_path, "tuned table to update (JSON: task -> shape -> winner)");
  app.add_option("--log", log_path, "append one JSON line per candidate evaluation to FILE");
  app.add_option("--candidate", candidate,
                 "evaluate one proposal, a JSON object of parameters, against the baseline (the table is not "
                 "written)");
  app.add_flag("--json", as_json, "print JSON instead of the text report (with --candidate: the verdict)");
  app.add_option("--export-folder", export_dir,
                 "write README.md, baseline.json and evaluate.sh for an outside optimiser into DIR (DIR/NAME "
                 "with --all) and exit");
  app.add_flag("--no-floors", no_floors, "skip measuring this machine's floors (no impossible-timing check)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  if (list) {
    for (const Task* t : AllTasks())
      std::printf("%-20s %zu candidates, %zu shapes, baseline %s\n", t->name.c_str(), t->candidates.size(),
                  t->shapes.size(), t->baseline.c_str());
    return 0;
  }
  if (all == !task_name.empty()) {
    std::fprintf(stderr, "myriad tune: give exactly one of --task NAME or --all (tasks: %s)\n", TaskNames().c_str());
    return 2;
  }
  std::vector<const Task*> tasks;
  if (all) {
    tasks = AllTasks();
  } else {
    const Task* t = FindTask(task_name);
    if (!t) {
      std::fprintf(stderr, "myriad tune: no task '%s' (hint: one of %s)\n", task_name.c_str(), TaskNames().c_str());
      return 2;
    }
    tasks.push_back(t);
  }
  if (!candidate.empty() && tasks.size() != 1) {
    std::fprintf(stderr, "myriad tune: --candidate needs one --task\n");
    return 2;
  }

  if (!export_dir.empty()) {
    for (const Task* t : tasks) {
      const std::string dir = all ? export_dir + "/" + t->name : export_dir;
      Status s = ExportTaskFolder(*t, dir);
      if (!s.ok()) {
        std::fprintf(stderr, "myriad tune: %s\n", s.message().c_str());
        return 1;
      }
      std::printf("wrote %s/README.md, %s/baseline.json, %s/evaluate.sh\n", dir.c_str(), dir.c_str(), dir.c_str());
    }
    return 0;
  }

  RunOptions options;
  options.reps = reps;
  options.max_reps = 3 * reps;
  options.warmup = warmup;
  options.log_path = log_path;
  if (!shapes_arg.empty()) {
    Result<std::vector<Shape>> shapes = ParseShapes(shapes_arg);
    if (!shapes.ok()) {
      std::fprintf(stderr, "myriad tune: %s\n", shapes.status().message().c_str());
      return 2;
    }
    options.shapes = std::move(shapes.value());
  }
  if (!no_floors) {
    if (!as_json) std::fprintf(stderr, "myriad tune: measuring this machine's floors (SGEMM peak, read bandwidth)...\n");
    options.floors = Floors::Measure();
  }

  if (!candidate.empty()) return EvaluateCandidate(*tasks.front(), candidate, options, as_json);

  // Load the table first: a corrupt one is reported, never overwritten.
  TunedTable table;
  if (Env::Default()->FileExists(table_path)) {
    Result<TunedTable> loaded = LoadTunedTable(table_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "myriad tune: %s (not overwritten; hint: move it away or pass --table)\n",
                   loaded.status().message().c_str());
      return 1;
    }
    table = std::move(loaded.value());
  }
  int rc = 0;
  size_t updated = 0;
  for (const Task* t : tasks) {
    if (!as_json) std::fprintf(stderr, "myriad tune: %s: %zu candidates x %zu shapes...\n", t->name.c_str(),
                               t->candidates.size(), options.shapes.empty() ? t->shapes.size() : options.shapes.size());
    Result<TaskReport> report = RunTask(*t, options);
    if (!report.ok()) {
      std::fprintf(stderr, "myriad tune: %s\n", report.status().message().c_str());
      rc = 1;
      continue;
    }
    if (as_json)
      std::printf("%s\n", report->ToJson().dump().c_str());
    else
      std::printf("%s\n", report->ToText().c_str());
    std::fflush(stdout);
    table.Update(report.value());
    for (const ShapeResult& s : report->shapes) updated += !s.winner.empty();
  }
  Status s = table.Save(table_path);
  if (!s.ok()) {
    std::fprintf(stderr, "myriad tune: %s\n", s.message().c_str());
    return 1;
  }
  if (!as_json) std::printf("tuned table %s: %zu shape(s) updated\n", table_path.c_str(), updated);
  return rc;
}

}  // namespace myriad::lab
