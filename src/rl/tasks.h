// Built-in RL tasks with generators and held-out splits, and JSONL task
// files. A task is a prompt and the reward spec its completion is scored by.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "rl/reward.h"

namespace myriad::rl {

struct Task {
  std::string id;        // unique within a task set, e.g. "arith-3-000123"
  std::string domain;    // "arithmetic", "countdown", "python", "tool_call", or a file's tag
  std::string prompt;    // the text the model continues
  RewardSpec reward;
  int difficulty = 1;
  // A correct completion (generated tasks always have one; JSONL tasks when
  // given): SFT targets and pretraining text. Score(reward, reference) == 1.
  std::string reference;
};

// Prompt formats of the generated domains (short, so a tiny model can learn
// them; every completion ends with "\n" and generation stops there):
//   arithmetic: "37+45*2=" -> "127\n"
//   countdown:  "use 3 5 7 make 22:" -> " 3*5+7\n"
//   python:     "# add 3 to x\ndef f(x):\n    return" -> " x + 3\n"
//   tool_call:  "call: weather in Paris, celsius\n" -> "{\"name\":...}\n"


enum class Split { kTrain, kHeldOut };

// Deterministic in (domain, difficulty, seed, split): the same arguments give
// the same tasks. Train and held-out splits never share a problem (the split
// is a function of the problem itself, so no seed can make them overlap).
// Domains: "arithmetic" (difficulty 1..5: operand size and operator count),
// "countdown" (difficulty = number count 2..5), "python" (small functions
// with tests), "tool_call" (requests over a few tool schemas).
// An unknown domain or difficulty out of range is an error naming it.
Result<std::vector<Task>> GenerateTasks(const std::string& domain, int count, int difficulty, uint64_t seed,
                                        Split split);

// One JSON object per line: {"id"?, "domain"?, "prompt", "reward": {...}}.
// Errors carry the path and line number: "tasks.jsonl:7: reward.kind: ...".
Result<std::vector<Task>> LoadTasksJsonl(const std::string& path);
Status WriteTasksJsonl(const std::string& path, const std::vector<Task>& tasks);

}  // namespace myriad::rl
