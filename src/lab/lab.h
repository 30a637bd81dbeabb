// The kernel lab: verify, time and tune kernels in a loop.
//
// A Task is one kernel problem (e.g. a row softmax): a scalar reference in
// double, candidate kernels (each built from a JSON object of parameters such
// as {"block": 64, "two_pass": true}), the shapes to tune for (tails included:
// sizes that are not multiples of any block), a tolerance and a cost model.
// RunTask then, for every candidate:
//   1. verifies it against the reference on every shape and every seed (the
//      output is poisoned with NaN before each run, so a kernel that skips
//      work cannot pass on what an earlier run left); any error above the
//      tolerance or any non-finite output rejects the candidate;
//   2. times it per shape: warm-up runs, then `reps` timed runs, candidates
//      alternating round-robin (A B C A B C ...) so drift hits all alike,
//      the OpenMP team woken just before each (as back-to-back kernels in an
//      engine find it); median and min, more rounds while noisy (max_reps);
//   3. verifies the output of every timed run too (poisoned before each);
//   4. checks each median against the floor max(flops / peak, bytes /
//      bandwidth) of this machine (Floors, measured once per run); a median
//      under 0.9 x floor is impossible (a kernel that skipped work, or a
//      measurement error): that timing is rejected and logged.
// The fastest surviving candidate per shape is the winner; winners go into a
// TunedTable (a JSON file engines load at run time) and every evaluation is
// appended to a JSON-lines log.
//
// `myriad tune` (tune_cli.cc) drives this; ExportTaskFolder writes a folder an
// outside optimiser (a person, or a model making tool calls) works from:
// propose parameters, run evaluate.sh, read the verdict.
//
// Threads: RunTask takes the machine (its kernels use OpenMP); call it from
// one thread at a time. The registry is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace myriad::lab {

// A candidate's parameters: a JSON object, e.g. {"block": 64, "two_pass": true}.
using Params = nlohmann::json;

// A problem size: named dimensions in a fixed order, e.g. N=64, C=1000.
struct Shape {
  std::vector<std::pair<std::string, int64_t>> dims;

  // The value of dimension `name`; CHECK-fails if the shape has none.
  int64_t Get(std::string_view name) const;
  // "N=64,C=1000": the shape's key in the tuned table and the log.
  std::string Key() const;
  // Inverse of Key(): "N=64,C=1000" -> {{"N",64},{"C",1000}}.
  static Result<Shape> Parse(std::string_view key);
};

// The work a kernel cannot avoid on one shape: floating-point operations and
// bytes that must cross the memory hierarchy (inputs read once, outputs
// written once). The floor on its time is max(flops / peak, bytes / bw).
struct Cost {
  double flops = 0;
  double bytes = 0;
};

// One problem instance: the inputs for one (shape, seed), held by a task's
// subclass, and the output every kernel writes in full. The lab fills `out`
// with NaN before each run and compares it with the reference afterwards.
class Instance {
 public:
  virtual ~Instance() = default;
  Shape shape;
  uint64_t seed = 0;
  std::vector<float> out;
};

// A kernel: reads the instance's inputs, writes all of instance.out.
using Kernel = std::function<void(Instance&)>;

struct Candidate {
  std::string name;  // unique within the task, e.g. "b64_online"
  Params params;     // what the tuned table records for a winner
  Kernel kernel;
};

struct Task {
  std::string name;         // "softmax_rows"
  std::string description;  // one paragraph: the math, the layout, what is tuned
  std::string param_doc;    // the parameters and their allowed values (README.md)
  // Builds the inputs for (shape, seed), with `out` sized (contents ignored).
  std::function<std::unique_ptr<Instance>(const Shape&, uint64_t seed)> make_instance;
  // The expected output for an instance, computed in double, same length as out.
  std::function<std::vector<double>(const Instance&)> reference;
  // Builds a kernel from parameters (what `myriad tune --candidate` uses);
  // an error names the bad parameter. May be empty for a task whose
  // candidates are fixed.
  std::function<Result<Kernel>(const Params&)> build;
  std::vector<Candidate> candidates;
  std::string baseline;  // name of a candidate: what speedups are relative to
  std::vector<Shape> shapes;
  std::vector<uint64_t> seeds = {1, 2, 3};
  // Largest accepted max_i |out_i - ref_i| / max(|ref_i|, rel_floor * max_j |ref_j|):
  // relative error per element, with elements far below the largest judged
  // against rel_floor of the largest (so a 1e-30 vs 0 is not an error).
  double tolerance = 1e-5;
  double rel_floor = 1e-3;
  std::function<Cost(const Shape&)> cost;
};

// Builds a candidate from parameters through task.build.
Result<Candidate> MakeCandidate(const Task& task, std::string name, const Params& params);
// The baseline candidate, or null when task.baseline names none.
const Candidate* FindCandidate(const Task& task, std::string_view name);

// ---------------------------------------------------------------- floors

