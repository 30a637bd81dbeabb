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
namespace {

using json = nlohmann::json;

// ------------------------------------------------------------ read bandwidth
//
// The read loop is compiled for the best ISA of this machine (as the
// candidate kernels are): a loop limited to 16-byte SSE loads would measure
// an L1/L2 rate well below what an AVX-512 kernel reads, and the floor would
// then reject honest kernels. Eight independent vector accumulators keep the
// adds off the critical path.
typedef float V16 __attribute__((vector_size(64)));

[[gnu::always_inline]] inline void Add16(V16* acc, const float* p) {
  V16 x;
  std::memcpy(&x, p, sizeof x);
  *acc += x;
}

[[gnu::always_inline]] inline float ReadSliceBody(const float* p, int64_t n, int passes) {
  V16 a0 = {}, a1 = {}, a2 = {}, a3 = {}, a4 = {}, a5 = {}, a6 = {}, a7 = {};  // named: kept in registers
  for (int pass = 0; pass < passes; ++pass) {
    for (int64_t i = 0; i + 128 <= n; i += 128) {
      Add16(&a0, p + i), Add16(&a1, p + i + 16), Add16(&a2, p + i + 32), Add16(&a3, p + i + 48);
      Add16(&a4, p + i + 64), Add16(&a5, p + i + 80), Add16(&a6, p + i + 96), Add16(&a7, p + i + 112);
    }
  }
  V16 s = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
  float total = 0;
  for (int k = 0; k < 16; ++k) total += s[k];
  return total;
}
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,prefer-vector-width=512")]]
float ReadSliceAvx512(const float* p, int64_t n, int passes) { return ReadSliceBody(p, n, passes); }
[[gnu::target("avx2,fma")]]
float ReadSliceAvx2(const float* p, int64_t n, int passes) { return ReadSliceBody(p, n, passes); }
float ReadSliceGeneric(const float* p, int64_t n, int passes) { return ReadSliceBody(p, n, passes); }

// Read rate in GB/s of a `bytes`-sized buffer already in place (touched
// first), all threads, each its own slice: per trial the sum of the threads'
// own rates (each thread times its slice; >= 4 MB read per trial in all),
// the best of 15 trials (6 for DRAM sizes). A floor needs an upper bound on
// bandwidth, and on a shared machine the wall time of a parallel region is
// not one: with other processes runnable, waking the team costs
// milliseconds of scheduling latency (measured here: 6-17 ms per region
// under a load of 5 on 2 cores, for 12 us of reading). Threads that did not
// overlap make the sum an over-estimate, which only lowers the floor.
double MeasureReadGBs(int64_t bytes) {
  const CpuInfo& cpu = GetCpuInfo();
  float (*slice)(const float*, int64_t, int) = cpu.has_avx512_kernels() ? ReadSliceAvx512
                                               : cpu.has_avx2_kernels() ? ReadSliceAvx2
                                                                        : ReadSliceGeneric;
  const int64_t n = bytes / (int64_t)sizeof(float);
  float* buf = static_cast<float*>(std::aligned_alloc(64, (size_t)n * sizeof(float)));
  const int passes = (int)std::max<int64_t>(1, (int64_t{4} << 20) / bytes);
  volatile float sink = 0;
  double best = 0;
  const int trials = bytes > (int64_t{64} << 20) ? 6 : 15;  // DRAM-sized reads are long enough for fewer
  for (int r = 0; r <= trials; ++r) {
    float total = 0;
    double rate = 0;  // GB/s, summed over threads
#pragma omp parallel reduction(+ : total, rate)
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t per = n / nt / 128 * 128;
      float* base = buf + (int64_t)t * per;
      if (r == 0) {  // first touch on the reading thread; this trial is discarded
        for (int64_t i = 0; i < per; ++i) base[i] = (float)(i & 7);
      }
#pragma omp barrier
      auto t0 = std::chrono::steady_clock::now();
      total += slice(base, per, passes);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rate += (double)per * sizeof(float) * passes / sec * 1e-9;
    }
    sink = total;
    if (r > 0) best = std::max(best, rate);
  }
  (void)sink;
  std::free(buf);
  return best;
}

