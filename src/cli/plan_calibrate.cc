// myriad plan --calibrate: measure this machine's kernels (in process) and
// MPI collectives (`mpirun ... myriad plan --measure-comm`), predict the
// step time of Myriad's own training for several layouts with the cost
// model, then run each layout with mpirun and compare (docs/planning.md).
#include "cli/plan_calibrate.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/timing.h"
#include "model/config.h"
#include "ops/ops.h"
#include "plan/report.h"
#include "train/comm/world.h"
#include "train/train_config.h"

namespace myriad::cli {
namespace {

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "myriad";
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Median of the logged step times after the first (warm-up) line.
Result<double> MedianStepSeconds(const std::string& metrics) {
  std::ifstream in(metrics);
  if (!in) return Status::Error(metrics + ": no metrics (the run failed?)");
  std::vector<double> v;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("step_s")) v.push_back(j["step_s"].get<double>());
  }
  if (v.size() < 2) return Status::Error(metrics + ": fewer than 2 logged steps (hint: more --steps)");
  v.erase(v.begin());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The router's load from a run's last logged step: per MoE layer, the
// tokens each expert received ("expert_load", summed over the ranks).
std::vector<std::vector<double>> ExpertLoad(const std::string& metrics) {
  std::ifstream in(metrics);
  std::vector<std::vector<double>> load;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("expert_load")) load = j["expert_load"].get<std::vector<std::vector<double>>>();
  }
  return load;
}

}  // namespace

Result<plan::JobDesc> JobFromTrainDoc(ConfigDoc* doc, const std::string& name, TrainConfig* tc) {
  const ModelConfig m = ModelConfig::Read(doc);
  *tc = TrainConfig::Read(doc);
  RETURN_IF_ERROR(m.Validate().With(name));
  RETURN_IF_ERROR(tc->Validate().With(name));
  plan::JobDesc j = plan::TrainingJob(m, tc->seq_len, tc->batch_size * tc->grad_accum, name);
  j.train_tokens = static_cast<double>(tc->steps) * static_cast<double>(j.global_batch_tokens);
  return j;
}

Result<plan::JobDesc> JobFromTrainConfig(const std::string& path, const std::vector<std::string>& overrides,
                                         TrainConfig* tc) {
  ASSIGN_OR_RETURN(auto doc, ConfigDoc::Load(path, overrides));
  ASSIGN_OR_RETURN(plan::JobDesc j, JobFromTrainDoc(doc.get(), path, tc));
  RETURN_IF_ERROR(doc->Finish());
  return j;
}

