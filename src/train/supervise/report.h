// The report of a supervised launch, built from its attempts' outcomes
// (attempt.h) alone: attempts, ETTR, time lost per fault, checkpoints,
// stragglers, excluded hosts and the final state. Pure; written through Env.
//
// Definitions (docs/supervisor.md, "The report"):
//   - an attempt's steps after the step the next attempt resumed from were
//     redone: they are its lost steps; the other steps (rank 0's step_s)
//     are the productive step time;
//   - ETTR = productive step time / wall time of the launch;
//   - an attempt that failed (not completed, not stopped) lost the time from
//     the end of the step the next attempt resumed from (or its own start,
//     when it has no such step) to the start of the next attempt's first
//     step (its done time less its step time) -- or to the next attempt's
//     start when that one computed nothing, or to the end of the launch when
//     there is no next attempt.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/status.h"
#include "train/supervise/attempt.h"

namespace myriad::supervise {

enum class FinalState { kCompleted, kStopped, kFailed };
const char* FinalStateName(FinalState s);  // "completed", "stopped", "failed"

struct LaunchSummary {
  std::vector<AttemptOutcome> attempts;  // in order; times since the launch started
  double wall_s = 0;                     // the launch's wall time
  FinalState state = FinalState::kFailed;
  std::string error;  // why it failed ("": none given)
  int restarts = 0;
  size_t faults_planned = 0, faults_fired = 0;
  std::vector<std::string> excluded_hosts;
  nlohmann::json host_history = nlohmann::json::object();  // HostHistory::json()["hosts"]
};

// The report as JSON (report.json): completed, state, wall_s, attempts[]
// (attempt, ranks, dp, hosts "a:2,b:1", resumed_step, last_step, outcome,
// detail, exit_code, lost_steps, lost_s, seconds), productive_s, ettr,
// lost_s, restarts, faults_planned, faults_fired, excluded_hosts,
// stragglers, host_history, checkpoints {saves, failed, blocked_mean_s,
// blocked_max_s, save_mean_s, blocked_fraction, per_save[]}, error.
nlohmann::json BuildReport(const LaunchSummary& summary);

// The human form of a report (printed by the supervisor).
std::string FormatReport(const nlohmann::json& report);

// Writes report.json at `path` atomically (WriteFileAtomic): on failure the
// previous file, if any, is intact and the error names the path.
Status WriteReport(Env* env, const std::string& path, const nlohmann::json& report);

}  // namespace myriad::supervise