// SGEMM rate in GFLOP/s as the sum of each thread's own single-threaded rate
// (BLAS runs one thread inside a parallel region), the best of 5 trials: the
// same reasoning as MeasureReadGBs -- the wall time of a multi-threaded
// SGEMM on a shared machine includes the team's wake-up latency.
double MeasureGemmPerThreadGflops(int n) {
  const int nt = omp_get_max_threads();
  std::vector<std::vector<float>> a(nt), b(nt), c(nt);
  for (int t = 0; t < nt; ++t) {
    a[t].assign((size_t)n * n, 0.5f);
    b[t].assign((size_t)n * n, 0.25f);
    c[t].assign((size_t)n * n, 0.f);
  }
  double best = 0;
  for (int r = 0; r <= 5; ++r) {
    double rate = 0;
#pragma omp parallel num_threads(nt) reduction(+ : rate)
    {
      const int t = omp_get_thread_num();
#pragma omp barrier
      auto t0 = std::chrono::steady_clock::now();
      BlasSgemm(Trans::kNo, Trans::kNo, n, n, n, 1.f, a[t].data(), n, b[t].data(), n, 0.f, c[t].data(), n);
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      rate += 2.0 * n * n * (double)n / sec * 1e-9;
    }
    if (r > 0) best = std::max(best, rate);  // the first trial warms up
  }
  return best;
}

// Median wall time of an empty OpenMP parallel region entered after 20 ms
// of idling, when the workers have gone to sleep: the futex wake-up of the
// team, tens of microseconds on an idle machine, milliseconds when other
// processes hold the cores (their time slice must end first).
double MeasureTeamWakeSeconds() {
  std::vector<double> t;
  volatile int sink = 0;
  for (int r = 0; r < 9; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
    { sink = 1; }
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  (void)sink;
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// ------------------------------------------------------------ checking outputs

struct Check {
  bool finite = true;
  double max_error = 0;
  int64_t worst = -1;  // index of the worst (or first non-finite) element
};

Check CompareToReference(const std::vector<float>& out, const std::vector<double>& ref, double rel_floor) {
  Check c;
  if (out.size() != ref.size()) {
    c.finite = false;
    return c;
  }
  double ref_max = 0;
  for (double r : ref) ref_max = std::max(ref_max, std::fabs(r));
  const double floor = std::max(rel_floor * ref_max, std::numeric_limits<double>::min());
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) {
      c.finite = false;
      c.worst = (int64_t)i;
      c.max_error = std::numeric_limits<double>::infinity();
      return c;
    }
    double e = std::fabs((double)out[i] - ref[i]) / std::max(std::fabs(ref[i]), floor);
    if (e > c.max_error) {
      c.max_error = e;
      c.worst = (int64_t)i;
    }
  }
  return c;
}


// Why a check failed, e.g. "max rel error 3.2e-01 > 1e-05 at [17] (out 0.1, ref 0.4)".
std::string Describe(const Check& c, const std::vector<float>& out, const std::vector<double>& ref,
                     double tolerance) {
  if (out.size() != ref.size())
    return StrFormat("output has %zu elements, reference %zu", out.size(), ref.size());
  if (!c.finite) return StrFormat("non-finite output at [%lld] (%g)", (long long)c.worst, (double)out[c.worst]);
  return StrFormat("max rel error %.3g > %.3g at [%lld] (out %.9g, ref %.9g)", c.max_error, tolerance,
             (long long)c.worst, (double)out[c.worst], ref[c.worst]);
}

void Poison(std::vector<float>& out) {
  std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
}