int RunMeasureComm(const std::string& out, const std::string& config, const std::vector<std::string>& overrides) {
  auto world = comm::InitWorld(nullptr, nullptr);
  const int R = world->size(), r = world->rank();
  // The kernels again, every rank at once: what a device does while the
  // others share the machine with it (memory, caches, the host's cores).
  plan::Calibration together;
  if (!config.empty()) {
    TrainConfig tc;
    auto job = JobFromTrainConfig(config, overrides, &tc);
    if (!job.ok()) {
      std::fprintf(stderr, "myriad plan --measure-comm: %s\n", job.status().message().c_str());
      return 2;
    }
    world->Barrier();
    plan::MeasureKernels(*job, tc.batch_size * tc.seq_len, &together);
    // A synchronous job runs at its slowest rank's pace: keep the slowest
    // rank's figures (cores of a shared or virtual machine are not equal).
    for (double* v : {&together.gemm_flops, &together.attention_flops, &together.memory_bw, &together.page_touch_bw}) {
      *v = -*v;
      world->AllReduce(v, 1, comm::DType::kF64, comm::ReduceOp::kMax);
      *v = -*v;
    }
    world->AllReduce(&together.gemm_overhead_s, 1, comm::DType::kF64, comm::ReduceOp::kMax);
  }
  std::vector<plan::CommSample> samples;
  for (int64_t floats : {int64_t{1} << 10, int64_t{1} << 14, int64_t{1} << 17, int64_t{1} << 20, int64_t{1} << 22}) {
    std::vector<float> a(floats, 1.f), b(floats);
    const double bytes = static_cast<double>(floats) * sizeof(float);
    const int reps = floats >= (1 << 20) ? 5 : 20;
    auto timed = [&](const char* op, auto&& fn) {
      world->Barrier();
      double t = BestSeconds(reps, [&] {
        world->Barrier();
        fn();
      });
      world->AllReduce(&t, 1, comm::DType::kF64, comm::ReduceOp::kMax);
      samples.push_back({op, bytes, t});
    };
    timed("allreduce", [&] { world->AllReduce(a.data(), floats, comm::DType::kF32, comm::ReduceOp::kSum); });
    timed("allgather", [&] { world->AllGather(a.data(), b.data(), floats / R, comm::DType::kF32); });
    std::vector<int64_t> counts(R, floats / R), displs(R);
    for (int i = 0; i < R; ++i) displs[i] = i * (floats / R);
    timed("alltoall", [&] {
      world->AllToAllV(a.data(), counts.data(), displs.data(), b.data(), counts.data(), displs.data(), comm::DType::kF32);
    });
    if (R >= 2) {
      timed("sendrecv", [&] {  // one way: 0 -> 1 and back, halved below
        if (r == 0) world->Send(a.data(), floats, comm::DType::kF32, 1, 7), world->Recv(b.data(), floats, comm::DType::kF32, 1, 8);
        if (r == 1) world->Recv(b.data(), floats, comm::DType::kF32, 0, 7), world->Send(a.data(), floats, comm::DType::kF32, 0, 8);
      });
      samples.back().seconds /= 2;
    }
  }
  // A collective between compute, as training runs them: each rank
  // alternates a ~1 ms GEMM with a one-float all-reduce; the loop's time
  // minus the GEMMs' alone is what a synchronisation costs in place.
  {
    const int64_t n = 320;
    std::vector<float> A(n * n, 0.5f), B(n * n, 0.25f), Cm(n * n);
    auto gemm = [&] { ops::Gemm(Trans::kNo, Trans::kNo, n, n, n, 1.f, A.data(), n, B.data(), n, 0.f, Cm.data(), n); };
    const int iters = 40;
    world->Barrier();
    const double alone = BestSeconds(3, [&] {
      for (int i = 0; i < iters; ++i) gemm();
    });
    float one = 1.f;
    world->Barrier();
    double with = BestSeconds(3, [&] {
      for (int i = 0; i < iters; ++i) {
        gemm();
        world->AllReduce(&one, 1, comm::DType::kF32, comm::ReduceOp::kSum);
      }
    });
    double per = std::max(0.0, (with - alone) / iters);
    world->AllReduce(&per, 1, comm::DType::kF64, comm::ReduceOp::kMax);
    samples.push_back({"sync", 4, per});
  }
  if (r == 0) {
    nlohmann::json j;
    j["ranks"] = R;
    if (!config.empty()) j["kernels_together"] = together.ToJson();
    for (const auto& s : samples) j["samples"].push_back({{"op", s.op}, {"bytes", s.bytes}, {"seconds", s.seconds}});
    std::ofstream(out) << j.dump(1) << "\n";
  }
  comm::FinalizeWorld();
  return 0;
}

