#include "train/trainer.h"

#include <omp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/checksum.h"
#include "core/env.h"
#include "core/log.h"
#include "core/timing.h"
#include "train/checkpoint/async_writer.h"
#include "train/checkpoint/checkpoint.h"
#include "core/fault_env.h"
#include "train/comm/local_comm.h"
#include "train/comm/trace.h"
#include "train/supervise/attempt_runner.h"
#include "train/supervise/faults.h"
#include "train/supervise/health.h"
#include "train/supervise/heartbeat.h"
#include "train/supervise/run_lock.h"
#include "ops/ops.h"
#include "backend/cpu/kernel_bench.h"
#include "model/flops.h"
#include "train/dist_train.h"
#include "train/init_from.h"
#include "data/prepare.h"
#include "train/memory_estimate.h"
#include "train/precision.h"

namespace myriad {
namespace {

std::atomic<int> g_stop_signal{0};
void OnStopSignal(int sig) { g_stop_signal.store(sig); }

// SIGTERM/SIGINT, and the supervisor's stop (SIGUSR1, which mpirun forwards:
// supervise/attempt_runner.h): finish the step, write a checkpoint, exit.
// Restored on scope exit.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &old_[i], nullptr);
  }

 private:
  static constexpr int kSignals[3] = {SIGTERM, SIGINT, supervise::kJobStopSignal};
  struct sigaction old_[3] {};
};

// train.snapshot_dir resolved: "" when off, or when the ranks span machines
// (every rank must see the same checkpoints).
std::string ResolveSnapshotDir(const TrainConfig& tc, comm::Comm* world) {
  if (tc.snapshot_dir.empty() || tc.snapshot_dir == "none") return "";
  if (world && world->size() > 1) {
    std::unique_ptr<comm::Comm> node = world->SplitShared();
    int32_t all_here = node->size() == world->size();
    world->AllReduce(&all_here, 1, comm::DType::kI32, comm::ReduceOp::kMin);
    if (!all_here) return "";
  }
  if (tc.snapshot_dir != "auto") return tc.snapshot_dir;
  std::error_code ec;
  if (!std::filesystem::is_directory("/dev/shm", ec) || access("/dev/shm", W_OK) != 0) return "";
  const std::string abs = std::filesystem::absolute(tc.out_dir, ec).lexically_normal().string();
  return "/dev/shm/myriad-" + ChecksumHex(Checksum64(abs));
}

Status CopyTensor(const SafetensorsFile& f, const std::string& name, const std::vector<int64_t>& shape,
                  float* dst) {
  auto v = ReadF32(f, name, shape);
  if (!v.ok()) return v.status();
  std::copy(v->begin(), v->end(), dst);
  return Status::Ok();
}

}  // namespace

std::string FormatDuration(double s) {
  char buf[32];
  if (s < 0 || !std::isfinite(s)) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

// GFLOP/s of an n^3 GEMM through ops (the model's GEMM at its precision).
static double MeasureModelGemmPeakGflops(int n) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(static_cast<size_t>(n) * n, 0.25f), c(static_cast<size_t>(n) * n);
  const double best = BestSeconds(3, [&] {
    ops::Gemm(Trans::kNo, Trans::kNo, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  });
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                     ModelConfig* model, TrainConfig* train, const std::function<void(ConfigDoc*)>& extra) {
  ASSIGN_OR_RETURN(auto doc, ConfigDoc::Load(path, overrides));
  *train = TrainConfig::Read(doc.get());
  if (extra) extra(doc.get());
  if (!train->init_from.empty()) {
    // The model is the source's; [model] may only agree with it (init_from.h).
    ASSIGN_OR_RETURN(InitSource src, ResolveInitSource(Env::Default(), train->init_from));
    ASSIGN_OR_RETURN(*model, ModelConfigFromInitSource(doc.get(), src));
    std::error_code ec;
    namespace fs = std::filesystem;
    if (fs::exists(train->out_dir, ec) && fs::equivalent(train->init_from, train->out_dir, ec))
      return Status::Error(path + ": train.init_from and train.out_dir are the same folder " + train->out_dir +
                           " (hint: a fine-tune writes its own run directory: set train.out_dir elsewhere)");
  } else {
    *model = ModelConfig::Read(doc.get());
  }
  RETURN_IF_ERROR(doc->Finish());
  RETURN_IF_ERROR(model->Validate().With(path));
  RETURN_IF_ERROR(train->Validate().With(path));
  if (train->seq_len > model->max_seq_len)
    return Status::Error(path + ": train.seq_len=" + std::to_string(train->seq_len) + " exceeds model.max_seq_len=" +
                         std::to_string(model->max_seq_len) + " (hint: raise model.max_seq_len)");
  if (train->seq_len <= model->mtp_depth)
    return Status::Error(path + ": train.seq_len=" + std::to_string(train->seq_len) +
                         " must exceed model.mtp_depth=" + std::to_string(model->mtp_depth));
  return train->CheckSizes(*model).With(path);
}

EvalResult EvaluateWith(DataLoader& val, int B, int T, int64_t batches,
                        const std::function<double(const int32_t*)>& loss_of) {
  EvalResult r;
  DataCursor saved = val.cursor();
  DataCursor start;
  start.seed = saved.seed;
  (void)val.Seek(start);
  std::vector<int32_t> buf(static_cast<size_t>(B) * (T + 1));
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    val.NextBatch(B, buf.data());
    sum += loss_of(buf.data());
  }
  (void)val.Seek(saved);
  r.loss = batches > 0 ? sum / batches : 0;
  r.perplexity = std::exp(r.loss);
  r.tokens = batches * B * T;
  return r;
}