// Runs an empty parallel region right before a timed run, so that the run
// finds the OpenMP workers spinning, as back-to-back kernels in an engine
// do, instead of asleep after the untimed poisoning and checking: a warm
// team, like warm caches. (On a loaded machine it does not help; the report
// says so, from Floors::team_wake_s.)
void WakeThreadTeam() {
  volatile int sink = 0;
#pragma omp parallel
  { sink = 1; }
  (void)sink;
}

// Runs the kernel; an exception is a failed run, described in *error.
bool RunKernel(const Kernel& k, Instance& inst, std::string* error) {
  try {
    k(inst);
    return true;
  } catch (const std::exception& e) {
    *error = std::string("threw: ") + e.what();
  } catch (...) {
    *error = "threw a non-std exception";
  }
  return false;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}


std::string FormatSeconds(double s) {
  if (s <= 0) return "-";
  if (s < 1e-6) return StrFormat("%.0f ns", s * 1e9);
  if (s < 1e-3) return StrFormat("%.2f us", s * 1e6);
  if (s < 1) return StrFormat("%.3f ms", s * 1e3);
  return StrFormat("%.3f s", s);
}

std::string FormatBytes(double b) {
  if (b >= (1 << 30)) return StrFormat("%.0fG", b / (1 << 30));
  if (b >= (1 << 20)) return StrFormat("%.0fM", b / (1 << 20));
  return StrFormat("%.0fK", b / (1 << 10));
}

}  // namespace

std::string NowIso() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// ------------------------------------------------------------ Shape

int64_t Shape::Get(std::string_view name) const {
  for (const auto& [k, v] : dims)
    if (k == name) return v;
  CHECK_MSG(false, "shape %s has no dimension '%.*s'", Key().c_str(), (int)name.size(), name.data());
  return 0;
}

std::string Shape::Key() const {
  std::string key;
  for (const auto& [k, v] : dims) {
    if (!key.empty()) key += ",";
    key += k + "=" + std::to_string(v);
  }
  return key;
}

Result<Shape> Shape::Parse(std::string_view key) {
  Shape s;
  size_t pos = 0;
  while (pos < key.size()) {
    size_t comma = key.find(',', pos);
    std::string_view part = key.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    size_t eq = part.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == part.size())
      return Status::Error("shape '" + std::string(key) + "': expected NAME=VALUE pairs separated by commas (hint: N=64,C=1000)");
    std::string name(part.substr(0, eq)), value(part.substr(eq + 1));
    char* end = nullptr;
    long long v = std::strtoll(value.c_str(), &end, 10);
    if (*end != '\0' || v < 0)
      return Status::Error("shape '" + std::string(key) + "': " + name + "=" + value + " is not a non-negative integer");
    s.dims.emplace_back(name, (int64_t)v);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  if (s.dims.empty()) return Status::Error("shape '" + std::string(key) + "' is empty (hint: N=64,C=1000)");
  return s;
}

// ------------------------------------------------------------ candidates

Result<Candidate> MakeCandidate(const Task& task, std::string name, const Params& params) {
  if (!task.build) return Status::Error("task " + task.name + " builds no candidates from parameters");
  Result<Kernel> k = task.build(params);
  if (!k.ok()) return k.status();
  return Candidate{std::move(name), params, std::move(k.value())};
}

const Candidate* FindCandidate(const Task& task, std::string_view name) {
  for (const Candidate& c : task.candidates)
    if (c.name == name) return &c;
  return nullptr;
}

// ------------------------------------------------------------ floors

double Floors::FloorSeconds(const Cost& cost) const {
  double t = 0;
  if (gemm_gflops > 0) t = std::max(t, cost.flops / (gemm_gflops * 1e9));
  if (!read_gbs.empty() && cost.bytes > 0) {
    double gbs = read_gbs.front().second;
    for (const auto& [bytes, rate] : read_gbs)
      if (bytes <= cost.bytes) gbs = rate;
    t = std::max(t, cost.bytes / (gbs * 1e9));
  }
  return t;
}

