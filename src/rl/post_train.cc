#include "rl/post_train.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "core/check.h"
#include "core/env.h"
#include "core/log.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "rl/rollout.h"
#include "train/checkpoint/async_writer.h"
#include "train/comm/local_comm.h"
#include "train/checkpoint/checkpoint.h"
#include "train/dist_train.h"
#include "train/init_from.h"
#include "train/memory_estimate.h"
#include "train/trainer.h"

namespace myriad::rl {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A forward of `model` (whole, no hooks) over sequences [first, first + count)
// of `global` [*, T+1], in chunks of B, with `objective` on the head (rows
// carry their global sequence index).
void ForwardRows(Model& model, const int32_t* global, int64_t first, int64_t count, int B, int T,
                 HeadObjective* objective) {
  for (int64_t s = first; s < first + count; s += B) {
    const int n = static_cast<int>(std::min<int64_t>(B, first + count - s));
    model.set_head_objective(objective, s);
    (void)model.Step(global + s * (T + 1), n, T, /*backward=*/false);
  }
  model.set_head_objective(nullptr);
  model.ClearExpertLoad();
}

// Two tokenizers are the same vocabulary when every id stands for the same bytes.
Status SameVocabulary(const Tokenizer& a, const Tokenizer& b, const std::string& what) {
  if (a.vocab_size() != b.vocab_size())
    return Status::Error(what + ": its tokenizer has " + std::to_string(b.vocab_size()) + " tokens, the student's " +
                         std::to_string(a.vocab_size()) +
                         " (hint: distillation compares next-token distributions id by id; teacher and student "
                         "must share one tokenizer)");
  for (int id = 0; id < a.vocab_size(); ++id)
    if (a.DecodePiece(id) != b.DecodePiece(id) || a.is_special(id) != b.is_special(id))
      return Status::Error(what + ": token " + std::to_string(id) + " is '" + a.PieceName(id) +
                           "' for the student and '" + b.PieceName(id) +
                           "' for the teacher (hint: teacher and student must share one tokenizer)");
  return Status::Ok();
}



struct Teacher {
  TeacherConfig cfg;
  LoadedPolicy policy;                     // in-process
  std::unique_ptr<serve::Engine> engine;  // in-process: sft_source = teacher and measured selection
  std::unique_ptr<RemoteTeacher> remote;  // a `myriad serve` endpoint
};

// The teachers' view of the local sequences [seq_base, seq_base + count) of
// the global batch `tokens` [S, T+1] (prompt plen[s], response rlen[s]):
// full logits when top_k == 0 (in-process teachers only), else each cell's
// top_k ids and logprobs, from the in-process teacher's logits or the
// remote teacher's scoring of the sequence's real tokens.
Result<std::shared_ptr<TeacherRows>> TeacherView(std::vector<Teacher>& teachers, const std::vector<int>& teacher_of,
                                                 const std::vector<int32_t>& tokens, const std::vector<int32_t>& plen,
                                                 const std::vector<int32_t>& rlen, int64_t S, int64_t seq_base,
                                                 int64_t count, int B, int T, int64_t V, int top_k) {
  auto rows = std::make_shared<TeacherRows>();
  rows->vocab = V;
  rows->top_k = top_k;
  const size_t cells = static_cast<size_t>(S) * T;
  if (top_k == 0) rows->logits.assign(cells * V, 0.f);
  else rows->ids.assign(cells * top_k, 0), rows->logprobs.assign(cells * top_k, 0.f);
  const std::set<int> used(teacher_of.begin(), teacher_of.end());
  TeacherRows full;  // an in-process teacher's logits, when only some sequences are its
  full.vocab = V;
  for (int ti : used) {
    Teacher& t = teachers[ti];
    std::vector<int64_t> mine;  // global sequence indices
    for (int64_t k = 0; k < count; ++k)
      if (teacher_of[k] == ti) mine.push_back(seq_base + k);
    if (t.remote) {
      std::vector<std::vector<int32_t>> seqs;
      std::vector<int64_t> scored;
      for (int64_t s : mine) {
        if (rlen[s] == 0) continue;  // nothing to learn from
        const int32_t* row = tokens.data() + s * (T + 1);
        seqs.emplace_back(row, row + plen[s] + rlen[s]);
        scored.push_back(s);
      }
      ASSIGN_OR_RETURN(auto got, t.remote->Score(seqs));
      for (size_t i = 0; i < scored.size(); ++i)
        for (size_t j = 0; j < got[i].size() && j < static_cast<size_t>(T); ++j) {
          const size_t cell = static_cast<size_t>(scored[i]) * T + j;
          for (int u = 0; u < top_k; ++u) {
            rows->ids[cell * top_k + u] = got[i][j].top[u].first;
            rows->logprobs[cell * top_k + u] = got[i][j].top[u].second;
          }
        }
      continue;
    }
    const bool direct = top_k == 0 && used.size() == 1;
    TeacherRows* into = direct ? rows.get() : &full;
    if (!direct) full.logits.assign(cells * V, 0.f);
    LogitsRecorder rec(T, into);
    ForwardRows(*t.policy.model, tokens.data(), seq_base, count, B, T, &rec);
    if (direct) continue;
    for (int64_t s : mine) {
      const size_t first = static_cast<size_t>(s) * T;
      if (top_k == 0) {
        std::copy_n(full.logits.begin() + first * V, static_cast<size_t>(T) * V, rows->logits.begin() + first * V);
        continue;
      }
      for (size_t cell = first; cell < first + T; ++cell) {
        const TokenLogprobs lp = LogprobsOf(full.logits.data() + cell * V, V, 0, top_k);
        for (int u = 0; u < top_k; ++u) {
          rows->ids[cell * top_k + u] = lp.top[u].first;
          rows->logprobs[cell * top_k + u] = lp.top[u].second;
        }
      }
    }
  }
  return rows;
}

// The task pools: generated per domain, or a file's (every tenth task by
// position held out).
Status BuildTasks(const PostTrainConfig& pc, uint64_t seed, std::vector<Task>* train, std::vector<Task>* held) {
  if (!pc.tasks_file.empty()) {
    ASSIGN_OR_RETURN(std::vector<Task> all, LoadTasksJsonl(pc.tasks_file));
    if (all.empty()) return Status::Error(pc.tasks_file + ": no tasks");
    for (size_t i = 0; i < all.size(); ++i) (i % 10 == 9 ? held : train)->push_back(std::move(all[i]));
    if (train->empty()) return Status::Error(pc.tasks_file + ": no training tasks (one task is held out)");
    return Status::Ok();
  }
  for (const std::string& d : pc.domains) {
    ASSIGN_OR_RETURN(std::vector<Task> tr, GenerateTasks(d, pc.train_tasks, pc.difficulty, seed, Split::kTrain));
    ASSIGN_OR_RETURN(std::vector<Task> ho, GenerateTasks(d, pc.eval_tasks, pc.difficulty, seed, Split::kHeldOut));
    for (auto& t : tr) train->push_back(std::move(t));
    for (auto& t : ho) held->push_back(std::move(t));
  }
  return Status::Ok();
}


}  // namespace