int RunCalibrate(const CalibrateOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "myriad plan --calibrate: %s\n", s.message().c_str());
    return 2;
  };
  TrainConfig tc;
  auto job = JobFromTrainConfig(o.config, o.overrides, &tc);
  if (!job.ok()) return fail(job.status());
  std::vector<plan::Layout> layouts;
  int64_t max_ranks = 1;
  {
    std::stringstream ss(o.layouts);
    for (std::string spec; std::getline(ss, spec, ';');) {
      auto l = plan::ParseLayout(spec);
      if (!l.ok()) return fail(l.status());
      layouts.push_back(*l);
      max_ranks = std::max(max_ranks, l->devices());
    }
  }
  if (layouts.empty()) return fail(Status::Error("no layouts (hint: --layouts \"dp=1;dp=2;tp=2\")"));
  const std::string exe = SelfExe();
  const std::string tmp = o.work_dir.empty() ? "/tmp/myriad-calibrate-" + std::to_string(getpid()) : o.work_dir;
  std::filesystem::create_directories(tmp);

  // 1. Kernels, one thread (each rank of the runs below gets one).
  omp_set_num_threads(o.threads);
  plan::Calibration cal;  // kernels of one rank alone (and the collectives)
  cal.threads = o.threads;
  plan::Calibration shared = cal;  // kernels while every rank runs them
  std::fprintf(stderr, "calibrate: timing kernels on %lld-token micro-batches...\n",
               (long long)(tc.batch_size * tc.seq_len));
  plan::MeasureKernels(*job, tc.batch_size * tc.seq_len, &cal);
  // 2. Collectives over the largest rank count the layouts use.
  const int comm_ranks = static_cast<int>(std::max<int64_t>(2, max_ranks));
  std::fprintf(stderr, "calibrate: timing MPI collectives on %d ranks...\n", comm_ranks);
  const std::string comm_json = tmp + "/comm.json";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0)
    return fail(Status::Error("mpirun not found (hint: apt-get install openmpi-bin, or scripts/install-deps.sh)"));
  // OpenMPI refuses root unless told (containers and CI run as root).
  const std::string root = geteuid() == 0 ? "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 " : "";
  const std::string mpirun = root + "OMP_NUM_THREADS=" + std::to_string(o.threads) + " mpirun --oversubscribe -np ";
  std::string cmd = mpirun + std::to_string(comm_ranks) + " " + Quote(exe) + " plan --measure-comm " + Quote(comm_json) +
                    " -c " + Quote(o.config);
  for (const auto& s : o.overrides) cmd += " --set " + Quote(s);
  cmd += " >" + Quote(tmp + "/comm.log") + " 2>&1";
  if (std::system(cmd.c_str()) != 0) return fail(Status::Error("collective benchmark failed: see " + tmp + "/comm.log"));
  {
    std::ifstream in(comm_json);
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) return fail(Status::Error(comm_json + ": unreadable"));
    std::vector<plan::CommSample> samples;
    for (const auto& s : j["samples"]) samples.push_back({s["op"], s["bytes"], s["seconds"]});
    plan::FitComm(samples, comm_ranks, &cal);
    if (j.contains("kernels_together")) {
      const auto& k = j["kernels_together"];
      shared.gemm_flops = k["gemm_gflops"].get<double>() * 1e9;
      shared.gemm_overhead_s = k["gemm_overhead_us"].get<double>() * 1e-6;
      shared.attention_flops = k["attention_gflops"].get<double>() * 1e9;
      shared.memory_bw = k["memory_gbs"].get<double>() * 1e9;
      shared.page_touch_bw = k["page_touch_gbs"].get<double>() * 1e9;
    }
  }
  shared.comm_bandwidth = cal.comm_bandwidth, shared.comm_latency = cal.comm_latency;
  shared.allreduce_eff = cal.allreduce_eff, shared.allgather_eff = cal.allgather_eff;
  shared.alltoall_eff = cal.alltoall_eff;
  shared.comm_fit_err = cal.comm_fit_err, shared.comm_ranks = cal.comm_ranks;
  std::printf("calibration  one rank alone: GEMM %.1f GFLOP/s + %.1f us per call (fit within %.0f%%), attention %.1f "
              "GFLOP/s, element-wise %.1f GB/s, fresh pages %.2f GB/s\n",
              cal.gemm_flops / 1e9, cal.gemm_overhead_s * 1e6, 100 * cal.gemm_fit_err, cal.attention_flops / 1e9,
              cal.memory_bw / 1e9, cal.page_touch_bw / 1e9);
  std::printf("             %d ranks at once: GEMM %.1f GFLOP/s + %.1f us, attention %.1f GFLOP/s, element-wise %.1f GB/s "
              "each; MPI send/recv %.2f GB/s + %.1f us, all-reduce x%.2f, all-gather x%.2f, all-to-all x%.2f "
              "(fits within %.0f%%)\n",
              comm_ranks, shared.gemm_flops / 1e9, shared.gemm_overhead_s * 1e6, shared.attention_flops / 1e9,
              shared.memory_bw / 1e9, cal.comm_bandwidth / 1e9, cal.comm_latency * 1e6, cal.allreduce_eff,
              cal.allgather_eff, cal.alltoall_eff, 100 * cal.comm_fit_err);

  // 3. Predict and run each layout.
  struct Row {
    plan::Layout l;
    double predicted = 0, measured = 0;  // medians over the rounds
    double imbalance = 1;                // the expert-parallel load factor the prediction used
    double measured_rel = 1;             // median over rounds of measured / the first layout's in that round
  };
  // Measured in rounds, every layout once per round (A B C .. A B C ..):
  // this shared machine's speed drifts, and a round keeps the layouts side by side.
  for (plan::Layout& l : layouts) {
    const int64_t data = l.dp * l.ep;
    const int64_t B = tc.batch_size * tc.grad_accum;
    const int64_t micro = l.pp > 1 ? (tc.parallel.microbatches > 0 ? tc.parallel.microbatches : 2 * l.pp) : tc.grad_accum;
    l.micro_batch = std::max<int64_t>(1, B / data / micro);
  }
  std::vector<std::vector<double>> measured(layouts.size());  // per layout, per round
  std::vector<std::vector<double>> expert_load;               // from the first run that logs it
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      const plan::Layout& l = layouts[i];
      const std::string out = tmp + "/run-" + std::to_string(i) + "-" + std::to_string(round);
      std::filesystem::remove_all(out);
      std::string run = (l.devices() > 1 ? mpirun + std::to_string(l.devices()) + " "
                                         : "OMP_NUM_THREADS=" + std::to_string(o.threads) + " ") +
                        Quote(exe) + " train -c " + Quote(o.config);
      for (const auto& s : o.overrides) run += " --set " + Quote(s);
      auto set = [&](const std::string& kv) { run += " --set " + Quote(kv); };
      set("train.steps=" + std::to_string(o.steps));
      set("train.log_every=" + std::to_string(std::max<int64_t>(1, o.steps / 6)));
      set("train.out_dir=\"" + out + "\"");
      set("train.eval_every=0"), set("train.ckpt_every=0"), set("train.precision=\"fp32\"");
      set("train.health_check=false"), set("train.snapshot_dir=\"none\""), set("train.threads=" + std::to_string(o.threads));
      set("parallel.dp=" + std::to_string(l.dp)), set("parallel.tp=" + std::to_string(l.tp));
      set("parallel.pp=" + std::to_string(l.pp)), set("parallel.ep=" + std::to_string(l.ep));
      set("parallel.cp=" + std::to_string(l.cp)), set("parallel.zero=" + std::to_string(l.zero));
      run += " >" + Quote(out + ".log") + " 2>&1";
      std::fprintf(stderr, "calibrate: round %d/%d: %s, %lld steps...\n", round + 1, o.rounds, l.ToString().c_str(),
                   (long long)o.steps);
      std::filesystem::create_directories(out);
      if (std::system(run.c_str()) != 0) return fail(Status::Error("training run failed: see " + out + ".log"));
      auto m = MedianStepSeconds(out + "/metrics.jsonl");
      if (!m.ok()) return fail(m.status());
      measured[i].push_back(*m);
      if (expert_load.empty()) expert_load = ExpertLoad(out + "/metrics.jsonl");
    }
  }
  std::vector<Row> rows;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const plan::Layout& l = layouts[i];
    const plan::ClusterDesc c = plan::CalibratedCluster(l.devices() > 1 && shared.gemm_flops > 0 ? shared : cal, l.devices());
    plan::JobDesc lj = *job;
    lj.moe_imbalance = plan::EpImbalance(expert_load, l.ep);
    const plan::StepEstimate e = plan::Estimate(lj, c, l);
    if (e.step_s <= 0) return fail(Status::Error(e.why));
    std::vector<double> v = measured[i];
    std::sort(v.begin(), v.end());
    // Against the first layout of the same round (the ratio BENCHMARKS.md quotes).
    std::vector<double> rel;
    for (int round = 0; round < o.rounds; ++round) rel.push_back(measured[i][round] / measured[0][round]);
    std::sort(rel.begin(), rel.end());
    rows.push_back({l, e.step_s, v[v.size() / 2], lj.moe_imbalance, rel[rel.size() / 2]});
  }

  // 4. Report: errors and whether the ranking survives.
  double sum_err = 0, sum_rel = 0;
  std::printf("\n  %-44s %-11s %-11s %-8s | %-9s %-9s %s\n", "layout", "predicted", "measured", "error", "pred/ref",
              "meas/ref", "error");
  nlohmann::json report;
  report["calibration"] = cal.ToJson();
  report["calibration_shared"] = shared.ToJson();
  for (const auto& r : rows) {
    const double err = r.predicted / r.measured - 1;
    const double pred_rel = r.predicted / rows[0].predicted, err_rel = pred_rel / r.measured_rel - 1;
    sum_err += std::abs(err);
    sum_rel += std::abs(err_rel);
    std::printf("  %-44s %-11s %-11s %+6.1f%%  | %-9.3f %-9.3f %+6.1f%%\n", r.l.ToString().c_str(),
                plan::Seconds(r.predicted).c_str(), plan::Seconds(r.measured).c_str(), 100 * err, pred_rel,
                r.measured_rel, 100 * err_rel);
    report["layouts"].push_back({{"layout", r.l.ToString()}, {"predicted_s", r.predicted}, {"measured_s", r.measured},
                                 {"error", err}, {"moe_imbalance", r.imbalance}, {"predicted_vs_first", pred_rel},
                                 {"measured_vs_first", r.measured_rel}, {"error_vs_first", err_rel},
                                 {"measured_rounds_s", measured[&r - rows.data()]}});
  }
  // Ranking: pairs ordered the same way by prediction and measurement.
  // A pair counts when the measurement can tell them apart: their ranges
  // over the rounds do not overlap (this machine drifts 10-25% between
  // rounds; with one round, any difference counts).
  int pairs = 0, agree = 0;
  auto lo = [&](size_t i) { return *std::min_element(measured[i].begin(), measured[i].end()); };
  auto hi = [&](size_t i) { return *std::max_element(measured[i].begin(), measured[i].end()); };
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t k = i + 1; k < rows.size(); ++k) {
      if (!(hi(i) < lo(k) || hi(k) < lo(i))) continue;
      ++pairs;
      agree += (rows[i].measured > rows[k].measured) == (rows[i].predicted > rows[k].predicted);
    }
  const double mean_err = sum_err / static_cast<double>(rows.size());
  const double mean_rel = rows.size() > 1 ? sum_rel / static_cast<double>(rows.size() - 1) : 0;
  std::printf("\nmean |error| %.1f%% over %zu layouts (%.1f%% for the times relative to the first layout, over the "
              "other %zu); ranking: %d of %d pairs the rounds tell apart in the measured order\n",
              100 * mean_err, rows.size(), 100 * mean_rel, rows.size() - 1, agree, pairs);
  report["mean_abs_error"] = mean_err;
  report["mean_abs_error_vs_first"] = mean_rel;
  report["rounds"] = o.rounds;
  report["ranking_pairs"] = pairs;
  report["ranking_agree"] = agree;
  if (!o.report.empty()) {
    std::ofstream(o.report) << report.dump(2) << "\n";
    std::printf("report: %s\n", o.report.c_str());
  }
  if (o.work_dir.empty()) std::filesystem::remove_all(tmp);
  return 0;
}

}  // namespace myriad::cli