json Floors::ToJson() const {
  json bw = json::array();
  for (const auto& [bytes, rate] : read_gbs) bw.push_back({{"bytes", bytes}, {"gbs", rate}});
  return {{"gemm_gflops", gemm_gflops}, {"read_gbs", bw}, {"slack", slack}, {"team_wake_s", team_wake_s}};
}

Floors Floors::Measure() {
  Floors f;
  // The higher of the project's probe (one multi-threaded SGEMM, best of 3)
  // and the per-thread sum: a peak measured low (another process took a core)
  // would raise every floor and reject honest kernels.
  f.team_wake_s = MeasureTeamWakeSeconds();
  auto t0 = std::chrono::steady_clock::now();
  auto since = [&t0] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  f.gemm_gflops = std::max(MeasureSgemmPeakGflops(1024), MeasureGemmPerThreadGflops(768));
  LOG_DEBUG("lab floors: SGEMM %.0f GFLOP/s (%.2f s)", f.gemm_gflops, since());
  for (int64_t bytes : {int64_t{32} << 10, int64_t{256} << 10, int64_t{2} << 20, int64_t{16} << 20,
                        int64_t{256} << 20}) {
    f.read_gbs.emplace_back((double)bytes, MeasureReadGBs(bytes));
    LOG_DEBUG("lab floors: read %lld B %.1f GB/s (%.2f s)", (long long)bytes, f.read_gbs.back().second, since());
  }
  return f;
}

// ------------------------------------------------------------ reports

json Evaluation::ToJson() const {
  return {{"candidate", candidate}, {"params", params},     {"shape", shape},
          {"verified", verified},   {"max_error", max_error}, {"timed", timed},
          {"times_s", times_s},     {"median_s", median_s}, {"min_s", min_s},
          {"post_verified", post_verified}, {"floor_s", floor_s}, {"floor_ok", floor_ok},
          {"accepted", accepted},   {"reason", reason},     {"spread", spread()}};
}

const ShapeResult* TaskReport::FindShape(std::string_view key) const {
  for (const ShapeResult& s : shapes)
    if (s.shape == key) return &s;
  return nullptr;
}

const Evaluation* TaskReport::Find(std::string_view shape_key, std::string_view candidate) const {
  const ShapeResult* s = FindShape(shape_key);
  if (!s) return nullptr;
  for (const Evaluation& e : s->evals)
    if (e.candidate == candidate) return &e;
  return nullptr;
}

json TaskReport::ToJson() const {
  json out = {{"task", task}, {"baseline", baseline}, {"floors", floors.ToJson()}, {"rejected", rejected}};
  json sh = json::array();
  for (const ShapeResult& s : shapes) {
    json evals = json::array();
    for (const Evaluation& e : s.evals) evals.push_back(e.ToJson());
    sh.push_back({{"shape", s.shape},
                  {"winner", s.winner},
                  {"winner_params", s.winner_params},
                  {"winner_median_s", s.winner_median_s},
                  {"baseline_median_s", s.baseline_median_s},
                  {"speedup", s.speedup},
                  {"evals", evals}});
  }
  out["shapes"] = sh;
  return out;
}