Status RunPostTraining(const PostTrainSpec& spec) {
  const Algorithm default_algo = spec.verb == "distill" ? Algorithm::kDistill : Algorithm::kGrpo;
  ModelConfig mc;
  TrainConfig tc;
  PostTrainConfig pc;
  const auto refused = [&](Status s) {
    if (spec.exit_code) *spec.exit_code = kExitConfig;
    return s;
  };
  Status loaded = LoadRunConfig(spec.config_path, spec.overrides, &mc, &tc, [&](ConfigDoc* doc) {
    pc = PostTrainConfig::Read(doc, default_algo);
  });
  if (!loaded.ok()) return refused(loaded);
  if (tc.init_from.empty())
    return refused(Status::Error(spec.config_path + ": train.init_from must name the policy's starting model "
                                 "(a checkpoint or Hugging Face folder; post-training starts from a trained model)"));
  // One rollout batch: prompts_per_step x group_size sequences of seq_len+1
  // tokens = train.batch_size x train.grad_accum.
  const int P = pc.prompts_per_step, G = pc.group_size;
  const int64_t S = static_cast<int64_t>(P) * G;
  if (S % tc.batch_size != 0)
    return refused(Status::Error(spec.config_path + ": rl.prompts_per_step x rl.group_size = " + std::to_string(S) +
                                 " sequences must be a multiple of train.batch_size = " +
                                 std::to_string(tc.batch_size)));
  tc.grad_accum = S / tc.batch_size;
  tc.optim.steps = tc.steps * pc.inner_steps;  // the LR schedule runs over optimizer steps
  if (Status s = tc.CheckSizes(mc); !s.ok()) return refused(s.With(spec.config_path));

  std::unique_ptr<comm::Comm> self;
  comm::Comm* world = spec.world;
  if (!world) {
    self = comm::MakeSelfComm();
    world = self.get();
  }
  const bool dist = world->size() > 1, root = world->rank() == 0;
  if (dist && (tc.parallel.zero == 3))
    return refused(Status::Error(spec.config_path + ": post-training under mpirun needs the whole model on every rank "
                                 "(each rank's engine samples it): parallel.zero must be 0, 1 or 2"));
  if (Status s = CheckRunMemory(mc, tc, world); !s.ok()) return refused(s.With(spec.config_path));
  if (tc.threads > 0) omp_set_num_threads(static_cast<int>(tc.threads));
  // fp32 throughout: the engine's samples, the behaviour logprobs and the
  // step see the same arithmetic (train.precision is not used here).
  ops::SetGemmPrecision(ops::GemmPrecision::kFp32);
  Env* env = Env::Default();
  const int B = static_cast<int>(tc.batch_size), T = static_cast<int>(tc.seq_len), A = static_cast<int>(tc.grad_accum);

  ASSIGN_OR_RETURN(std::unique_ptr<DistTrainer> dtr, DistTrainer::Create(world, mc, tc));
  const ParallelDims dims = dtr->mesh().dims();
  if (dims.tp > 1 || dims.ep > 1 || dims.pp > 1 || dims.cp > 1)
    return refused(Status::Error(spec.config_path + ": post-training runs data-parallel only (its engine samples the "
                                 "whole model on every rank): parallel.tp, ep, pp and cp must be 1"));
  const int D = world->size(), rank = world->rank();
  if (P % D != 0)
    return refused(Status::Error(spec.config_path + ": rl.prompts_per_step = " + std::to_string(P) +
                                 " must be a multiple of the " + std::to_string(D) + " ranks (each samples its share)"));

  // The policy's tokenizer and conventions (its checkpoint's or folder's).
  if (!spec.load_model) return Status::Error("post-training: no model loader");
  ASSIGN_OR_RETURN(LoadedPolicy start, spec.load_model(tc.init_from));
  if (start.tokenizer_path.empty())
    return Status::Error(tc.init_from + ": names no tokenizer (hint: a checkpoint of `myriad train` records it)");
  ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::Load(start.tokenizer_path));
  if (tok.vocab_size() > mc.vocab_size)
    return Status::Error(start.tokenizer_path + ": " + std::to_string(tok.vocab_size()) +
                         " tokens for a model of vocab_size " + std::to_string(mc.vocab_size));
  const TextConventions text = TextConventions::For(tok, start.eos_token_ids);
  std::unique_ptr<Model> reference;  // frozen: the KL's reference policy
  if (pc.algorithm == Algorithm::kGrpo && pc.policy.kl_beta > 0) reference = std::move(start.model);
  start.model.reset();

  // Tasks.
  std::vector<Task> train_tasks, held_out;
  RETURN_IF_ERROR(BuildTasks(pc, tc.seed, &train_tasks, &held_out));
  std::set<std::string> domains;
  for (const Task& t : train_tasks) domains.insert(t.domain);

  // Teachers: loaded whole, vocabularies checked against the student's.
  std::vector<Teacher> teachers;
  const bool use_teachers =
      pc.algorithm == Algorithm::kDistill || (pc.algorithm == Algorithm::kSft && pc.sft_source == "teacher");
  serve::EngineConfig ec;
  ec.max_batch = pc.engine_max_batch;
  ec.max_queue = std::max(64, pc.engine_max_batch * 4);
  // Top-k teacher distributions: asked for, or what a remote teacher gives.
  int teacher_top_k = pc.teacher_top_k;
  const bool any_remote =
      use_teachers && std::any_of(pc.teachers.begin(), pc.teachers.end(), [](const TeacherConfig& t) { return t.remote(); });
  if (any_remote && teacher_top_k == 0) {
    teacher_top_k = 5;
    if (root) LOG_INFO("distill: a remote teacher gives top-k logprobs; every teacher's top %d (distill.top_k)", teacher_top_k);
  }
  if (use_teachers) {
    for (const TeacherConfig& tcfg : pc.teachers) {
      const std::string what = "distill.teachers: " + tcfg.path;
      if (tcfg.remote()) {
        RemoteTeacherOptions ro = pc.remote;
        ro.top_k = teacher_top_k;
        if (!pc.api_key_env.empty()) {
          const char* key = std::getenv(pc.api_key_env.c_str());
          if (key == nullptr || *key == '\0')
            return refused(Status::Error("distill.api_key_env = " + pc.api_key_env + ": that environment variable is "
                                         "not set (it holds the teachers' API key)"));
          ro.api_key = key;
        }
        auto rt = RemoteTeacher::Connect(tcfg.path, tok, mc.vocab_size, ro);
        if (!rt.ok()) return refused(Status::Error(what + ": " + rt.status().message()));
        if (rt->context_length() > 0 && rt->context_length() < T + 1)
          return refused(Status::Error(what + ": the teacher's context is " + std::to_string(rt->context_length()) +
                                       " tokens, a scored row has up to train.seq_len + 1 = " + std::to_string(T + 1) +
                                       " (hint: lower train.seq_len)"));
        if (root)
          LOG_INFO("teacher %s: remote model '%s', top-%d logprobs of the student's tokens", tcfg.path.c_str(),
                   rt->model().c_str(), teacher_top_k);
        Teacher t{tcfg, LoadedPolicy{}, nullptr, std::make_unique<RemoteTeacher>(std::move(rt).value())};
        teachers.push_back(std::move(t));
        continue;
      }
      auto lp = spec.load_model(tcfg.path);
      if (!lp.ok()) return refused(lp.status().With(what));
      Teacher t{tcfg, std::move(lp).value(), nullptr, nullptr};
      if (t.policy.model->config().max_seq_len < T)
        return refused(Status::Error(what + ": the teacher's model.max_seq_len = " +
                                     std::to_string(t.policy.model->config().max_seq_len) + " < train.seq_len = " +
                                     std::to_string(T)));
      if (t.policy.model->config().vocab_size != mc.vocab_size)
        return refused(Status::Error(what + ": the teacher's model has vocab_size " +
                                     std::to_string(t.policy.model->config().vocab_size) + ", the student's " +
                                     std::to_string(mc.vocab_size) +
                                     " (hint: teacher and student must share one tokenizer)"));
      ASSIGN_OR_RETURN(Tokenizer ttok, Tokenizer::Load(t.policy.tokenizer_path));
      if (Status s = SameVocabulary(tok, ttok, what); !s.ok()) return refused(s);
      ASSIGN_OR_RETURN(t.engine, serve::Engine::Create(t.policy.model.get(), ec));
      teachers.push_back(std::move(t));
    }
  }

  // Resume, or start from the policy's weights.
  int64_t iter = 0;
  std::map<std::string, int> teacher_for;  // domain -> index in teachers
  if (!spec.fresh && env->FileExists(tc.out_dir)) {
    ASSIGN_OR_RETURN(std::vector<std::string> found, ListCheckpoints(env, tc.out_dir));
    if (!found.empty()) {
      std::vector<std::string> skipped;
      ASSIGN_OR_RETURN(LoadedCheckpoint ck, LoadNewestValidCheckpoint(env, tc.out_dir, &skipped));
      auto saved = ModelConfig::FromJson(ck.manifest["model_config"]);
      if (!saved.ok()) return saved.status().With(ck.dir);
      if (saved->ToJson() != mc.ToJson())
        return Status::Error(ck.dir + ": checkpoint was written for another model (hint: --fresh to start over)");
      if (!ck.manifest.contains("post_train"))
        return Status::Error(ck.dir + ": not a post-training checkpoint (hint: --fresh, or another train.out_dir)");
      RETURN_IF_ERROR(dtr->Restore(ck, /*with_optimizer=*/true));
      iter = ck.step;
      if (ck.manifest["post_train"].contains("teacher_for"))
        teacher_for = ck.manifest["post_train"]["teacher_for"].get<std::map<std::string, int>>();
      if (root) LOG_INFO("resumed from %s at iteration %lld", ck.dir.c_str(), static_cast<long long>(iter));
    }
  }
  if (iter == 0) {
    ASSIGN_OR_RETURN(InitSource src, ResolveInitSource(env, tc.init_from));
    RETURN_IF_ERROR(LoadInitWeights(env, src, dtr.get()).With("train.init_from=" + tc.init_from));
  }

  // The prompts must fit a training row with their responses.
  TaskSampler sampler;
  sampler.tok = &tok;
  sampler.text = &text;
  sampler.max_tokens = pc.max_tokens;
  sampler.reward_threads = pc.reward_threads;
  sampler.reward = pc.reward;
  const std::vector<int32_t> newline = tok.Encode("\n");
  std::vector<std::vector<int32_t>> train_prompts;
  for (const Task& t : train_tasks) train_prompts.push_back(sampler.PromptIds(t));
  for (size_t i = 0; i < train_tasks.size(); ++i) {
    const int64_t need = static_cast<int64_t>(train_prompts[i].size()) + pc.max_tokens + static_cast<int64_t>(newline.size());
    if (need > T + 1)
      return refused(Status::Error(spec.config_path + ": task " + train_tasks[i].id + "'s prompt (" +
                                   std::to_string(train_prompts[i].size()) + " tokens) + rl.max_tokens = " +
                                   std::to_string(need) + " tokens exceed train.seq_len + 1 = " + std::to_string(T + 1) +
                                   " (hint: raise train.seq_len or lower rl.max_tokens)"));
  }

  // The policy's engine reads the trainer's model in place.
  ASSIGN_OR_RETURN(std::unique_ptr<serve::Engine> engine, serve::Engine::Create(&dtr->model(), ec));
  sampler.engine = engine.get();

  // Which teacher teaches each domain: by tag, or by measured held-out score.
  if (use_teachers && teacher_for.empty()) {
    for (const std::string& d : domains) {
      int pick = -1;
      if (pc.teacher_select == "domain") {
        for (size_t i = 0; i < teachers.size() && pick < 0; ++i)
          if (teachers[i].cfg.domain == d) pick = static_cast<int>(i);
        for (size_t i = 0; i < teachers.size() && pick < 0; ++i)
          if (teachers[i].cfg.domain.empty()) pick = static_cast<int>(i);
        if (pick < 0)
          return refused(Status::Error(spec.config_path + ": distill.teachers: no teacher for domain '" + d +
                                       "' (hint: add " + d + "=PATH, or *=PATH for any domain)"));
        if (root) LOG_INFO("teacher for %s: %s (by domain tag)", d.c_str(), teachers[pick].cfg.path.c_str());
      } else {
        std::vector<Task> probe;
        for (const Task& t : held_out)
          if (t.domain == d) probe.push_back(t);
        if (probe.empty()) return Status::Error("distill.select = measured: no held-out tasks of domain " + d);
        double best = -1;
        std::string report;
        for (size_t i = 0; i < teachers.size(); ++i) {
          TaskSampler ts = sampler;
          ts.engine = teachers[i].engine.get();
          ASSIGN_OR_RETURN(HeldOutScores sc, EvaluateHeldOut(ts, probe, pc.eval_samples, pc.temperature, tc.seed));
          char b[160];
          std::snprintf(b, sizeof b, "%s%s pass@1 %.3f", report.empty() ? "" : ", ", teachers[i].cfg.path.c_str(),
                        sc.all.pass1);
          report += b;
          if (sc.all.pass1 > best) best = sc.all.pass1, pick = static_cast<int>(i);
        }
        if (root)
          LOG_INFO("teacher for %s: %s (measured on %zu held-out problems: %s)", d.c_str(),
                   teachers[pick].cfg.path.c_str(), probe.size(), report.c_str());
      }
      teacher_for[d] = pick;
    }
  }

  // Output: metrics, checkpoints.
  if (root) RETURN_IF_ERROR(env->CreateDirs(tc.out_dir));
  const std::string metrics_path = tc.metrics_file.empty() ? tc.out_dir + "/metrics.jsonl" : tc.metrics_file;
  std::ofstream metrics;
  if (root) {
    metrics.open(metrics_path, iter == 0 ? std::ios::trunc : std::ios::app);
    if (!metrics) return Status::Error(metrics_path + ": cannot open for writing");
  }
  std::unique_ptr<AsyncCheckpointWriter> writer;
  if (root) writer = std::make_unique<AsyncCheckpointWriter>(env, tc.out_dir, static_cast<int>(tc.keep_last));
  auto save = [&](int64_t it) -> Status {
    nlohmann::json meta = {{"step", it},
                           {"model_config", mc.ToJson()},
                           {"train_config", tc.ToJson()},
                           {"tokenizer", start.tokenizer_path},
                           {"post_train", {{"config", pc.ToJson()}, {"teacher_for", teacher_for}}},
                           {"parallel", dims.ToJson()}};
    std::unique_ptr<CheckpointSnapshot> snap = dtr->Snapshot(it, meta);
    if (!root) return Status::Ok();
    RETURN_IF_ERROR(writer->Submit(std::move(snap), 0.0));
    return writer->Wait();
  };
  auto log_line = [&](const std::string& line) {
    if (root && !spec.quiet) std::fprintf(stderr, "%s\n", line.c_str());
  };
  auto evaluate = [&](int64_t it, nlohmann::json* rec) -> Status {
    if (!root || held_out.empty()) return Status::Ok();
    ASSIGN_OR_RETURN(HeldOutScores sc,
                     EvaluateHeldOut(sampler, held_out, pc.eval_samples, pc.temperature, tc.seed ^ 0x5eedULL));
    (*rec)["eval"] = sc.ToJson();
    char b[256];
    std::snprintf(b, sizeof b, "eval @%lld | pass@1 %.3f | pass@%d %.3f | greedy %.3f | %d problems | %.1fs",
                  static_cast<long long>(it), sc.all.pass1, pc.eval_samples, sc.all.passk, sc.all.greedy,
                  sc.all.problems, sc.seconds);
    std::string line = b;
    if (sc.domains.size() > 1)
      for (const auto& [d, x] : sc.domains) {
        std::snprintf(b, sizeof b, " | %s %.3f", d.c_str(), x.pass1);
        line += b;
      }
    log_line(line);
    return Status::Ok();
  };

  if (root)
    LOG_INFO("%s: %zu training and %zu held-out tasks (%s); %d prompts x %d samples per iteration, %d optimizer "
             "step(s) each; iterations %lld..%lld",
             AlgorithmName(pc.algorithm), train_tasks.size(), held_out.size(),
             pc.tasks_file.empty() ? "generated" : pc.tasks_file.c_str(), P, G, pc.inner_steps,
             static_cast<long long>(iter + 1), static_cast<long long>(tc.steps));
  if (iter == 0) {
    nlohmann::json rec = {{"iteration", 0}};
    RETURN_IF_ERROR(evaluate(0, &rec));
    if (root && rec.contains("eval")) metrics << rec.dump() << "\n" << std::flush;
  }

  const int64_t local_prompts = P / D, local_seqs = local_prompts * G, seq_base = rank * local_seqs;
  std::vector<int32_t> tokens(S * (T + 1));
  std::vector<int32_t> plen(S), rlen(S);
  std::vector<double> rewards(S), correct(S);
  const auto run_start = Clock::now();
  const int64_t first_iter = iter;
  int64_t iters_this_run = 0;
  while (iter < tc.steps) {
    ++iter;
    const auto t_iter = Clock::now();
    // The prompts: a function of (seed, iteration) only.
    Rng pick(tc.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(iter));
    std::vector<int> chosen(P);
    for (int& c : chosen) c = static_cast<int>(pick.Below(train_tasks.size()));
    std::vector<std::vector<int32_t>> my_prompts;
    for (int64_t i = 0; i < local_prompts; ++i) my_prompts.push_back(train_prompts[chosen[rank * local_prompts + i]]);

    // 1. Rollouts: the policy's samples (GRPO, distillation), the
    //    references (SFT) or a teacher's samples (SFT on teacher samples).
    const auto t_roll = Clock::now();
    serve::GenerationParams gp;
    gp.max_tokens = pc.max_tokens;
    gp.sampling = SamplingParams{static_cast<float>(pc.temperature), pc.top_k, static_cast<float>(pc.top_p)};
    gp.stop_token_seqs = sampler.StopSeqs();
    const uint64_t roll_seed = tc.seed * 1000003ULL + static_cast<uint64_t>(iter);
    std::vector<std::vector<int32_t>> completions(local_seqs);
    std::vector<bool> stopped(local_seqs, false);
    RolloutStats rs;
    if (pc.algorithm == Algorithm::kSft && pc.sft_source == "reference") {
      for (int64_t i = 0; i < local_prompts; ++i) {
        const Task& t = train_tasks[chosen[rank * local_prompts + i]];
        if (t.reference.empty()) return Status::Error("task " + t.id + " has no reference to fine-tune on");
        for (int g = 0; g < G; ++g) completions[i * G + g] = tok.Encode(t.reference);
      }
    } else if (pc.algorithm == Algorithm::kSft) {
      // Each prompt's teacher samples it (grouped by teacher).
      for (size_t ti = 0; ti < teachers.size(); ++ti) {
        std::vector<std::vector<int32_t>> mine;
        std::vector<int64_t> which;
        for (int64_t i = 0; i < local_prompts; ++i)
          if (teacher_for[train_tasks[chosen[rank * local_prompts + i]].domain] == static_cast<int>(ti))
            mine.push_back(my_prompts[i]), which.push_back(i);
        if (mine.empty()) continue;
        RolloutStats one;
        ASSIGN_OR_RETURN(std::vector<Sample> got, Rollout(*teachers[ti].engine, mine, G, gp, roll_seed, &one));
        rs.prompt_tokens += one.prompt_tokens, rs.cached_tokens += one.cached_tokens;
        rs.completion_tokens += one.completion_tokens, rs.requests += one.requests;
        for (const Sample& x : got) {
          const int64_t k = which[x.prompt_index] * G + x.sample_index;
          completions[k] = x.completion;
          stopped[k] = x.finish_reason == "stop";
        }
      }
    } else {
      ASSIGN_OR_RETURN(std::vector<Sample> got, Rollout(*engine, my_prompts, G, gp, roll_seed, &rs));
      for (const Sample& x : got) {
        completions[x.prompt_index * G + x.sample_index] = x.completion;
        stopped[x.prompt_index * G + x.sample_index] = x.finish_reason == "stop";
      }
    }
    const double rollout_s = Since(t_roll);

    // 2. Rewards.
    const auto t_score = Clock::now();
    std::vector<const Task*> which(local_seqs);
    std::vector<std::string> texts(local_seqs);
    for (int64_t k = 0; k < local_seqs; ++k) {
      which[k] = &train_tasks[chosen[rank * local_prompts + k / G]];
      texts[k] = sampler.CompletionText(completions[k]);
    }
    const std::vector<RewardResult> scored = ScoreAll(which, texts, pc.reward, pc.reward_threads);
    const double score_s = Since(t_score);

    // 3. The global batch: every rank's slice, then summed over ranks.
    std::fill(tokens.begin(), tokens.end(), 0);
    std::fill(plen.begin(), plen.end(), 0);
    std::fill(rlen.begin(), rlen.end(), 0);
    std::fill(rewards.begin(), rewards.end(), 0.0);
    std::fill(correct.begin(), correct.end(), 0.0);
    for (int64_t k = 0; k < local_seqs; ++k) {
      const int64_t s = seq_base + k;
      std::vector<int32_t> row = my_prompts[k / G];
      const int p = static_cast<int>(row.size());
      std::vector<int32_t> resp = completions[k];
      if (stopped[k]) resp.insert(resp.end(), newline.begin(), newline.end());  // the stop the engine did not emit
      resp.resize(std::min<size_t>(resp.size(), static_cast<size_t>(T + 1 - p)));
      row.insert(row.end(), resp.begin(), resp.end());
      std::copy(row.begin(), row.end(), tokens.begin() + s * (T + 1));
      plen[s] = p;
      rlen[s] = static_cast<int>(resp.size());
      rewards[s] = scored[k].reward;
      correct[s] = scored[k].correct;
    }
    if (dist) {
      world->AllReduce(tokens.data(), tokens.size(), comm::DType::kI32, comm::ReduceOp::kSum);
      world->AllReduce(plen.data(), S, comm::DType::kI32, comm::ReduceOp::kSum);
      world->AllReduce(rlen.data(), S, comm::DType::kI32, comm::ReduceOp::kSum);
      world->AllReduce(rewards.data(), S, comm::DType::kF64, comm::ReduceOp::kSum);
      world->AllReduce(correct.data(), S, comm::DType::kF64, comm::ReduceOp::kSum);
    }
    std::vector<int> pl(plen.begin(), plen.end()), rl(rlen.begin(), rlen.end());
    std::vector<float> coef = TokenWeights(pl, rl, T, pc.loss_norm);

    // 4. The objective and its tables.
    const auto t_train = Clock::now();
    std::unique_ptr<GrpoObjective> grpo;
    std::unique_ptr<DistillObjective> distill;
    std::unique_ptr<NllObjective> nll;
    std::unique_ptr<SumObjective> sum;
    HeadObjective* obj = nullptr;
    double ratio_first_min = 1, ratio_first_max = 1;
    const bool want_grpo = pc.algorithm == Algorithm::kGrpo ||
                           (pc.algorithm == Algorithm::kDistill && pc.reward_weight > 0);
    if (want_grpo) {
      LogprobRecorder old(S, T);
      dtr->Forward(tokens.data(), A, B, T, &old);
      std::vector<float> ref;
      if (reference) {
        LogprobRecorder rr(S, T);
        ForwardRows(*reference, tokens.data(), seq_base, local_seqs, B, T, &rr);
        ref = rr.logp();
      }
      grpo = std::make_unique<GrpoObjective>(pc.policy, T, coef, old.logp(), std::move(ref),
                                             GroupAdvantages(rewards, G, pc.scale_by_std));
      obj = grpo.get();
    }
    if (pc.algorithm == Algorithm::kDistill) {
      std::vector<int> teacher_of(local_seqs);
      for (int64_t k = 0; k < local_seqs; ++k) teacher_of[k] = teacher_for[which[k]->domain];
      ASSIGN_OR_RETURN(std::shared_ptr<TeacherRows> rows,
                       TeacherView(teachers, teacher_of, tokens, plen, rlen, S, seq_base, local_seqs, B, T,
                                   mc.vocab_size, teacher_top_k));
      distill = std::make_unique<DistillObjective>(pc.distill_loss, T, coef, rows);
      obj = distill.get();
      if (grpo) {
        sum = std::make_unique<SumObjective>(std::vector<std::pair<HeadObjective*, double>>{
            {distill.get(), 1.0}, {grpo.get(), pc.reward_weight}});
        obj = sum.get();
      }
    }
    if (pc.algorithm == Algorithm::kSft) {
      nll = std::make_unique<NllObjective>(T, coef);
      obj = nll.get();
    }

    // 5. Optimizer steps on the batch (the ratio to the behaviour policy's
    //    logprobs moves from the second on).
    StepStats st;
    ObjectiveStats last_stats;
    for (int k = 0; k < pc.inner_steps; ++k) {
      if (grpo) grpo->Reset();
      if (distill) distill->Reset();
      if (nll) nll->Reset();
      st = dtr->Step(tokens.data(), A, B, T, (iter - 1) * pc.inner_steps + k + 1, obj);
      const ObjectiveStats& os = distill ? distill->stats() : grpo ? grpo->stats() : nll->stats();
      if (k == 0 && grpo) ratio_first_min = grpo->stats().ratio_min, ratio_first_max = grpo->stats().ratio_max;
      last_stats = os;
    }
    RETURN_IF_ERROR(engine->WeightsChanged());
    const double train_s = Since(t_train);

    // 6. Metrics (objective statistics summed over ranks).
    double agg[6] = {static_cast<double>(last_stats.tokens), last_stats.loss, last_stats.clipped,
                     last_stats.kl_sum, last_stats.entropy_sum, static_cast<double>(rs.completion_tokens)};
    double mm[2] = {-ratio_first_min, ratio_first_max};
    if (dist) {
      world->AllReduce(agg, 6, comm::DType::kF64, comm::ReduceOp::kSum);
      world->AllReduce(mm, 2, comm::DType::kF64, comm::ReduceOp::kMax);
    }
    double rmean = 0, rvar = 0, acc = 0, len = 0;
    for (int64_t s = 0; s < S; ++s) rmean += rewards[s], acc += correct[s], len += rlen[s];
    rmean /= S, acc /= S, len /= S;
    for (int64_t s = 0; s < S; ++s) rvar += (rewards[s] - rmean) * (rewards[s] - rmean);
    const double rstd = std::sqrt(rvar / S);
    const double toks = std::max(1.0, agg[0]);
    const double iter_s = Since(t_iter);
    nlohmann::json rec = {{"iteration", iter},
                          {"optimizer_step", iter * pc.inner_steps},
                          {"reward_mean", rmean},
                          {"reward_std", rstd},
                          {"correct", acc},
                          {"response_len", len},
                          {"loss", st.loss.total},
                          {"grad_norm", st.grad_norm},
                          {"lr", st.lr},
                          {"kl", agg[3] / toks},
                          {"entropy", agg[4] / toks},
                          {"clip_fraction", agg[2] / toks},
                          {"rollout_s", rollout_s},
                          {"score_s", score_s},
                          {"train_s", train_s},
                          {"iteration_s", iter_s},
                          {"rollout_fraction", rollout_s / iter_s},
                          {"rollout_tokens", agg[5]},
                          {"rollout_tokens_per_s", rollout_s > 0 ? agg[5] / rollout_s : 0.0},
                          {"prefix_cached_tokens", rs.cached_tokens}};
    if (grpo) {  // the importance ratio's range over the batch at the first inner step (1 and 1)
      rec["ratio_min_first_step"] = -mm[0];
      rec["ratio_max_first_step"] = mm[1];
    }
    if (dist) rec["ranks"] = D;
    ++iters_this_run;
    const double elapsed = Since(run_start);
    const double eta = elapsed / static_cast<double>(iter - first_iter) * static_cast<double>(tc.steps - iter);
    if (root && !spec.quiet && (iter % tc.log_every == 0 || iter == tc.steps)) {
      char line[320];
      std::snprintf(line, sizeof line,
                    "iter %lld/%lld | reward %.3f±%.3f | correct %.3f | kl %.4f | entropy %.3f | len %.1f | clip %.1f%% "
                    "| rollout %.2fs train %.2fs (%.0f%% rollout, %.0f tok/s) | ETA %s",
                    static_cast<long long>(iter), static_cast<long long>(tc.steps), rmean, rstd, acc,
                    static_cast<double>(rec["kl"]), static_cast<double>(rec["entropy"]), len,
                    100 * static_cast<double>(rec["clip_fraction"]), rollout_s, train_s, 100 * rollout_s / iter_s,
                    static_cast<double>(rec["rollout_tokens_per_s"]), FormatDuration(eta).c_str());
      log_line(line);
    }
    if ((pc.eval_every > 0 && iter % pc.eval_every == 0) || iter == tc.steps) RETURN_IF_ERROR(evaluate(iter, &rec));
    if (root) {
      metrics << rec.dump() << "\n" << std::flush;
      if (!metrics) {
        LOG_WARN("%s: cannot write metrics; training goes on", metrics_path.c_str());
        metrics.clear();
      }
    }
    const bool stop = spec.stop_after > 0 && iters_this_run >= spec.stop_after;
    if ((tc.ckpt_every > 0 && iter % tc.ckpt_every == 0) || iter == tc.steps || stop) RETURN_IF_ERROR(save(iter));
    if (stop) break;
  }
  engine->Shutdown();
  for (Teacher& t : teachers)
    if (t.engine) t.engine->Shutdown();
  if (root)
    LOG_INFO("done: %lld iterations in %s; checkpoints in %s", static_cast<long long>(iters_this_run),
             FormatDuration(Since(run_start)).c_str(), tc.out_dir.c_str());
  return Status::Ok();
}

}  // namespace myriad::rl
