// The judge: both models answer every prompt greedily through the serving
// engine; each placement's answer gets a quality in [0, 1] (the verifier's
// reward where the prompt has one, otherwise the cloud model's rubric score);
// the verdict says where the prompt should have gone. Its records
// (route_data.h) carry the device's features, so training needs no model.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/text_conventions.h"
#include "data/tokenizer.h"
#include "edge/redact.h"
#include "edge/route_data.h"
#include "edge/router.h"
#include "model/model.h"

namespace myriad::edge {

// Answers a prompt through the cloud model (the judge's batched engine).
using AskCloudFn = std::function<Result<std::string>(const std::string& prompt)>;
// The collaborative answer of a prompt with private values: desensitise,
// ask the cloud (ask), restore on the device. Null: the cloud's answer to the
// prompt as is.
using CollaborativeFn = std::function<Result<std::string>(const std::string& prompt, const AskCloudFn& ask)>;

// The redactor behind the hooks (not owned; null gives null hooks): PII is
// whatever Redactor::Detect finds; the collaborative answer redacts the
// prompt with a vault of its own, asks, and restores (fail-closed markers
// for placeholders the vault does not know).
PiiFn PiiThrough(const Redactor* redactor);
CollaborativeFn CollaborativeThrough(const Redactor* redactor);

// "edge" when q_edge >= q_remote - margin; else "collaborative" with pii,
// "cloud" without.
std::string Verdict(double q_edge, double q_remote, bool pii, double margin);

// The rubric's squash: exp(mean log-probability per answer token), in
// (0, 1]; 0 for an answer without tokens.
double RubricQuality(const std::vector<float>& answer_logprobs);

// One model with what it needs to answer and score (not owned).
struct JudgeModel {
  const Model* model = nullptr;
  const Tokenizer* tok = nullptr;
  TextConventions text;
};

struct JudgeOptions {
  int max_tokens = 24;   // per answer (generation also stops at a newline)
  double margin = 0.05;
  int engine_batch = 16;
  int reward_threads = 2;
  FeatureSpec features;
  std::string edge_path;          // recorded with the features (router.json names it)
  PiiFn pii;                      // null: nothing detected
  CollaborativeFn collaborative;  // null: the cloud's answer as is
};

// Answers of `prompts` by one model, greedy, batched by the engine: each
// the completion's text up to its first newline. A prompt longer than the
// context keeps its last tokens.
Result<std::vector<std::string>> AnswerAll(const JudgeModel& m, const std::vector<std::string>& prompts,
                                           int max_tokens, int engine_batch);

// The judge's rubric score of answers to prompts under `judge`: the mean
// log-probability of the answer's tokens after "Question: <prompt>\nAnswer:",
// squashed by RubricQuality (the question keeps its last tokens to fit).
Result<std::vector<double>> RubricScores(const JudgeModel& judge, const std::vector<std::string>& prompts,
                                         const std::vector<std::string>& answers, int engine_batch);

// The quality of each answer in [0, 1]: its prompt's verifier reward where
// it has one, else the judge's rubric score (RubricScores).
Result<std::vector<double>> ScoreAnswers(const JudgeModel& judge, const std::vector<RoutePrompt>& prompts,
                                         const std::vector<std::string>& answers, int engine_batch,
                                         int reward_threads = 2);

// The whole judge over a prompt set: answers, qualities, verdicts and the
// edge model's features. `progress` (may be null) gets one line per phase.
Result<std::vector<RouteRecord>> JudgePrompts(const JudgeModel& edge, const JudgeModel& cloud,
                                              const std::vector<RoutePrompt>& prompts, const JudgeOptions& opt,
                                              const std::function<void(const std::string&)>& progress);

}  // namespace myriad::edge