std::string TaskReport::ToText() const {
  std::string t = StrFormat("task %s (baseline %s)\n", task.c_str(), baseline.c_str());
  if (floors.enabled()) {
    t += StrFormat("  floors: SGEMM %.0f GFLOP/s; read", floors.gemm_gflops);
    for (const auto& [bytes, rate] : floors.read_gbs) t += StrFormat(" %s %.1f GB/s", FormatBytes(bytes).c_str(), rate);
    t += StrFormat("; reject below %.2f x floor\n", floors.slack);
    t += StrFormat("  OpenMP team wake-up: %s", FormatSeconds(floors.team_wake_s).c_str());
    if (floors.machine_noisy())
      t += " -- NOISY: other processes hold the cores; parallel kernels wait milliseconds for a core, so "
           "their timings measure the machine's load more than the kernel (rerun when idle, or compare "
           "with OMP_NUM_THREADS=1)";
    t += "\n";
  } else {
    t += "  floors: off\n";
  }
  for (const ShapeResult& s : shapes) {
    t += StrFormat("\n  shape %s\n", s.shape.c_str());
    t += StrFormat("    %-22s %11s %11s %8s %11s  %s\n", "candidate", "median", "min", "speedup", "floor", "status");
    for (const Evaluation& e : s.evals) {
      std::string speed = "-";
      if (e.timed && s.baseline_median_s > 0 && e.median_s > 0)
        speed = StrFormat("%.2fx", s.baseline_median_s / e.median_s);
      std::string status = e.accepted ? (e.candidate == s.winner ? "ok, winner" : "ok") : "REJECTED: " + e.reason;
      if (e.timed && e.spread() > 1.5) status += StrFormat(" (noisy: median %.1fx min)", e.spread());
      if (e.candidate == baseline) status += " (baseline)";
      t += StrFormat("    %-22s %11s %11s %8s %11s  %s\n", e.candidate.c_str(),
               e.timed ? FormatSeconds(e.median_s).c_str() : "-", e.timed ? FormatSeconds(e.min_s).c_str() : "-",
               speed.c_str(), FormatSeconds(e.floor_s).c_str(), status.c_str());
    }
    if (s.winner.empty()) {
      t += "    no winner: every candidate was rejected\n";
    } else if (s.speedup > 0) {
      t += StrFormat("    winner %s %s: %s vs baseline %s, %.2fx\n", s.winner.c_str(), s.winner_params.dump().c_str(),
               FormatSeconds(s.winner_median_s).c_str(), FormatSeconds(s.baseline_median_s).c_str(), s.speedup);
    } else {
      t += StrFormat("    winner %s %s: %s (baseline rejected: no speedup)\n", s.winner.c_str(),
               s.winner_params.dump().c_str(), FormatSeconds(s.winner_median_s).c_str());
    }
  }
  if (!rejected.empty()) {
    t += "\n  rejected candidates:\n";
    for (const auto& [name, why] : rejected) t += StrFormat("    %s: %s\n", name.c_str(), why.c_str());
  }
  return t;
}

// ------------------------------------------------------------ RunTask

