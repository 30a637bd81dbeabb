// The kernel lab's tuned table (task -> shape -> winner) and the task registry.
#include "lab/lab.h"
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>
#include "backend/backend.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/cpu_info.h"
#include "backend/cpu/kernel_bench.h"  // MeasureSgemmPeakGflops
#include "core/check.h"
#include "core/strings.h"
#include "core/env.h"
#include "core/log.h"

namespace myriad::lab {

using json = nlohmann::json;

// ------------------------------------------------------------ tuned table

const json* TunedTable::Entry(std::string_view task, std::string_view shape_key) const {
  auto t = json_.find(std::string(task));
  if (t == json_.end() || !t->is_object()) return nullptr;
  auto e = t->find(std::string(shape_key));
  if (e == t->end() || !e->is_object()) return nullptr;
  return &*e;
}

const json* TunedTable::Lookup(std::string_view task, std::string_view shape_key) const {
  const json* e = Entry(task, shape_key);
  if (!e) return nullptr;
  auto p = e->find("params");
  return p == e->end() ? nullptr : &*p;
}

void TunedTable::Set(const std::string& task, const std::string& shape_key, json entry) {
  json_[task][shape_key] = std::move(entry);
}

void TunedTable::Update(const TaskReport& report) {
  const std::string machine = GetCpuInfo().model_name, date = NowIso();
  for (const ShapeResult& s : report.shapes) {
    if (s.winner.empty()) continue;
    const Evaluation* w = report.Find(s.shape, s.winner);
    const Evaluation* b = report.Find(s.shape, report.baseline);
    const bool noisy = report.floors.machine_noisy() || w->spread() > 1.5 || (b && b->spread() > 1.5);
    json e = {{"candidate", s.winner},
              {"params", s.winner_params},
              {"median_s", s.winner_median_s},
              {"baseline", report.baseline},
              {"baseline_median_s", s.baseline_median_s},
              {"speedup", s.speedup > 0 ? json(s.speedup) : json(nullptr)},
              {"machine", machine},
              {"date", date},
              {"noisy", noisy}};  // timed on a loaded machine or with median > 1.5x min: retune
    Set(report.task, s.shape, std::move(e));
  }
}

Status TunedTable::Save(const std::string& path) const {
  Env* env = Env::Default();
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) RETURN_IF_ERROR(env->CreateDirs(parent.string()));
  return WriteFileAtomic(env, path, json_.dump(2) + "\n", /*sync=*/true);
}

Result<TunedTable> ParseTunedTable(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Error("tuned table: not valid JSON");
  if (!j.is_object()) return Status::Error("tuned table: expected an object {task: {shape: entry}}");
  for (const auto& [task, shapes] : j.items()) {
    if (!shapes.is_object()) return Status::Error("tuned table: task '" + task + "' is not an object of shapes");
    for (const auto& [shape, entry] : shapes.items()) {
      if (!entry.is_object() || !entry.contains("params") || !entry["params"].is_object())
        return Status::Error("tuned table: " + task + " / " + shape + " has no \"params\" object");
    }
  }
  TunedTable t;
  t.json_ = std::move(j);
  return t;
}

Result<TunedTable> LoadTunedTable(const std::string& path) {
  Result<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok()) return text.status();
  Result<TunedTable> t = ParseTunedTable(text.value());
  if (!t.ok()) return t.status().With(path);
  return t;
}

Result<std::string> InstallTunedKernelsFromDefaultPath() {
  const char* env = std::getenv("MYRIAD_TUNED_TABLE");
  std::string path = env && *env ? env : "tuned/kernels.json";
  if (!(env && *env) && !Env::Default()->FileExists(path)) return std::string();
  Result<TunedTable> t = LoadTunedTable(path);
  if (!t.ok())
    return Status::Error(std::string("the kernel lab's tuned table") +
                         (env && *env ? " ($MYRIAD_TUNED_TABLE)" : "") + ": " + t.status().message() +
                         " (hint: rerun `myriad tune`, or remove the file to use the built-in defaults)");
  InstallTunedKernels(t.value());
  return path;
}

// ------------------------------------------------------------ task folders

namespace {
struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<Task>> tasks;
};
Registry& Reg() {
  static Registry* r = new Registry;  // never destroyed: Task pointers stay valid at exit
  return *r;
}
}  // namespace

Status RegisterTask(Task task) {
  if (task.name.empty()) return Status::Error("lab: a task needs a name");
  const std::string where = "lab task '" + task.name + "'";
  if (task.candidates.empty()) return Status::Error(where + ": no candidates");
  if (task.shapes.empty()) return Status::Error(where + ": no shapes");
  if (!task.make_instance || !task.reference) return Status::Error(where + ": no make_instance or reference");
  if (!task.baseline.empty() && !FindCandidate(task, task.baseline))
    return Status::Error(where + ": baseline '" + task.baseline + "' is not one of its candidates");
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& t : r.tasks)
    if (t->name == task.name) return Status::Error(where + " is already registered");
  r.tasks.push_back(std::make_unique<Task>(std::move(task)));
  return Status::Ok();
}

const Task* FindTask(std::string_view name) {
  RegisterBuiltinTasks();
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& t : r.tasks)
    if (t->name == name) return t.get();
  return nullptr;
}

std::vector<const Task*> AllTasks() {
  RegisterBuiltinTasks();
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<const Task*> out;
  for (const auto& t : r.tasks) out.push_back(t.get());
  std::sort(out.begin(), out.end(), [](const Task* a, const Task* b) { return a->name < b->name; });
  return out;
}

}  // namespace myriad::lab