EvalResult Evaluate(Model& model, DataLoader& val, int B, int T, int64_t batches) {
  EvalResult r = EvaluateWith(val, B, T, batches,
                              [&](const int32_t* tokens) { return model.Step(tokens, B, T, /*backward=*/false).main; });
  model.ClearExpertLoad();
  return r;
}

Status RestoreModel(const LoadedCheckpoint& ckpt, Model* model) {
  std::vector<float> host;  // each tensor through the host, then to the device
  for (const auto& p : model->layout().params()) {
    if (model->config().tie_embeddings && p.name == "lm_head.weight") continue;
    host.resize(p.numel);
    RETURN_IF_ERROR(CopyTensor(ckpt.model, p.name, p.shape, host.data()));
    model->ParamsFromHost(host.data(), p.offset, p.numel);
  }
  const auto& bn = model->layout().bias_names();
  for (size_t i = 0; i < bn.size(); ++i)
    RETURN_IF_ERROR(CopyTensor(ckpt.model, bn[i], {model->config().n_routed_experts}, model->biases()[i].data()));
  return Status::Ok();
}

Status RunTraining(const RunSpec& spec) {
  ModelConfig mc;
  TrainConfig tc;
  // A refused config (or one that does not fit in memory) exits kExitConfig.
  const auto refused = [&](Status s) {
    if (spec.exit_code) *spec.exit_code = kExitConfig;
    return s;
  };
  if (Status s = LoadRunConfig(spec.config_path, spec.overrides, &mc, &tc); !s.ok()) return refused(s);
  // Without mpirun a run is a world of one rank: the same step (DistTrainer),
  // which issues nothing on one rank.
  std::unique_ptr<comm::Comm> self;
  comm::Comm* world = spec.world;
  if (!world) {
    self = comm::MakeSelfComm();
    world = self.get();
  }
  const bool dist = world->size() > 1;
  const bool root = world->rank() == 0;
  // Before anything is allocated: does what this config needs fit here?
  if (Status s = CheckRunMemory(mc, tc, world); !s.ok()) return refused(s.With(spec.config_path));
  // One writer per run directory (supervise/run_lock.h), until this returns.
  ASSIGN_OR_RETURN(std::unique_ptr<supervise::RunLock> run_lock, supervise::LockRunDirForTraining(world, tc.out_dir));
  if (tc.threads > 0) omp_set_num_threads(static_cast<int>(tc.threads));
  Env* env = Env::Default();
  const int B = static_cast<int>(tc.batch_size), T = static_cast<int>(tc.seq_len);
  const int A = static_cast<int>(tc.grad_accum);

  ASSIGN_OR_RETURN(auto train_data, DataLoader::Open(tc.data_dir, "train", T, tc.seed));
  std::unique_ptr<DataLoader> val_data;
  {
    auto v = DataLoader::Open(tc.data_dir, "val", T, tc.seed);
    if (v.ok()) val_data = std::move(v).value();
    else LOG_WARN("no validation split: %s", v.status().message().c_str());
  }
  if (train_data->vocab_size() > mc.vocab_size)
    return Status::Error(tc.data_dir + ": tokenizer has " + std::to_string(train_data->vocab_size()) +
                         " tokens but model.vocab_size=" + std::to_string(mc.vocab_size) +
                         " (hint: set model.vocab_size >= the tokenizer's size)");

  // A resumed run keeps the precision it started with ("auto" is decided
  // once per run, so a resume continues the same arithmetic bit for bit).
  std::string precision_setting = tc.precision;
  bool precision_from_checkpoint = false;
  // Loaded (and verified) once; restored into the model further down.
  std::optional<LoadedCheckpoint> resume;
  std::vector<std::string> skipped_checkpoints;
  int64_t disk_step = -1;  // the newest checkpoint on disk that verifies (-1: none)
  // The shared-memory copy of the checkpoints (all ranks on this machine only).
  std::string snap_dir = ResolveSnapshotDir(tc, world);
  if (!snap_dir.empty()) {
    // The copy belongs to this run only while out_dir is the same run: a run
    // id in out_dir (new with --fresh or a new out_dir) must match the copy's.
    if (root) {
      std::string id;
      if (auto r = env->ReadFile(tc.out_dir + "/run_id"); r.ok() && !spec.fresh) id = *r;
      if (id.empty()) {
        id = ChecksumHex(Checksum64(tc.out_dir + std::to_string(env->NowMicros()) + std::to_string(getpid())));
        RETURN_IF_ERROR(env->CreateDirs(tc.out_dir));
        RETURN_IF_ERROR(WriteFileAtomic(env, tc.out_dir + "/run_id", id));
      }
      auto have = env->ReadFile(snap_dir + "/run_id");
      if (!have.ok() || *have != id) {
        (void)env->RemoveAll(snap_dir);
        if (!env->CreateDirs(snap_dir).ok() || !WriteFileAtomic(env, snap_dir + "/run_id", id).ok()) {
          LOG_WARN("cannot use %s for checkpoint copies in shared memory; disk only", snap_dir.c_str());
          (void)env->RemoveAll(snap_dir);
        }
      }
    }
    if (dist) world->Barrier();
    if (!env->FileExists(snap_dir + "/run_id")) snap_dir.clear();
  }
  if (!spec.fresh) {
    // The newest one that verifies, on disk or in shared memory: a torn or
    // corrupt latest falls back to the one before (and says so).
    for (const std::string& root : {tc.out_dir, snap_dir}) {
      if (root.empty()) continue;
      ASSIGN_OR_RETURN(std::vector<std::string> found, ListCheckpoints(env, root));
      if (found.empty() && !env->FileExists(root + "/latest")) continue;
      std::vector<std::string> skipped;
      auto ck = LoadNewestValidCheckpoint(env, root, &skipped);
      for (auto& sk : skipped) skipped_checkpoints.push_back(sk);
      if (!ck.ok()) {
        if (root == tc.out_dir && snap_dir.empty()) return ck.status();
        LOG_WARN("%s", ck.status().message().c_str());
        continue;
      }
      if (root == tc.out_dir) disk_step = ck->step;
      if (!resume || ck->step > resume->step) resume = std::move(ck).value();
    }
    if (!resume && !skipped_checkpoints.empty())
      return Status::Error(tc.out_dir + ": no checkpoint loads (hint: --fresh to start over)");
  }
  // A step only the shared-memory copy holds (the process died while that
  // checkpoint was being written to disk) goes to disk now, before anything
  // else: otherwise a run that died in its final save would report "nothing
  // to do" with the final step on no disk.
  if (resume && resume->step > disk_step) {
    Status recovered = Status::Ok();
    if (root) {
      LOG_WARN("step %lld is only in the shared-memory copy (%s; on disk: %s): writing it to %s",
               static_cast<long long>(resume->step), resume->dir.c_str(),
               disk_step < 0 ? "none" : ("step " + std::to_string(disk_step)).c_str(), tc.out_dir.c_str());
      auto saved = SaveCheckpoint(env, tc.out_dir, resume->step, CheckpointDataOf(*resume),
                                  static_cast<int>(tc.keep_last));
      if (!saved.ok())
        recovered = Status::Error("cannot write the shared-memory copy of step " + std::to_string(resume->step) +
                                  " to disk: " + saved.status().message());
      else
        LOG_INFO("recovered step %lld from shared memory: %s", static_cast<long long>(resume->step), saved->c_str());
    }
    if (dist) {  // every rank learns whether rank 0 managed (none waits on a rank that gave up)
      int32_t failed = !recovered.ok();
      world->AllReduce(&failed, 1, comm::DType::kI32, comm::ReduceOp::kMax);
      if (failed && recovered.ok())
        recovered = Status::Error("rank 0 could not write step " + std::to_string(resume->step) + " to disk");
    }
    RETURN_IF_ERROR(recovered);
    disk_step = resume->step;
  }
  if (resume && tc.precision == "auto") {
    if (resume->manifest.contains("precision")) {
      precision_setting = resume->manifest["precision"].get<std::string>();
      precision_from_checkpoint = true;
      if (precision_setting == "bf16" && !ops::HasBf16Gemm()) {
        LOG_WARN("the run trained in bf16 but this machine has no bf16 GEMM: continuing in fp32");
        precision_setting = "fp32";
      }
    }
  }
  ASSIGN_OR_RETURN(PrecisionChoice precision, ChoosePrecision(precision_setting, mc, static_cast<int64_t>(B) * T));
  if (dist) {
    // "auto" times kernels; every rank must use rank 0's choice.
    int32_t bf16 = precision.precision == ops::GemmPrecision::kBf16;
    world->Broadcast(&bf16, 1, comm::DType::kI32, 0);
    precision.precision = bf16 ? ops::GemmPrecision::kBf16 : ops::GemmPrecision::kFp32;
  }
  ops::SetGemmPrecision(precision.precision);
  if (root) LOG_INFO("precision: %s%s", precision.reason.c_str(),
           precision_from_checkpoint ? " (kept from the run's checkpoint)" : "");
  const char* precision_used = precision.precision == ops::GemmPrecision::kBf16 ? "bf16" : "fp32";

  // Supervision: heartbeats to `myriad launch` (no-op without one), planned
  // faults, the device health check.
  const int rank = world->rank();
  const int world_size = world->size();
  supervise::Heartbeat& hb = supervise::Heartbeat::Global();
  // A stop request is remembered from before the first heartbeat: a
  // supervisor sends its stop once every rank has reported.
  StopSignals signals;
  hb.Start(rank, world_size);
  auto fail = [&](int code, const std::string& event, nlohmann::json fields, const std::string& message) {
    if (spec.exit_code) *spec.exit_code = code;
    fields["message"] = message;
    hb.Event(event, std::move(fields));
    return Status::Error(message);
  };
  ASSIGN_OR_RETURN(supervise::FaultInjector faults, supervise::FaultInjector::FromEnv(rank, hb.host()));
  if (tc.health_check) {
    hb.SetPhase("health");
    supervise::HealthOptions ho;
    ho.inject_failure = faults.HealthFailure();
    const supervise::HealthReport hr = supervise::RunHealthCheck(ho);
    hb.Event("health", {{"ok", hr.ok}, {"report", hr.ToJson()}});
    if (!hr.ok)
      return fail(kExitHealth, "exit", {{"ok", false}, {"reason", "health"}},
                  "health check failed on rank " + std::to_string(rank) + " (host " + hb.host() + "): " + hr.failure);
    if (root) LOG_INFO("health check: ok (GEMM %.0f GFLOP/s, %.2fs)", hr.gemm_gflops, hr.seconds);
  }
  hb.SetPhase("init");

  // This rank's share of the model and optimizer (all of both on one rank).
  ASSIGN_OR_RETURN(std::unique_ptr<DistTrainer> dtr, DistTrainer::Create(world, mc, tc));
  int64_t step = 0;
  // A fine-tune's source (train.init_from): its weights when starting, its
  // "hf" record in every checkpoint.
  std::optional<InitSource> init_source;
  if (!tc.init_from.empty()) {
    ASSIGN_OR_RETURN(InitSource src, ResolveInitSource(env, tc.init_from));
    init_source = std::move(src);
  }

  // Resume from the newest checkpoint in out_dir unless told not to.
  if (resume) {
    const LoadedCheckpoint& ck = *resume;
    auto saved_cfg = ModelConfig::FromJson(ck.manifest["model_config"]);
    if (!saved_cfg.ok()) return saved_cfg.status().With(ck.dir);
    if (saved_cfg->ToJson() != mc.ToJson())
      return Status::Error(ck.dir + ": checkpoint was written for another model config (hint: use --fresh "
                           "to start over, or train.out_dir to write elsewhere)");
    RETURN_IF_ERROR(dtr->Restore(ck, /*with_optimizer=*/true));
    ASSIGN_OR_RETURN(DataCursor cur, DataCursor::FromJson(ck.manifest["data_cursor"]));
    RETURN_IF_ERROR(train_data->Seek(cur));
    step = ck.step;
    if (root) LOG_INFO("resumed from %s at step %lld", ck.dir.c_str(), static_cast<long long>(step));
    for (const std::string& sk : skipped_checkpoints)
      if (root) LOG_WARN("skipped a damaged checkpoint: %s", sk.c_str());
    resume.reset();  // unmap: everything needed was copied
  } else if (init_source) {
    // A fine-tune's start: the source's weights, a fresh optimizer, step 0.
    const InitSource& src = *init_source;
    RETURN_IF_ERROR(LoadInitWeights(env, src, dtr.get()).With("train.init_from=" + tc.init_from));
    if (root)
      LOG_INFO("initialised from %s (%s: weights only; a fresh optimizer at step 0)", tc.init_from.c_str(),
               src.hf ? "a Hugging Face folder" : "a checkpoint");
  }
  hb.Event("start", {{"resumed_step", step}, {"skipped_checkpoints", skipped_checkpoints}, {"steps", tc.steps}});
  if (step >= tc.steps) {
    // Only once the final step is on disk (the recovery above put it there).
    if (disk_step < step)
      return Status::Error(tc.out_dir + ": step " + std::to_string(step) + " is not on disk (hint: rerun to write it)");
    LOG_INFO("already at step %lld of %lld: nothing to do", static_cast<long long>(step),
             static_cast<long long>(tc.steps));
    if (root && !snap_dir.empty()) (void)env->RemoveAll(snap_dir);  // done and on disk
    hb.Event("exit", {{"ok", true}, {"completed", true}, {"final_step", step}, {"reason", "done"}});
    hb.Stop();
    return Status::Ok();
  }
  if (root) RETURN_IF_ERROR(env->CreateDirs(tc.out_dir));
  const std::string metrics_path = tc.metrics_file.empty() ? tc.out_dir + "/metrics.jsonl" : tc.metrics_file;
  std::ofstream metrics;
  if (root) {
    metrics.open(metrics_path, std::ios::app);
    if (!metrics) return Status::Error(metrics_path + ": cannot open for writing");
  }
  int64_t metrics_lost = 0;  // records that could not be written
  bool metrics_recovered = false;

  // MFU is against the peak of the GEMM in use (bf16 when chosen), measured now.
  const double peak = (precision.precision == ops::GemmPrecision::kBf16 ? MeasureModelGemmPeakGflops(1024)
                                                                         : MeasureSgemmPeakGflops(1024)) * 1e9 *
                      world->size();
  const double flops_per_token = TrainFlopsPerToken(mc, T);
  if (root) LOG_INFO("model: %lld parameters (%s), %s; peak GEMM %.0f GFLOP/s", static_cast<long long>(ParamLayout(mc).total()),
           mc.n_routed_experts > 0 ? "MoE" : "dense", ops::Active()->name().c_str(), peak / 1e9);

  // Checkpoints: a snapshot in memory (training blocks only for the copy;
  // collective in a distributed run), written by rank 0's background writer.
  // A write that fails (full disk, I/O error) leaves the previous checkpoint
  // intact and is retried with a fresh snapshot at the next step.
  FaultEnv fault_env(env);
  std::unique_ptr<AsyncCheckpointWriter> writer;
  if (root) {
    writer = std::make_unique<AsyncCheckpointWriter>(&fault_env, tc.out_dir, static_cast<int>(tc.keep_last));
    if (!snap_dir.empty()) writer->SetMirror(env, snap_dir, /*keep_last=*/2);
  }
  dtr->PrepareSnapshotBuffers();  // (rank 0) the first save pauses for its copy only
  size_t records_seen = 0;
  int failed_saves = 0;
  bool retry_save = false;
  std::vector<double> blocked_s, persist_s;
  auto save = [&](int64_t s, bool wait) -> Status {
    hb.SetPhase("checkpoint");
    const auto t0 = std::chrono::steady_clock::now();
    nlohmann::json meta = {{"step", s}, {"model_config", mc.ToJson()}, {"train_config", tc.ToJson()},
                           {"data_cursor", train_data->cursor().ToJson()}, {"rng", {{"seed", tc.seed}}},
                           {"parallel", dtr->mesh().dims().ToJson()},
                           {"tokenizer", PreparedTokenizerPath(tc.data_dir)}, {"precision", precision_used}};
    if (init_source && !init_source->hf_record.is_null()) meta["hf"] = init_source->hf_record;
    // Training waits for this in-memory copy only (collective in a
    // distributed run); the writer thread then writes the shared-memory copy
    // (tmpfs: from then on a crash of this process loses nothing before step
    // s) and the disk one.
    std::unique_ptr<CheckpointSnapshot> snap = dtr->Snapshot(s, meta);
    Status st;
    const double snapshot_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (root) {
      if (faults.CrashInSaveAt(s)) {
        // Drill: the process dies half-way through this checkpoint's files.
        (void)fault_env.Arm("crash:bytes=" + std::to_string(snap->bytes() / 2) + ",path=" + CheckpointDirName(s));
      }
      if (faults.DiskFullAt(s)) {
        // The disk "fills" half-way through this checkpoint's files.
        (void)fault_env.Arm("enospc:bytes=" + std::to_string(snap->bytes() / 2) + ",path=" + CheckpointDirName(s));
      }
      // Write errors (this one's or an earlier one's) are poll_writer's to
      // report and retry; they never stop training here.
      (void)writer->Submit(std::move(snap), snapshot_s);
      if (wait || !tc.async_checkpoint || faults.DamageAt(s)) (void)writer->Wait();
      // Drill: a crash that leaves this checkpoint torn or corrupt.
      if (faults.DamageAt(s)) faults.AfterCheckpoint(s, tc.out_dir + "/" + CheckpointDirName(s));
    }
    hb.SetPhase("step");
    return st;
  };
  // Rank 0: reports finished writes; a failed one is retried next step.
  auto poll_writer = [&]() -> Status {
    if (!writer) return Status::Ok();
    const std::vector<SaveRecord> recs = writer->records();
    for (; records_seen < recs.size(); ++records_seen) {
      const SaveRecord& r = recs[records_seen];
      if (!r.done) break;  // still being written
      // Training waited for the snapshot (copy + shared-memory write) and
      // for the hand-over (which includes waiting for the previous write).
      const double blocked =
          r.snapshot_s + r.blocked_s + r.mirror_wait_s + (tc.async_checkpoint ? 0.0 : r.persist_s);
      hb.Event("checkpoint", {{"step", r.step}, {"ok", r.ok}, {"snapshot_s", r.snapshot_s},
                              {"handover_s", r.blocked_s}, {"shm_wait_s", r.mirror_wait_s}, {"blocked_s", blocked}, {"persist_s", r.persist_s},
                              {"shm_copy_s", r.mirror_s}, {"error", r.error}});
      if (r.ok) {
        failed_saves = 0;
        blocked_s.push_back(blocked);
        persist_s.push_back(r.persist_s);
        LOG_INFO("checkpoint step %lld written (training blocked %.3fs, written in the background in %.2fs; "
                 "blocked = snapshot %.3fs + hand-over %.3fs + waiting for the shared-memory copy %.3fs; that copy "
                 "took %.2fs of the background)",
                 static_cast<long long>(r.step), blocked, r.persist_s, r.snapshot_s, r.blocked_s, r.mirror_wait_s,
                 r.mirror_s);
      } else {
        fault_env.Disarm();
        LOG_WARN("checkpoint step %lld failed: %s (the previous checkpoint is intact; retrying)",
                 static_cast<long long>(r.step), r.error.c_str());
        if (++failed_saves >= 3)
          return fail(kExitCheckpoint, "exit", {{"ok", false}, {"reason", "checkpoint"}},
                      "checkpoint failed 3 times in a row, last: " + r.error);
        retry_save = true;
      }
    }
    return Status::Ok();
  };

  const bool quiet = spec.quiet || !root;
  const bool tty = !quiet && isatty(STDERR_FILENO);
  std::vector<int32_t> batches(static_cast<size_t>(A) * B * (T + 1));
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = step;
  double tokens_done = 0, loss_ema = 0;
  int64_t steps_this_run = 0;
  bool stopped_by_signal = false;
  hb.SetPhase("step");
  while (step < tc.steps) {
    ++step;
    auto t0 = std::chrono::steady_clock::now();
    for (int a = 0; a < A; ++a) train_data->NextBatch(B, batches.data() + static_cast<size_t>(a) * B * (T + 1));
    const double blocked0 = comm::ThreadBlockedSeconds();
    faults.SlowDown(step);  // drill: a straggler
    StepStats st = dtr->Step(batches.data(), A, B, T, step);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double compute_s = std::max(0.0, dt - (comm::ThreadBlockedSeconds() - blocked0));
    if (faults.NanAt(step)) st.loss.total = std::nan("");
    if (!std::isfinite(st.loss.total))
      return fail(kExitNumerical, "numerical", {{"loss", std::to_string(st.loss.total)}},
                  "step " + std::to_string(step) + ": loss is " + std::to_string(st.loss.total) +
                      " (hint: lower train.lr or raise train.warmup_steps)");
    if (tc.loss_spike_factor > 1 && steps_this_run >= 20 && st.loss.total > tc.loss_spike_factor * loss_ema)
      return fail(kExitNumerical, "numerical", {{"loss", st.loss.total}, {"average", loss_ema}},
                  "step " + std::to_string(step) + ": loss spike " + std::to_string(st.loss.total) + " > " +
                      std::to_string(tc.loss_spike_factor) + " x its moving average " + std::to_string(loss_ema) +
                      " (train.loss_spike_factor)");
    loss_ema = steps_this_run == 0 ? st.loss.total : 0.9 * loss_ema + 0.1 * st.loss.total;
    hb.StepDone(step, dt, compute_s);
    const double tok = static_cast<double>(A) * B * T;
    tokens_done += tok;
    const double tps = tok / dt;
    const double mfu = flops_per_token * tps / peak;
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    double eta = elapsed / static_cast<double>(step - first_step) * static_cast<double>(tc.steps - step);

    nlohmann::json rec = {{"step", step}, {"grad_norm", st.grad_norm},
                          {"lr", st.lr}, {"tokens_per_s", tps}, {"mfu", mfu}, {"step_s", dt},
                          {"elapsed_s", elapsed}, {"expert_load", st.expert_load},
                          {"expert_imbalance", st.max_imbalance}};
    rec["backend"] = ops::Active()->name();
    LossParts::ForEachField([&](const char* name, double LossParts::*f) { rec[name] = st.loss.*f; });
    if (dist) {
      const auto& cf = dtr->last_comm();
      rec["comm"] = {{"grad_bytes", cf.grad_bytes}, {"ep_bytes", cf.ep_bytes}, {"exposed_s", cf.exposed_s},
                     {"intra_node_bytes", cf.intra_node_bytes}, {"inter_node_bytes", cf.inter_node_bytes},
                     {"reduce_alone_s", cf.sync_s},
                     {"hidden_frac", cf.sync_s > 0 ? std::max(0.0, 1.0 - cf.exposed_s / cf.sync_s) : 0.0}};
      if (tc.parallel.zero == 3)
        rec["zero3"] = {{"params_resident_peak", cf.resident_peak}, {"params_local", cf.local_params}};
      if (dtr->mesh().dims().pp > 1)
        rec["pipeline"] = {{"bubble_theory", cf.bubble_theory}, {"bubble_measured", cf.bubble_measured},
                           {"p2p_bytes", cf.pp_bytes}};
      rec["ranks"] = world->size();
    }
    const bool do_eval = val_data && ((tc.eval_every > 0 && step % tc.eval_every == 0) || step == tc.steps);
    if (do_eval) {
      hb.SetPhase("eval");
      EvalResult ev = dtr->Evaluate(*val_data, B, T, tc.eval_batches);
      hb.SetPhase("step");
      rec["val_loss"] = ev.loss;
      rec["val_ppl"] = ev.perplexity;
    }
    if (root && (step % tc.log_every == 0 || step == tc.steps || do_eval)) {
      metrics << rec.dump() << "\n" << std::flush;
      if (!metrics) {  // full disk, I/O error: say so (once), count, keep training
        const int err = errno;
        if (metrics_lost++ == 0)
          LOG_WARN("%s: cannot write metrics (%s): step %lld's record and later ones are lost until it can "
                   "(training goes on; checkpoints are written separately)",
                   metrics_path.c_str(), std::strerror(err), static_cast<long long>(step));
        hb.Event("metrics_lost", {{"step", step}, {"path", metrics_path}, {"error", std::strerror(err)}});
        metrics.clear();
      } else if (metrics_lost > 0 && !metrics_recovered) {
        metrics_recovered = true;
        LOG_INFO("%s: metrics are written again from step %lld", metrics_path.c_str(), static_cast<long long>(step));
      }
    }
    if (!quiet && (step % tc.log_every == 0 || step == tc.steps || do_eval)) {
      char line[256];
      std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | MFU %.1f%% | ETA %s",
                    static_cast<long long>(step), static_cast<long long>(tc.steps), st.loss.total, st.lr, tps,
                    100 * mfu, FormatDuration(eta).c_str());
      if (do_eval) std::fprintf(stderr, "%s%s | val %.4f\n", tty ? "\r\033[K" : "", line, static_cast<double>(rec["val_loss"]));
      else if (tty) std::fprintf(stderr, "\r\033[K%s", line);
      else std::fprintf(stderr, "%s\n", line);
    }
    ++steps_this_run;
    // The step after a save: its shared-memory copy must be complete now
    // (written while this step ran), so a crash from here on loses nothing
    // before the save.
    if (writer) writer->WaitMirror();
    faults.AfterStep(step);  // planned kill / hang (drills)
    RETURN_IF_ERROR(poll_writer());
    // A stop request (SIGTERM/SIGINT) or a failed write to redo: every rank
    // must agree, so the flags travel in one tiny all-reduce.
    int32_t flags[2] = {g_stop_signal.load() != 0, retry_save};
    if (dist) world->AllReduce(flags, 2, comm::DType::kI32, comm::ReduceOp::kMax);
    stopped_by_signal = flags[0] != 0;
    retry_save = false;
    const bool stop = (spec.stop_after > 0 && steps_this_run >= spec.stop_after) || stopped_by_signal;
    if ((tc.ckpt_every > 0 && step % tc.ckpt_every == 0) || step == tc.steps || stop || flags[1]) {
      if (tty) std::fputc('\n', stderr);
      // The last one (end, stop) is waited for; the others are written while training goes on.
      RETURN_IF_ERROR(save(step, step == tc.steps || stop));
      RETURN_IF_ERROR(poll_writer());
    }
    if (stop) break;
  }
  // The last write must land: redo it while it fails (poll_writer gives up
  // after three in a row). Every rank takes part (the snapshot is collective).
  for (;;) {
    if (writer) {
      (void)writer->Wait();
      RETURN_IF_ERROR(poll_writer());
    }
    int32_t again = retry_save;
    if (dist) world->AllReduce(&again, 1, comm::DType::kI32, comm::ReduceOp::kMax);
    retry_save = false;
    if (!again) break;
    RETURN_IF_ERROR(save(step, true));
  }
  if (tty) std::fputc('\n', stderr);
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (root) LOG_INFO("done: %lld steps, %.0f tokens in %s (%.0f tok/s)", static_cast<long long>(steps_this_run), tokens_done,
           FormatDuration(total).c_str(), tokens_done / total);
  if (root && !blocked_s.empty()) {
    double b = 0, p = 0;
    for (size_t i = 0; i < blocked_s.size(); ++i) b += blocked_s[i], p += persist_s[i];
    LOG_INFO("checkpoints: %zu written; training blocked %.3fs per save on average, %.1f%% of the %.2fs a save took",
             blocked_s.size(), b / blocked_s.size(), p > 0 ? 100 * b / (b + p) : 0.0, (b + p) / blocked_s.size());
  }
  if (root && metrics_lost > 0)
    LOG_WARN("%s: %lld metrics records could not be written", metrics_path.c_str(),
             static_cast<long long>(metrics_lost));
  // Done and on disk: the shared-memory copy is no longer needed.
  if (root && !snap_dir.empty() && step >= tc.steps && failed_saves == 0) (void)env->RemoveAll(snap_dir);
  if (stopped_by_signal && root)
    LOG_WARN("stopped by signal %d at step %lld; checkpoint written (run again to resume)", g_stop_signal.load(),
             static_cast<long long>(step));
  hb.Event("exit", {{"ok", true}, {"completed", step >= tc.steps}, {"final_step", step},
                    {"reason", stopped_by_signal ? "signal" : (step >= tc.steps ? "done" : "stop_after")}});
  hb.Stop();
  return Status::Ok();
}

}  // namespace myriad