Result<TaskReport> RunTask(const Task& task, const RunOptions& options) {
  const std::vector<Shape>& shapes = options.shapes.empty() ? task.shapes : options.shapes;
  const std::string where = "lab task '" + task.name + "'";
  if (task.candidates.empty()) return Status::Error(where + ": no candidates");
  if (shapes.empty()) return Status::Error(where + ": no shapes");
  if (task.seeds.empty()) return Status::Error(where + ": no seeds");
  if (!task.make_instance || !task.reference) return Status::Error(where + ": no make_instance or reference");
  if (!task.baseline.empty() && !FindCandidate(task, task.baseline))
    return Status::Error(where + ": baseline '" + task.baseline + "' is not one of its candidates");
  if (options.reps < 1) return Status::Error(where + ": reps must be >= 1");

  std::ofstream log;
  if (!options.log_path.empty()) {
    std::filesystem::path parent = std::filesystem::path(options.log_path).parent_path();
    if (!parent.empty()) {
      Status s = Env::Default()->CreateDirs(parent.string());
      if (!s.ok()) return s;
    }
    log.open(options.log_path, std::ios::app);
    if (!log) return Status::Error(options.log_path + ": cannot open the lab log for appending");
  }

  const size_t nc = task.candidates.size(), ns = shapes.size();
  TaskReport report;
  report.task = task.name;
  report.baseline = task.baseline;
  report.floors = options.floors;
  report.shapes.resize(ns);
  for (size_t s = 0; s < ns; ++s) {
    report.shapes[s].shape = shapes[s].Key();
    for (const Candidate& c : task.candidates) {
      Evaluation e;
      e.candidate = c.name;
      e.params = c.params;
      e.shape = shapes[s].Key();
      e.verified = true;
      report.shapes[s].evals.push_back(std::move(e));
    }
  }
  // Why a candidate is out of the whole run (empty: still in).
  std::vector<std::string> out_reason(nc);

  // 1. Verify every candidate on every shape and seed, before any timing: a
  // candidate wrong on one shape (a tail) is wrong, and may win none.
  for (size_t s = 0; s < ns; ++s) {
    for (uint64_t seed : task.seeds) {
      std::unique_ptr<Instance> inst = task.make_instance(shapes[s], seed);
      const std::vector<double> ref = task.reference(*inst);
      for (size_t c = 0; c < nc; ++c) {
        Evaluation& e = report.shapes[s].evals[c];
        Poison(inst->out);
        std::string error;
        bool ran = RunKernel(task.candidates[c].kernel, *inst, &error);
        Check chk;
        if (ran) {
          chk = CompareToReference(inst->out, ref, task.rel_floor);
          e.max_error = std::max(e.max_error, chk.max_error);
          if (chk.finite && chk.max_error <= task.tolerance) continue;
          error = Describe(chk, inst->out, ref, task.tolerance);
        } else {
          e.max_error = std::numeric_limits<double>::infinity();
        }
        if (e.verified) {
          e.verified = false;
          e.reason = "verify: seed " + std::to_string(seed) + ": " + error;
        }
        if (out_reason[c].empty()) out_reason[c] = "verify: shape " + e.shape + " seed " + std::to_string(seed) + ": " + error;
      }
    }
  }

  // 2-4. Per shape: time the survivors round-robin, verify each timed run's
  // output, judge against the floor, pick the winner.
  const size_t base = task.baseline.empty() ? nc : (size_t)(FindCandidate(task, task.baseline) - task.candidates.data());
  for (size_t s = 0; s < ns; ++s) {
    ShapeResult& sr = report.shapes[s];
    std::unique_ptr<Instance> inst = task.make_instance(shapes[s], task.seeds.front());
    const std::vector<double> ref = task.reference(*inst);
    const double floor_s = task.cost ? options.floors.FloorSeconds(task.cost(shapes[s])) : 0;
    LOG_DEBUG("lab %s %s: timing %d reps", task.name.c_str(), sr.shape.c_str(), options.reps);

    std::vector<size_t> live;
    for (size_t c = 0; c < nc; ++c)
      if (out_reason[c].empty()) live.push_back(c);
    for (size_t c : live) report.shapes[s].evals[c].post_verified = true;
    for (int w = 0; w < options.warmup; ++w) {
      for (size_t c : live) {
        Poison(inst->out);
        std::string error;
        RunKernel(task.candidates[c].kernel, *inst, &error);  // a throw is caught by the timed runs
      }
    }
    auto any_noisy = [&] {
      for (size_t c : live) {
        const Evaluation& e = sr.evals[c];
        if (e.post_verified && !e.times_s.empty() &&
            Median(e.times_s) > 1.5 * *std::min_element(e.times_s.begin(), e.times_s.end()))
          return true;
      }
      return false;
    };
    for (int r = 0; r < options.reps || (r < options.max_reps && any_noisy()); ++r) {
      for (size_t c : live) {
        Evaluation& e = sr.evals[c];
        if (!e.post_verified) continue;
        Poison(inst->out);
        WakeThreadTeam();
        std::string error;
        auto t0 = std::chrono::steady_clock::now();
        bool ran = RunKernel(task.candidates[c].kernel, *inst, &error);
        double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        e.timed = true;
        e.times_s.push_back(dt);
        Check chk;
        if (ran) {
          chk = CompareToReference(inst->out, ref, task.rel_floor);
          e.max_error = std::max(e.max_error, chk.max_error);
          if (chk.finite && chk.max_error <= task.tolerance) continue;
          error = Describe(chk, inst->out, ref, task.tolerance);
        }
        e.post_verified = false;
        e.reason = "post-timing verify: timed run " + std::to_string(r + 1) + ": " + error;
        out_reason[c] = "post-timing verify: shape " + e.shape + " timed run " + std::to_string(r + 1) + ": " + error;
      }
    }
    for (size_t c = 0; c < nc; ++c) {
      Evaluation& e = sr.evals[c];
      e.floor_s = floor_s;
      if (e.timed) {
        e.median_s = Median(e.times_s);
        e.min_s = *std::min_element(e.times_s.begin(), e.times_s.end());
      }
      if (!e.verified || !e.post_verified) {
        if (e.reason.empty()) e.reason = "rejected earlier: " + out_reason[c];
        continue;
      }
      if (floor_s > 0 && e.median_s < options.floors.slack * floor_s) {
        e.floor_ok = false;
        e.reason = StrFormat("impossible timing: median %s < %.2f x floor %s (skipped work or measurement error)",
                       FormatSeconds(e.median_s).c_str(), options.floors.slack, FormatSeconds(floor_s).c_str());
        LOG_WARN("lab %s %s %s: %s", task.name.c_str(), sr.shape.c_str(), e.candidate.c_str(), e.reason.c_str());
        continue;
      }
      e.accepted = true;
      if (sr.winner.empty() || e.median_s < sr.winner_median_s) {
        sr.winner = e.candidate;
        sr.winner_params = e.params;
        sr.winner_median_s = e.median_s;
      }
    }
    if (base < nc && sr.evals[base].accepted) sr.baseline_median_s = sr.evals[base].median_s;
    if (!sr.winner.empty() && sr.baseline_median_s > 0) sr.speedup = sr.baseline_median_s / sr.winner_median_s;

    if (log.is_open()) {
      const std::string when = NowIso();
      for (const Evaluation& e : sr.evals) {
        json line = e.ToJson();
        line["task"] = task.name;
        line["time"] = when;
        line["tolerance"] = task.tolerance;
        line["floors"] = options.floors.ToJson();
        line["winner"] = (e.candidate == sr.winner);
        log << line.dump() << "\n";
      }
      log.flush();
      if (!log) return Status::Error(options.log_path + ": write to the lab log failed");
    }
  }
  for (size_t c = 0; c < nc; ++c)
    if (!out_reason[c].empty()) report.rejected[task.candidates[c].name] = out_reason[c];
  return report;
}