// This machine's limits, measured once per run.
struct Floors {
  double gemm_gflops = 0;  // SGEMM peak (MeasureSgemmPeakGflops); <= 0: no flop floor
  // Streaming read bandwidth by working-set size: (bytes, GB/s), ascending
  // bytes. A working set of W bytes is judged against the rate measured at
  // the largest size <= W (the smallest size when W is below them all):
  // smaller sets read faster, so this over-estimates W's bandwidth and the
  // floor stays a true lower bound for data already in cache.
  std::vector<std::pair<double, double>> read_gbs;
  double slack = 0.9;  // a median below slack x floor is impossible
  // Not a floor: the median time to wake a sleeping OpenMP team (an empty
  // parallel region after 20 ms idle). Tens of microseconds on an idle
  // machine; above 1 ms other processes hold the cores, and the report says
  // that the timings of parallel kernels are noise.
  double team_wake_s = 0;
  bool machine_noisy() const { return team_wake_s > 1e-3; }

  bool enabled() const { return gemm_gflops > 0 || !read_gbs.empty(); }
  // max(flops / peak, bytes / bandwidth(bytes)) in seconds; 0 when disabled.
  double FloorSeconds(const Cost& cost) const;
  nlohmann::json ToJson() const;

  // Measures the SGEMM peak (the higher of MeasureSgemmPeakGflops(1024) and
  // the sum of per-thread single-threaded SGEMM rates) and streaming reads of
  // 32 KiB, 256 KiB, 2 MiB, 16 MiB and 256 MiB on all threads (per-thread
  // rates summed, best of 15 short trials each, the loop compiled for this
  // CPU's widest vectors). Rates are timed inside each thread because on a
  // shared machine a parallel region's wall time includes milliseconds of
  // scheduling latency; the estimates err high, so floors err low. ~1 s.
  static Floors Measure();
  // No floor check (tests that must isolate another check).
  static Floors None() { return Floors{}; }
};

// ---------------------------------------------------------------- running

struct RunOptions {
  int warmup = 2;
  int reps = 7;
  // Up to this many rounds in all while a live candidate's timings on the
  // shape are noisy (median > 1.5 x min): bursts of load from other
  // processes then weigh less in the medians. <= reps: exactly reps rounds.
  int max_reps = 0;
  Floors floors;               // Floors::None(): no floor check
  std::vector<Shape> shapes;   // empty: the task's
  std::string log_path;        // empty: no log; else one JSON line per evaluation, appended
};

// One candidate on one shape.
struct Evaluation {
  std::string candidate;
  Params params;
  std::string shape;             // Shape::Key()
  bool verified = false;         // on every seed, before timing
  double max_error = 0;          // worst over the seeds (and timed runs)
  bool timed = false;
  std::vector<double> times_s;   // the timed runs, in order
  double median_s = 0, min_s = 0;
  bool post_verified = false;    // the output of every timed run matched
  double floor_s = 0;            // 0: no floor
  bool floor_ok = true;
  bool accepted = false;         // may win this shape
  std::string reason;            // why not, when !accepted

  // median / min: near 1 on a quiet machine; well above (the report flags
  // > 1.5) when other processes slowed most runs -- rerun, or add --reps.
  double spread() const { return min_s > 0 ? median_s / min_s : 0; }
  nlohmann::json ToJson() const;
};

struct ShapeResult {
  std::string shape;
  std::vector<Evaluation> evals;  // in candidate order
  std::string winner;             // empty when every candidate was rejected
  Params winner_params;
  double winner_median_s = 0;
  double baseline_median_s = 0;   // 0 when the baseline was rejected
  double speedup = 0;             // baseline / winner medians; 0 when unknown
};

struct TaskReport {
  std::string task;
  std::string baseline;
  Floors floors;
  std::vector<ShapeResult> shapes;
  // Candidates rejected outright (by verification before or after timing): name -> why.
  std::map<std::string, std::string> rejected;

  const ShapeResult* FindShape(std::string_view key) const;
  const Evaluation* Find(std::string_view shape_key, std::string_view candidate) const;
  nlohmann::json ToJson() const;
  // Per shape: every candidate's median, min and ratio to the baseline, the
  // winner and its speedup; then the rejected candidates and why.
  std::string ToText() const;
};

// Verifies, times and judges every candidate of `task` (see the top of this
// file). Errors: a task without candidates, shapes, seeds or reference; an
// unknown baseline; a log file that cannot be opened.
Result<TaskReport> RunTask(const Task& task, const RunOptions& options);

// ---------------------------------------------------------------- tuned table

