#include "train/supervise/report.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <sstream>

namespace myriad::supervise {

const char* FinalStateName(FinalState s) {
  switch (s) {
    case FinalState::kCompleted: return "completed";
    case FinalState::kStopped: return "stopped";
    case FinalState::kFailed: return "failed";
  }
  return "failed";
}

namespace {

// Rank 0's "checkpoint" events (one per finished write): saves, failures, and
// how long training was blocked per save against the save's full time.
nlohmann::json CheckpointSummary(const std::vector<AttemptOutcome>& attempts) {
  int saves = 0, failed = 0;
  double blocked = 0, blocked_max = 0, full = 0;
  nlohmann::json per = nlohmann::json::array();
  for (const AttemptOutcome& a : attempts)
    for (const auto& e : a.checkpoints) {
      if (!e.value("ok", false)) {
        ++failed;
        continue;
      }
      const double b = e.value("blocked_s", 0.0), p = e.value("persist_s", 0.0);
      ++saves;
      blocked += b;
      blocked_max = std::max(blocked_max, b);
      full += b + p;
      per.push_back({{"step", e.value("step", int64_t{0})}, {"attempt", e.value("attempt", 0)}, {"blocked_s", b},
                     {"persist_s", p}, {"snapshot_s", e.value("snapshot_s", 0.0)}});
    }
  return {{"saves", saves},
          {"failed", failed},
          {"blocked_mean_s", saves ? blocked / saves : 0.0},
          {"blocked_max_s", blocked_max},
          {"save_mean_s", saves ? full / saves : 0.0},
          {"blocked_fraction", full > 0 ? blocked / full : 0.0},
          {"per_save", per}};
}

}  // namespace

nlohmann::json BuildReport(const LaunchSummary& sum) {
  const std::vector<AttemptOutcome>& attempts = sum.attempts;
  const double wall = sum.wall_s;
  nlohmann::json rep;
  rep["completed"] = sum.state == FinalState::kCompleted;
  rep["state"] = FinalStateName(sum.state);
  rep["wall_s"] = wall;
  double productive = 0, lost_total = 0;
  nlohmann::json atts = nlohmann::json::array();
  nlohmann::json stragglers = nlohmann::json::array();
  for (size_t k = 0; k < attempts.size(); ++k) {
    const AttemptOutcome& a = attempts[k];
    const int64_t resumed = std::max<int64_t>(0, a.resumed_step);
    // Steps of this attempt that count: up to where the next attempt resumed.
    const int64_t kept_until = k + 1 < attempts.size() ? std::max<int64_t>(0, attempts[k + 1].resumed_step) : INT64_MAX;
    int64_t lost_steps = 0;
    for (const auto& [st, v] : a.steps) {
      if (st <= kept_until) productive += v.step_s;
      else ++lost_steps;
    }
    double lost_s = 0;
    if (a.outcome != "completed" && a.outcome != "stopped") {
      double ref = a.start_s;
      if (auto it = a.steps.find(kept_until); it != a.steps.end()) ref = it->second.done_s;
      double next = wall;
      if (k + 1 < attempts.size()) {
        const AttemptOutcome& n = attempts[k + 1];
        next = n.start_s;
        if (!n.steps.empty()) next = n.steps.begin()->second.done_s - n.steps.begin()->second.step_s;
      }
      lost_s = std::max(0.0, next - ref);
      lost_total += lost_s;
    }
    std::string hl;
    {
      std::map<std::string, int> count;
      for (const auto& h : a.hosts) count[h]++;
      for (const auto& [h, n] : count) hl += (hl.empty() ? "" : ",") + h + ":" + std::to_string(n);
    }
    atts.push_back({{"attempt", a.index}, {"ranks", a.ranks}, {"dp", a.dp}, {"hosts", hl},
                    {"resumed_step", resumed}, {"last_step", a.last_step}, {"outcome", a.outcome},
                    {"detail", a.detail}, {"exit_code", a.exit_code}, {"lost_steps", lost_steps}, {"lost_s", lost_s},
                    {"seconds", a.end_s - a.start_s}});
    for (const auto& s : a.stragglers) stragglers.push_back(s);
  }
  rep["attempts"] = atts;
  rep["productive_s"] = productive;
  rep["ettr"] = wall > 0 ? productive / wall : 0;
  rep["lost_s"] = lost_total;
  rep["restarts"] = sum.restarts;
  rep["faults_planned"] = sum.faults_planned;
  rep["faults_fired"] = sum.faults_fired;
  rep["excluded_hosts"] = sum.excluded_hosts;
  rep["stragglers"] = stragglers;
  rep["host_history"] = sum.host_history;
  rep["checkpoints"] = CheckpointSummary(attempts);
  if (!sum.error.empty()) rep["error"] = sum.error;
  return rep;
}

std::string FormatReport(const nlohmann::json& r) {
  std::ostringstream o;
  char buf[512];
  o << "== myriad launch report ==\n";
  const bool completed = r.value("completed", false);
  const std::string state = r.value("state", std::string(completed ? "completed" : "failed"));
  std::snprintf(buf, sizeof buf, "outcome: %s after %d attempt(s), %.1f s wall\n",
                completed ? "completed" : ("NOT completed (" + state + ")").c_str(),
                static_cast<int>(r["attempts"].size()), r.value("wall_s", 0.0));
  o << buf;
  for (const auto& a : r["attempts"]) {
    std::snprintf(buf, sizeof buf, "  attempt %d: %d rank(s) on %s, steps %lld..%lld, %s%s%s (lost %lld steps, %.1f s)\n",
                  a.value("attempt", 0), a.value("ranks", 0), a.value("hosts", std::string()).c_str(),
                  static_cast<long long>(a.value("resumed_step", 0)), static_cast<long long>(a.value("last_step", 0)),
                  a.value("outcome", std::string()).c_str(), a.value("detail", std::string()).empty() ? "" : ": ",
                  a.value("detail", std::string()).c_str(), static_cast<long long>(a.value("lost_steps", 0)),
                  a.value("lost_s", 0.0));
    o << buf;
  }
  std::snprintf(buf, sizeof buf, "ETTR %.3f (productive step time %.1f s of %.1f s wall)\n", r.value("ettr", 0.0),
                r.value("productive_s", 0.0), r.value("wall_s", 0.0));
  o << buf;
  if (r.contains("checkpoints") && r["checkpoints"].value("saves", 0) > 0) {
    const auto& c = r["checkpoints"];
    std::snprintf(buf, sizeof buf,
                  "checkpoints: %d saves; training blocked %.3f s per save on average (max %.3f s), "
                  "%.1f%% of a save's %.2f s\n",
                  c.value("saves", 0), c.value("blocked_mean_s", 0.0), c.value("blocked_max_s", 0.0),
                  100 * c.value("blocked_fraction", 0.0), c.value("save_mean_s", 0.0));
    o << buf;
  }
  if (!r["excluded_hosts"].empty()) o << "excluded hosts: " << r["excluded_hosts"].dump() << "\n";
  for (const auto& s : r["stragglers"]) o << "straggler: " << s.dump() << "\n";
  return o.str();
}

Status WriteReport(Env* env, const std::string& path, const nlohmann::json& report) {
  Status s = WriteFileAtomic(env, path, report.dump(2) + "\n");
  if (!s.ok()) return Status::Error("cannot write the report: " + s.message());
  return Status::Ok();
}

}  // namespace myriad::supervise