Status ExportTaskFolder(const Task& task, const std::string& dir) {
  Env* env = Env::Default();
  RETURN_IF_ERROR(env->CreateDirs(dir));
  const Candidate* base = FindCandidate(task, task.baseline);
  const json base_params = base ? base->params : json::object();

  std::string md = "# Kernel task: " + task.name + "\n\n" + task.description + "\n\n";
  md += "## Shapes\n\n";
  md += "Every candidate must be correct on all of these; sizes that are not a multiple of any block\n"
        "(tails) are there on purpose.\n\n";
  md += "| shape | FLOPs (floor) | bytes (floor) |\n|---|---|---|\n";
  for (const Shape& s : task.shapes) {
    Cost c = task.cost ? task.cost(s) : Cost{};
    md += StrFormat("| `%s` | %.3g | %.3g |\n", s.Key().c_str(), c.flops, c.bytes);
  }
  md += "\n## Correctness\n\n";
  md += StrFormat("A candidate runs on every shape with seeds");
  for (size_t i = 0; i < task.seeds.size(); ++i) md += (i ? ", " : " ") + std::to_string(task.seeds[i]);
  md += StrFormat(" against a scalar reference in double. Accepted: every output finite and\n"
            "max |out - ref| / max(|ref|, %.0e x max|ref|) <= **%.0e**. The output is filled with NaN before\n"
            "each run (a kernel must write all of it), and the output of every timed run is checked too.\n"
            "A median faster than %.1f x max(FLOPs / SGEMM peak, bytes / read bandwidth) of this machine is\n"
            "rejected as impossible (skipped work or a measurement error).\n",
            task.rel_floor, task.tolerance, Floors{}.slack);
  md += "\n## Parameters\n\n" + (task.param_doc.empty() ? std::string("(none documented)") : task.param_doc) + "\n";
  md += "\n## Baseline\n\n`baseline.json` (candidate `" + task.baseline + "`):\n\n```json\n" + base_params.dump() +
        "\n```\n";
  md += "\n## How to propose a candidate\n\n"
        "```\n./evaluate.sh '" + base_params.dump() + "'            # one JSON object of parameters\n"
        "./evaluate.sh '<json>' --reps 15 --shapes 'KEY;KEY'    # more runs, or only some shapes\n```\n\n"
        "It runs `myriad tune --task " + task.name + " --candidate '<json>' --json` ($MYRIAD_BIN overrides\n"
        "`myriad`) and prints one JSON verdict: `accepted` (bool) and `reason`; per shape `verified`,\n"
        "`max_error`, `median_s`, `baseline_median_s`, `speedup` (the baseline runs in the same process,\n"
        "alternating with the candidate), `floor_s`, `floor_ok`, `noisy`; and `geomean_speedup` over the\n"
        "shapes. The exit code is 0 when accepted, 1 when rejected, 2 for bad arguments. Timings on a shared\n"
        "machine vary by 10-20% between runs: compare speedups, not absolute times, and rerun a close call.\n"
        "A `warning` names shapes whose timings were noisy (median > 1.5x min); `machine_noisy` says other\n"
        "processes held the cores (waking the OpenMP team took > 1 ms): rerun those verdicts later.\n"
        "Goal: the highest geomean speedup with every shape accepted. A winner reaches engines through\n"
        "`myriad tune --task " + task.name + "`, which writes the tuned table (tuned/kernels.json).\n";

  RETURN_IF_ERROR(WriteFileAtomic(env, dir + "/README.md", md, /*sync=*/false));
  RETURN_IF_ERROR(WriteFileAtomic(env, dir + "/baseline.json", base_params.dump(2) + "\n", /*sync=*/false));
  std::string sh =
      "#!/usr/bin/env bash\n"
      "# Evaluates one candidate of the lab task '" + task.name + "' and prints the JSON verdict.\n"
      "# usage: ./evaluate.sh '<json params>' [more myriad tune options, e.g. --reps 15]\n"
      "set -euo pipefail\n"
      "if [ $# -lt 1 ]; then\n"
      "  echo \"usage: $0 '<json params>' [--reps N] [--shapes 'KEY;KEY']  (see README.md)\" >&2\n"
      "  exit 2\n"
      "fi\n"
      "params=\"$1\"\n"
      "shift\n"
      "exec \"${MYRIAD_BIN:-myriad}\" tune --task " + task.name + " --candidate \"$params\" --json \"$@\"\n";
  const std::string sh_path = dir + "/evaluate.sh";
  RETURN_IF_ERROR(WriteFileAtomic(env, sh_path, sh, /*sync=*/false));
  std::error_code ec;
  std::filesystem::permissions(sh_path,
                               std::filesystem::perms::owner_exec | std::filesystem::perms::group_exec |
                                   std::filesystem::perms::others_exec,
                               std::filesystem::perm_options::add, ec);
  if (ec) return Status::Error(sh_path + ": chmod +x: " + ec.message());
  return Status::Ok();
}

// ------------------------------------------------------------ registry

}  // namespace myriad::lab
