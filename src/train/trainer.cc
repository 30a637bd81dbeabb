#include "train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "core/env.h"
#include "core/log.h"
#include "core/timing.h"
#include "train/checkpoint/checkpoint.h"
#include "ops/ops.h"
#include "backend/cpu/kernel_bench.h"
#include "train/dist_train.h"
#include "train/precision.h"
#include "train/train_step.h"

namespace myriad {
namespace {

std::string FormatDuration(double s) {
  char buf[32];
  if (s < 0 || !std::isfinite(s)) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t / 60 % 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

std::vector<TensorView> ModelTensors(Model& m) {
  std::vector<TensorView> out;
  for (const auto& p : m.layout().params()) {
    if (m.config().tie_embeddings && p.name == "lm_head.weight") continue;
    out.push_back({p.name, "F32", p.shape, m.params().data() + p.offset, static_cast<size_t>(p.numel) * 4});
  }
  const auto& bn = m.layout().bias_names();
  for (size_t i = 0; i < bn.size(); ++i)
    out.push_back({bn[i], "F32", {m.config().n_routed_experts}, m.biases()[i].data(),
                   static_cast<size_t>(m.config().n_routed_experts) * 4});
  return out;
}

std::vector<TensorView> OptimizerTensors(Model& m, AdamWOptimizer& opt, std::vector<std::string>* names) {
  names->clear();
  for (const auto& p : m.layout().params()) {
    names->push_back(p.name + ".exp_avg");
    names->push_back(p.name + ".exp_avg_sq");
  }
  std::vector<TensorView> out;
  size_t i = 0;
  for (const auto& p : m.layout().params()) {
    out.push_back({(*names)[i++], "F32", p.shape, opt.exp_avg().data() + p.offset, static_cast<size_t>(p.numel) * 4});
    out.push_back({(*names)[i++], "F32", p.shape, opt.exp_avg_sq().data() + p.offset, static_cast<size_t>(p.numel) * 4});
  }
  return out;
}

Status CopyTensor(const SafetensorsFile& f, const std::string& name, const std::vector<int64_t>& shape,
                  float* dst) {
  auto v = ReadF32(f, name, shape);
  if (!v.ok()) return v.status();
  std::copy(v->begin(), v->end(), dst);
  return Status::Ok();
}

}  // namespace

// GFLOP/s of an n^3 GEMM through ops (the model's GEMM at its precision).
static double MeasureModelGemmPeakGflops(int n) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(static_cast<size_t>(n) * n, 0.25f), c(static_cast<size_t>(n) * n);
  const double best = BestSeconds(3, [&] {
    ops::Gemm(Trans::kNo, Trans::kNo, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  });
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                     ModelConfig* model, TrainConfig* train) {
  ASSIGN_OR_RETURN(auto doc, ConfigDoc::Load(path, overrides));
  *model = ModelConfig::Read(doc.get());
  *train = TrainConfig::Read(doc.get());
  RETURN_IF_ERROR(doc->Finish());
  RETURN_IF_ERROR(model->Validate().With(path));
  RETURN_IF_ERROR(train->Validate().With(path));
  if (train->seq_len > model->max_seq_len)
    return Status::Error(path + ": train.seq_len=" + std::to_string(train->seq_len) + " exceeds model.max_seq_len=" +
                         std::to_string(model->max_seq_len) + " (hint: raise model.max_seq_len)");
  if (train->seq_len <= model->mtp_depth)
    return Status::Error(path + ": train.seq_len=" + std::to_string(train->seq_len) +
                         " must exceed model.mtp_depth=" + std::to_string(model->mtp_depth));
  return Status::Ok();
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

Status RestoreModel(const LoadedCheckpoint& ckpt, Model* model, AdamWOptimizer* opt) {
  for (const auto& p : model->layout().params()) {
    if (model->config().tie_embeddings && p.name == "lm_head.weight") continue;
    RETURN_IF_ERROR(CopyTensor(ckpt.model, p.name, p.shape, model->params().data() + p.offset));
  }
  const auto& bn = model->layout().bias_names();
  for (size_t i = 0; i < bn.size(); ++i)
    RETURN_IF_ERROR(CopyTensor(ckpt.model, bn[i], {model->config().n_routed_experts}, model->biases()[i].data()));
  if (opt) {
    if (!ckpt.optimizer)
      return Status::Error(ckpt.dir + ": no optimizer state (hint: it was saved for inference only; use --fresh)");
    for (const auto& p : model->layout().params()) {
      RETURN_IF_ERROR(CopyTensor(*ckpt.optimizer, p.name + ".exp_avg", p.shape, opt->exp_avg().data() + p.offset));
      RETURN_IF_ERROR(CopyTensor(*ckpt.optimizer, p.name + ".exp_avg_sq", p.shape, opt->exp_avg_sq().data() + p.offset));
    }
  }
  return Status::Ok();
}

Status RunTraining(const RunSpec& spec) {
  ModelConfig mc;
  TrainConfig tc;
  RETURN_IF_ERROR(LoadRunConfig(spec.config_path, spec.overrides, &mc, &tc));
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
  if (!spec.fresh && env->FileExists(tc.out_dir + "/latest")) {
    ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadCheckpoint(env, tc.out_dir));
    resume = std::move(ck);
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
  const bool dist = spec.world && (spec.world->size() > 1 || !tc.parallel.trivial());
  const bool root = !spec.world || spec.world->rank() == 0;
  ASSIGN_OR_RETURN(PrecisionChoice precision, ChoosePrecision(precision_setting, mc, static_cast<int64_t>(B) * T));
  if (dist) {
    // "auto" times kernels; every rank must use rank 0's choice.
    int32_t bf16 = precision.precision == ops::GemmPrecision::kBf16;
    spec.world->Broadcast(&bf16, 1, comm::DType::kI32, 0);
    precision.precision = bf16 ? ops::GemmPrecision::kBf16 : ops::GemmPrecision::kFp32;
  }
  ops::SetGemmPrecision(precision.precision);
  if (root) LOG_INFO("precision: %s%s", precision.reason.c_str(),
           precision_from_checkpoint ? " (kept from the run's checkpoint)" : "");
  const char* precision_used = precision.precision == ops::GemmPrecision::kBf16 ? "bf16" : "fp32";

  // One process: the model and optimizer here. Distributed: DistTrainer
  // holds this rank's shard of both.
  std::unique_ptr<DistTrainer> dtr;
  std::unique_ptr<Model> single;
  if (dist) {
    ASSIGN_OR_RETURN(dtr, DistTrainer::Create(spec.world, mc, tc));
  } else {
    single = std::make_unique<Model>(mc);
    single->InitWeights(tc.seed);
  }
  Model& model = dist ? dtr->model() : *single;
  std::unique_ptr<AdamWOptimizer> single_opt;
  if (!dist) single_opt = std::make_unique<AdamWOptimizer>(model.layout(), tc.optim);
  int64_t step = 0;

  // Resume from the newest checkpoint in out_dir unless told not to.
  if (resume) {
    const LoadedCheckpoint& ck = *resume;
    auto saved_cfg = ModelConfig::FromJson(ck.manifest["model_config"]);
    if (!saved_cfg.ok()) return saved_cfg.status().With(ck.dir);
    if (saved_cfg->ToJson() != mc.ToJson())
      return Status::Error(ck.dir + ": checkpoint was written for another model config (hint: use --fresh "
                           "to start over, or train.out_dir to write elsewhere)");
    if (dist) RETURN_IF_ERROR(dtr->Restore(ck, /*with_optimizer=*/true));
    else RETURN_IF_ERROR(RestoreModel(ck, &model, single_opt.get()));
    ASSIGN_OR_RETURN(DataCursor cur, DataCursor::FromJson(ck.manifest["data_cursor"]));
    RETURN_IF_ERROR(train_data->Seek(cur));
    step = ck.step;
    if (root) LOG_INFO("resumed from %s at step %lld", ck.dir.c_str(), static_cast<long long>(step));
    resume.reset();  // unmap: everything needed was copied
  }
  if (step >= tc.steps) {
    LOG_INFO("already at step %lld of %lld: nothing to do", static_cast<long long>(step),
             static_cast<long long>(tc.steps));
    return Status::Ok();
  }
  if (root) RETURN_IF_ERROR(env->CreateDirs(tc.out_dir));
  const std::string metrics_path = tc.metrics_file.empty() ? tc.out_dir + "/metrics.jsonl" : tc.metrics_file;
  std::ofstream metrics;
  if (root) {
    metrics.open(metrics_path, std::ios::app);
    if (!metrics) return Status::Error(metrics_path + ": cannot open for writing");
  }

  // MFU is against the peak of the GEMM in use (bf16 when chosen), measured now.
  const double peak = (precision.precision == ops::GemmPrecision::kBf16 ? MeasureModelGemmPeakGflops(1024)
                                                                         : MeasureSgemmPeakGflops(1024)) * 1e9 *
                      (dist ? spec.world->size() : 1);
  const double flops_per_token = model.TrainFlopsPerToken(T);
  if (root) LOG_INFO("model: %lld parameters (%s), %s; peak GEMM %.0f GFLOP/s", static_cast<long long>(ParamLayout(mc).total()),
           mc.n_routed_experts > 0 ? "MoE" : "dense", ops::Active()->name().c_str(), peak / 1e9);

  auto save = [&](int64_t s) -> Status {
    std::vector<std::string> opt_names;
    CheckpointData data;
    data.meta = {{"step", s}, {"model_config", mc.ToJson()}, {"train_config", tc.ToJson()},
                 {"data_cursor", train_data->cursor().ToJson()}, {"rng", {{"seed", tc.seed}}},
                 {"parallel", dist ? dtr->mesh().dims().ToJson() : ParallelDims{}.ToJson()},
                 {"tokenizer", tc.data_dir + "/tokenizer.model"}, {"precision", precision_used}};
    if (dist) return dtr->Save(env, tc.out_dir, s, data.meta, static_cast<int>(tc.keep_last));
    data.model = ModelTensors(model);
    data.optimizer = OptimizerTensors(model, *single_opt, &opt_names);
    auto t0 = std::chrono::steady_clock::now();
    auto dir = SaveCheckpoint(env, tc.out_dir, s, data, static_cast<int>(tc.keep_last));
    if (!dir.ok()) return dir.status();
    LOG_INFO("checkpoint %s (%.2fs)", dir->c_str(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return Status::Ok();
  };

  const bool quiet = spec.quiet || !root;
  const bool tty = !quiet && isatty(STDERR_FILENO);
  std::vector<int32_t> batches(static_cast<size_t>(A) * B * (T + 1));
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = step;
  double tokens_done = 0;
  int64_t steps_this_run = 0;
  while (step < tc.steps) {
    ++step;
    auto t0 = std::chrono::steady_clock::now();
    std::vector<const int32_t*> micro;
    for (int a = 0; a < A; ++a) {
      int32_t* dst = batches.data() + static_cast<size_t>(a) * B * (T + 1);
      train_data->NextBatch(B, dst);
      micro.push_back(dst);
    }
    StepStats st = dist ? dtr->Step(batches.data(), A, B, T, step) : TrainOneStep(model, *single_opt, micro, B, T, step);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!std::isfinite(st.loss))
      return Status::Error("step " + std::to_string(step) + ": loss is " + std::to_string(st.loss) +
                           " (hint: lower train.lr or raise train.warmup_steps)");
    const double tok = static_cast<double>(A) * B * T;
    tokens_done += tok;
    const double tps = tok / dt;
    const double mfu = flops_per_token * tps / peak;
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    double eta = elapsed / static_cast<double>(step - first_step) * static_cast<double>(tc.steps - step);

    nlohmann::json rec = {{"step", step}, {"loss", st.loss}, {"loss_main", st.loss_main},
                          {"loss_mtp", st.loss_mtp}, {"loss_aux", st.loss_aux}, {"grad_norm", st.grad_norm},
                          {"lr", st.lr}, {"tokens_per_s", tps}, {"mfu", mfu}, {"step_s", dt},
                          {"elapsed_s", elapsed}, {"expert_load", st.expert_load},
                          {"expert_imbalance", st.max_imbalance}};
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
      rec["ranks"] = spec.world->size();
    }
    const bool do_eval = val_data && ((tc.eval_every > 0 && step % tc.eval_every == 0) || step == tc.steps);
    if (do_eval) {
      EvalResult ev = dist ? dtr->Evaluate(*val_data, B, T, tc.eval_batches)
                           : Evaluate(model, *val_data, B, T, tc.eval_batches);
      rec["val_loss"] = ev.loss;
      rec["val_ppl"] = ev.perplexity;
    }
    if (root && (step % tc.log_every == 0 || step == tc.steps || do_eval)) metrics << rec.dump() << "\n" << std::flush;
    if (!quiet && (step % tc.log_every == 0 || step == tc.steps || do_eval)) {
      char line[256];
      std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | lr %.2e | %.0f tok/s | MFU %.1f%% | ETA %s",
                    static_cast<long long>(step), static_cast<long long>(tc.steps), st.loss, st.lr, tps,
                    100 * mfu, FormatDuration(eta).c_str());
      if (do_eval) std::fprintf(stderr, "%s%s | val %.4f\n", tty ? "\r\033[K" : "", line, static_cast<double>(rec["val_loss"]));
      else if (tty) std::fprintf(stderr, "\r\033[K%s", line);
      else std::fprintf(stderr, "%s\n", line);
    }
    ++steps_this_run;
    const bool stop = spec.stop_after > 0 && steps_this_run >= spec.stop_after;
    if ((tc.ckpt_every > 0 && step % tc.ckpt_every == 0) || step == tc.steps || stop) {
      if (tty) std::fputc('\n', stderr);
      RETURN_IF_ERROR(save(step));
    }
    if (stop) break;
  }
  if (tty) std::fputc('\n', stderr);
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  if (root) LOG_INFO("done: %lld steps, %.0f tokens in %s (%.0f tok/s)", static_cast<long long>(steps_this_run), tokens_done,
           FormatDuration(total).c_str(), tokens_done / total);
  return Status::Ok();
}

}  // namespace myriad
