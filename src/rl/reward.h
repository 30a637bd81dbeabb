// Verifiable rewards for RL: a reward spec (what a correct completion is)
// parsed from JSON, and a scorer that turns a completion into a reward.
// docs/rl-rewards.md describes each kind, the normalisation and what the
// gaming tests cover. Thread-safe: Score keeps no state (python specs run
// in their own sandbox per call).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace myriad::rl {

enum class RewardKind { kExact, kCountdown, kPython, kToolCall };

struct RewardSpec {
  RewardKind kind = RewardKind::kExact;
  // kExact: the answer (the completion's answer equals it after
  // normalisation: trimmed, case-folded, commas in numbers dropped, "12.0"
  // == "12"; the answer is the text after the last "answer:"/"=" marker, or
  // the whole first line).
  std::string answer;
  // kCountdown: reach `target` with an arithmetic expression over `numbers`
  // (each used at most once; + - * / and parentheses).
  std::vector<long long> numbers;
  long long target = 0;
  // kPython: the completion defines `entry`; each test is a Python
  // statement (typically an assert) run against it in the sandbox. The
  // reward is the fraction passed (or all-or-nothing when `all_or_nothing`).
  // The program is `prefix` + completion (the prefix is usually the prompt:
  // a signature the model continues).
  std::string entry, prefix;
  std::vector<std::string> tests;
  bool all_or_nothing = false;
  double timeout_s = 2.0;
  // kToolCall: the completion is a JSON object {"name": ..., "arguments": {...}}
  // whose name is `tool` and whose arguments equal `arguments` (types checked
  // against `schema`, a JSON-schema subset: type/properties/required/enum).
  std::string tool;
  nlohmann::json arguments, schema;
};

// Errors name the field: "reward.kind: unknown kind 'foo' (expected exact,
// countdown, python or tool_call)", "reward.tests: expected an array of strings".
Result<RewardSpec> ParseRewardSpec(const nlohmann::json& j);
nlohmann::json RewardSpecToJson(const RewardSpec& spec);

struct RewardOptions {
  // Length penalty: completions longer than `max_chars` (0: off) lose
  // `length_penalty` per character over, down to a floor of -1.
  int max_chars = 0;
  double length_penalty = 0.0;
  // Format penalty: subtracted when the completion has no parseable answer.
  double format_penalty = 0.0;
};

struct RewardResult {
  double reward = 0.0;   // in [-1, 1]; 1 = fully correct before penalties
  bool correct = false;  // the verifier's verdict, before penalties
  bool parsed = false;   // an answer could be extracted at all
  std::string detail;    // short human-readable reason ("ok", "wrong answer 12 != 13", "timeout", ...)
};

// Never throws and never fails: anything malformed in the completion is a
// zero reward with a detail.
RewardResult Score(const RewardSpec& spec, std::string_view completion, const RewardOptions& options = {});

// The exact-match answer of a completion (see RewardSpec::answer), before
// normalisation; empty when there is none.
std::string ExtractAnswer(std::string_view completion);
// Trimmed, lower-cased, commas between digits dropped.
std::string NormalizeAnswer(std::string_view answer);

// The countdown/arithmetic grammar: integers, + - * /, parentheses, evaluated
// in exact rationals (num/den, den > 0, reduced); `literals` lists every
// integer in the expression. Errors on syntax, division by zero, overflow.
struct ArithValue {
  long long num = 0, den = 1;
  std::vector<long long> literals;
};
Result<ArithValue> EvaluateArithmetic(std::string_view expr);

}  // namespace myriad::rl