// task -> shape key -> {"candidate", "params", "median_s", "baseline",
// "baseline_median_s", "speedup", "machine", "date", "noisy"}; "noisy":
// timed while other processes held the cores (Floors::machine_noisy) or
// with the winner's or baseline's median > 1.5x its min -- worth retuning.
class TunedTable {
 public:
  // The winning parameters for (task, shape key), or null.
  const nlohmann::json* Lookup(std::string_view task, std::string_view shape_key) const;
  // The whole entry for (task, shape key), or null.
  const nlohmann::json* Entry(std::string_view task, std::string_view shape_key) const;
  // Records every shape of the report that has a winner (replacing older entries).
  void Update(const TaskReport& report);
  void Set(const std::string& task, const std::string& shape_key, nlohmann::json entry);
  const nlohmann::json& root() const { return json_; }  // the whole table
  // Writes atomically (path.tmp + rename), creating the parent folder.
  Status Save(const std::string& path) const;

 private:
  friend Result<TunedTable> LoadTunedTable(const std::string& path);
  friend Result<TunedTable> ParseTunedTable(std::string_view text);
  nlohmann::json json_ = nlohmann::json::object();
};

// Reads a table written by TunedTable::Save. Errors name the path: missing
// file, bad JSON, or an entry without "params".
Result<TunedTable> LoadTunedTable(const std::string& path);
Result<TunedTable> ParseTunedTable(std::string_view text);

// ---------------------------------------------------------------- task folders

// Writes dir/README.md (description, shapes, tolerance, parameters, how to
// propose a candidate), dir/baseline.json (the baseline's parameters) and
// dir/evaluate.sh (runs `myriad tune --task NAME --candidate '<json>' --json`
// and prints the verdict; $MYRIAD_BIN overrides the binary). Creates dir.
Status ExportTaskFolder(const Task& task, const std::string& dir);

// ---------------------------------------------------------------- registry

// Adds a task; an error if the name is taken or the task has no name,
// candidates, shapes or reference. Tasks live until the process exits.
// A task from another file: add its Make...Task() to RegisterBuiltinTasks()
// (tasks.cc), or call RegisterTask before FindTask/AllTasks. A static
// registrar object in a file nothing else references would be dropped by the
// static-library link and never run.
Status RegisterTask(Task task);
// The task called `name`, or null. The built-in tasks (tasks.cc) are
// registered on the first call to FindTask or AllTasks.
const Task* FindTask(std::string_view name);
// Every task, by name.
std::vector<const Task*> AllTasks();

// ---------------------------------------------------------------- tasks

// softmax_rows: y[n, :] = softmax(x[n, :]) over [N, C] fp32 rows; candidates
// {"block": 8|16|32|64, "two_pass": bool}, OpenMP over rows (tasks.cc).
// Its instances are SoftmaxRowsInstance (out is [N, C] too).
class SoftmaxRowsInstance : public Instance {
 public:
  int64_t N = 0, C = 0;
  std::vector<float> x;  // [N, C]
};
Task MakeSoftmaxRowsTask();
Result<Kernel> BuildSoftmaxRowsKernel(const Params& params);

// sparse_attention: the schedule of cpu::dsa::SparseAttention (forward,
// prefill): candidates {"q_block": 1} (the row kernel, the baseline),
// {"dense_tile": 128|512} (masked dense) and {"q_block": 64|256|512,
// "key_chunk": 128|256|512|1024} (the blocked kernel); shapes T, H, Hkv, D,
// K (sparse_attention_task.cc).
std::optional<Task> MakeSparseAttentionTask();
Result<Kernel> BuildSparseAttentionKernel(const Params& params);

// Hands the table's winners to the kernels that read them at run time: the
// sparse_attention entries become cpu::dsa's schedule lookup (same H, Hkv,
// D, K; nearest T within a factor of 2). A table without entries removes the lookup.
void InstallTunedKernels(const TunedTable& table);
// Loads and installs the tuned table an engine process should use:
// $MYRIAD_TUNED_TABLE when set (an error if it cannot be read), else
// tuned/kernels.json when it exists; returns the path used (empty: none).
Result<std::string> InstallTunedKernelsFromDefaultPath();

// Registers the built-in tasks (idempotent; FindTask/AllTasks call it).
void RegisterBuiltinTasks();

// ---------------------------------------------------------------- CLI

// `myriad tune [--task NAME | --all | --list] [--shapes "N=64,C=100;N=64,C=4097"]
// [--reps 7] [--warmup 2] [--table FILE] [--log FILE] [--candidate JSON]
// [--json] [--export-folder DIR] [--no-floors]`; argv[0] is the verb.
// Tuning measures the floors, runs each task (up to 3 x reps rounds on noisy
// shapes), prints the report (text, or one JSON object per task with --json)
// and merges the winners into the table (default tuned/kernels.json; a
// corrupt table is reported, not overwritten). --candidate evaluates one
// proposal against the baseline and prints the verdict; --export-folder
// writes task folders. Returns the exit code: 0 ok; 1 a failed run or a
// rejected candidate; 2 bad arguments.
int RunTuneCli(int argc, char** argv);

// The current time, UTC, ISO 8601 ("2026-11-30T10:48:21Z"): the tuned table's dates.
std::string NowIso();

}  // namespace myriad::lab
