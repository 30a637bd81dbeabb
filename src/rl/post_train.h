// Post-training runs: `myriad rl` (GRPO with verifiable rewards, or SFT on
// the tasks' references as its baseline) and `myriad distill` (on-policy
// distillation from one teacher per domain: MOPD). One loop for all three:
// each iteration samples the policy through the serving engine in-process,
// scores what it wrote, and takes optimizer steps on DistTrainer with a head
// objective (rl/objective.h); the engine then follows the weights changed in
// place. docs/rl.md has the loop, the config keys and the metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/status.h"
#include "data/text_conventions.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "rl/objective.h"
#include "rl/remote_teacher.h"
#include "rl/reward.h"
#include "rl/tasks.h"
#include "serve/engine.h"
#include "train/comm/comm.h"

namespace myriad::rl {

enum class Algorithm { kGrpo, kSft, kDistill };
const char* AlgorithmName(Algorithm a);  // "grpo", "sft", "distill"

struct TeacherConfig {
  // A checkpoint (run or step directory) or Hugging Face folder, loaded
  // in-process; or the http:// URL of a `myriad serve` (a remote teacher).
  std::string path;
  std::string domain;  // the domain it teaches ("" with select = "measured": any)
  bool remote() const { return path.rfind("http://", 0) == 0; }
};

// [rl] (and [distill] for distillation).
struct PostTrainConfig {
  Algorithm algorithm = Algorithm::kGrpo;
  // Tasks: generated domains (tasks.h), or a JSONL file of them.
  std::vector<std::string> domains = {"arithmetic"};
  std::string tasks_file;
  int difficulty = 1;
  int train_tasks = 4096;   // training pool (generated) per domain
  int eval_tasks = 200;     // held-out problems per domain
  // Rollouts: prompts_per_step * group_size sequences per iteration, which
  // is train.batch_size * train.grad_accum (grad_accum is set from it).
  int prompts_per_step = 8;
  int group_size = 8;
  int max_tokens = 16;
  double temperature = 1.0;
  int top_k = 0;
  double top_p = 1.0;
  int engine_max_batch = 32;
  // The policy step.
  int inner_steps = 1;      // optimizer steps per rollout batch (ratio to the behaviour policy)
  LossNorm loss_norm = LossNorm::kToken;
  PolicyLossConfig policy;
  bool scale_by_std = true;
  RewardOptions reward;
  int reward_threads = 4;   // completions scored at once (python: sandboxed subprocesses)
  // Held-out evaluation every eval_every iterations (0: start and end only):
  // pass@1 and pass@k over eval_samples samples per problem at the rollout
  // temperature, and greedy accuracy.
  int eval_every = 10;
  int eval_samples = 4;
  // [distill]
  std::vector<TeacherConfig> teachers;
  std::string teacher_select = "domain";  // "domain" | "measured"
  DistillLoss distill_loss = DistillLoss::kReverseKl;
  double reward_weight = 0.0;             // > 0: + this x the GRPO term of the verifier reward
  // Teachers' distributions: 0 full (in-process teachers only), or their
  // top k tokens (1..5), both distributions renormalised there. With a
  // remote teacher every teacher gives its top k (5 when this is 0).
  int teacher_top_k = 0;
  RemoteTeacherOptions remote;            // its top_k is teacher_top_k's; api_key from api_key_env
  std::string api_key_env;                // the environment variable holding the servers' API key
  // SFT targets: the tasks' references, or a teacher's samples (off-policy
  // distillation; needs [distill] teachers).
  std::string sft_source = "reference";   // "reference" | "teacher"

  // Reads [rl] and [distill]; problems are recorded on the doc (Finish reports them).
  static PostTrainConfig Read(ConfigDoc* doc, Algorithm default_algorithm);
  nlohmann::json ToJson() const;
};

// A model to sample from or to teach with, loaded whole for inference.
struct LoadedPolicy {
  std::unique_ptr<Model> model;
  std::string tokenizer_path, dir;
  std::vector<int64_t> eos_token_ids;
};

struct PostTrainSpec {
  std::string verb = "rl";             // "rl" | "distill" (messages, the default algorithm)
  std::string config_path;
  std::vector<std::string> overrides;
  bool fresh = false;
  int64_t stop_after = 0;              // stop (and save) after this many iterations of this run
  bool quiet = false;
  comm::Comm* world = nullptr;
  int* exit_code = nullptr;
  // Loads a teacher (the CLI's checkpoint / Hugging Face loader).
  std::function<Result<LoadedPolicy>(const std::string& path)> load_model;
};

Status RunPostTraining(const PostTrainSpec& spec);

// Held-out scores of a policy served by `engine`, per domain and overall.
struct DomainScore {
  int problems = 0;
  double pass1 = 0, passk = 0, greedy = 0, reward = 0;
};
struct HeldOutScores {
  std::map<std::string, DomainScore> domains;
  DomainScore all;
  double seconds = 0;
  nlohmann::json ToJson() const;
};

// The samples of a task set through an engine, scored; shared by the
// held-out evaluation, teacher selection and the CLI.
struct TaskSampler {
  serve::Engine* engine = nullptr;
  const Tokenizer* tok = nullptr;
  const TextConventions* text = nullptr;
  int max_tokens = 16;
  int reward_threads = 4;
  RewardOptions reward;
  // Prompt ids of a task (prefix + the prompt's tokens).
  std::vector<int32_t> PromptIds(const Task& t) const;
  // The stop sequences: the conventions' stop ids and every token whose text has a newline.
  std::vector<std::vector<int32_t>> StopSeqs() const;
  // The completion's text up to its first newline (what is scored).
  std::string CompletionText(const std::vector<int32_t>& completion) const;
};

Result<HeldOutScores> EvaluateHeldOut(const TaskSampler& s, const std::vector<Task>& tasks, int samples,
                                      double temperature, uint64_t seed);

// Scores completions of tasks on `threads` threads (equal completions of one
// task are scored once).
std::vector<RewardResult> ScoreAll(const std::vector<const Task*>& tasks, const std::vector<std::string>& completions,
                                   const RewardOptions& options, int threads);

}  // namespace myriad::rl
