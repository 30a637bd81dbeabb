#include "train/supervise/attempt.h"

#include <algorithm>
#include <cstdio>

#include "core/log.h"
#include "train/supervise/health.h"
#include "train/trainer.h"

namespace myriad::supervise {
std::string JoinNames(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

AttemptMonitor::AttemptMonitor(AttemptOutcome outcome, WatchOptions options)
    : out_(std::move(outcome)), opt_(options) {}

void AttemptMonitor::OnMessage(const nlohmann::json& m, double now) {
  if (m.value("attempt", -1) != out_.index) return;  // a straggling datagram of an earlier attempt
  const int r = m.value("rank", 0);
  RankState& s = ranks_[r];
  if (!s.seen) s.last_progress_s = now;
  s.seen = true;
  s.last_msg_s = now;
  s.host = m.value("host", std::string());
  const std::string kind = m.value("kind", std::string());
  const int64_t step = m.value("step", int64_t{0});
  const std::string phase = m.value("phase", std::string());
  int64_t op_seq = s.op_seq;
  if (kind == "beat") {
    op_seq = m.value("op_seq", int64_t{0});
    s.op = m.value("op", std::string());
    s.comm = m.value("comm", std::string());
    s.in_op = m.value("in_op", 0);
    s.op_s = m.value("op_s", 0.0);
  }
  if (step != s.step || phase != s.phase || op_seq != s.op_seq) s.last_progress_s = now;
  s.step = step;
  s.phase = phase;
  s.op_seq = op_seq;
  if (kind == "step") {
    // A rank's own compute time: in a synchronous step every rank's wall
    // time is the slowest one's, the others waiting in collectives.
    s.step_s.push_back(m.contains("compute_s") ? m.value("compute_s", 0.0) : m.value("step_s", 0.0));
    while (static_cast<int>(s.step_s.size()) > opt_.straggler_window) s.step_s.pop_front();
    if (r == 0) OnRank0Step(step, m.value("step_s", 0.0), now);
  } else if (kind == "event") {
    const std::string ev = m.value("event", std::string());
    if (ev == "start" && r == 0) {
      out_.resumed_step = m.value("resumed_step", int64_t{0});
      for (const auto& sk : m.value("skipped_checkpoints", std::vector<std::string>()))
        LOG_WARN("launch: attempt %d skipped a damaged checkpoint: %s", out_.index, sk.c_str());
    } else if (ev == "health" && !m.value("ok", true)) {
      LOG_WARN("launch: rank %d on host %s failed its health check: %s", r, s.host.c_str(),
               m.value("report", nlohmann::json::object()).value("failure", std::string()).c_str());
      out_.blamed_hosts.insert(s.host);
      if (out_.outcome.empty()) out_.outcome = "health", out_.detail = "rank " + std::to_string(r) + " on " + s.host;
    } else if (ev == "numerical") {
      if (out_.outcome.empty()) out_.outcome = "numerical", out_.detail = m.value("message", std::string());
    } else if (ev == "fault") {
      LOG_INFO("launch: injected fault fired on rank %d: %s", r, m.value("fault", std::string()).c_str());
    } else if (ev == "exit") {
      s.exited = true;
      s.exit_ok = m.value("ok", false);
      s.exit_message = m.value("message", std::string());
      if (r == 0 && m.value("completed", false)) out_.rank0_completed = true;
    } else if (ev == "checkpoint") {
      out_.checkpoints.push_back(m);
    }
  }
}

void AttemptMonitor::OnRank0Step(int64_t step, double step_s, double now) {
  out_.steps[step] = {now, step_s};
  out_.last_step = std::max(out_.last_step, step);
  // Stragglers, judged when rank 0 finishes a step; each rank once per attempt.
  std::vector<std::vector<double>> by_rank;
  for (int i = 0; i < out_.ranks; ++i)
    by_rank.push_back(ranks_.count(i) ? std::vector<double>(ranks_[i].step_s.begin(), ranks_[i].step_s.end())
                                      : std::vector<double>());
  for (const Straggler& sg : FindStragglers(by_rank, opt_.straggler_factor, opt_.straggler_window)) {
    bool known = false;
    for (const auto& k : out_.stragglers) known = known || k["rank"] == sg.rank;
    if (known) continue;
    const std::string host = ranks_[sg.rank].host;
    LOG_WARN("launch: rank %d on host %s is a straggler: its steps compute %.3f s, %.2fx the median %.3f s",
             sg.rank, host.c_str(), sg.rank_median_s, sg.ratio, sg.all_median_s);
    out_.stragglers.push_back({{"attempt", out_.index}, {"rank", sg.rank}, {"host", host},
                               {"step_s", sg.rank_median_s}, {"median_s", sg.all_median_s}, {"ratio", sg.ratio}});
  }
}

bool AttemptMonitor::CheckHang(double now) {
  if (hung_) return false;
  const int ranks = out_.ranks;
  const double running = now - out_.start_s;
  bool stuck = false;
  std::string why;
  int seen = 0;
  for (const auto& [r, s] : ranks_) seen += s.seen;
  if (seen < ranks && running > opt_.startup_timeout_s) {
    stuck = true;
    why = std::to_string(ranks - seen) + " rank(s) never reported within " +
          std::to_string(static_cast<int>(opt_.startup_timeout_s)) + " s";
  }
  if (!stuck && seen > 0) {
    double newest = 1e30;  // the most recent progress of any rank, as an age
    for (const auto& [r, s] : ranks_)
      if (s.seen) newest = std::min(newest, now - s.last_progress_s);
    // Every rank that has reported is idle: no step, phase or comm op changed.
    const bool all_idle = seen == ranks || running > opt_.startup_timeout_s;
    if (all_idle && newest > opt_.hang_timeout_s) {
      stuck = true;
      char b[128];
      std::snprintf(b, sizeof b, "no progress for %.1f s", newest);
      why = b;
    }
  }
  if (!stuck) return false;
  std::vector<std::string> lines;
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < ranks; ++r) {
      const auto it = ranks_.find(r);
      const bool present = it != ranks_.end() && it->second.seen;
      const RankState none;
      const RankState& s = present ? it->second : none;
      const bool in_coll = present && s.in_op > 0;
      if ((pass == 0) == in_coll) continue;
      char b[512];
      if (!present)
        std::snprintf(b, sizeof b, "rank %d: never reported", r);
      else if (in_coll)
        std::snprintf(b, sizeof b, "rank %d (host %s): step %lld, phase %s, waiting in %s on \"%s\" (op #%lld) for %.1f s",
                      r, s.host.c_str(), static_cast<long long>(s.step), s.phase.c_str(), s.op.c_str(),
                      s.comm.c_str(), static_cast<long long>(s.op_seq), s.op_s);
      else
        std::snprintf(b, sizeof b, "rank %d (host %s): step %lld, phase %s, not in a collective (last: %s)%s", r,
                      s.host.c_str(), static_cast<long long>(s.step), s.phase.c_str(),
                      s.op.empty() ? "none" : s.op.c_str(),
                      now - s.last_msg_s > 3 * opt_.heartbeat_s + 1 ? ", heartbeats stopped" : "");
      lines.push_back(b);
      if (pass == 0 && present) out_.blamed_hosts.insert(s.host);
    }
  hang_report_ = why + "; " + JoinNames(lines, "; ");
  LOG_ERROR("launch: hang: %s", hang_report_.c_str());
  hung_ = true;
  out_.outcome = "hang";
  out_.detail = hang_report_;
  return true;
}

bool AttemptMonitor::AllRanksHeard() const {
  int seen = 0;
  for (const auto& [r, s] : ranks_) seen += s.seen;
  return seen >= out_.ranks;
}

AttemptOutcome AttemptMonitor::Finish(JobExit exit, double now) {
  AttemptOutcome& at = out_;
  at.end_s = now;
  at.exit_code = exit.exit_code();
  const bool ok_exit = exit.ok();
  // After a forwarded stop every rank said it exited cleanly: the job did
  // what it was asked, whatever the launcher's own exit says.
  int clean_ranks = 0;
  for (const auto& [r, s] : ranks_) clean_ranks += s.exited && s.exit_ok;
  const bool stopped_cleanly = at.stop_forwarded && !hung_ && at.ranks > 0 && clean_ranks >= at.ranks;
  if ((ok_exit || stopped_cleanly) && at.rank0_completed) {
    at.outcome = "completed";
  } else if ((ok_exit || stopped_cleanly) && at.stop_forwarded) {
    at.outcome = "stopped";
    at.detail = "by signal; checkpoint written";
    if (!ok_exit) at.detail += " (every rank exited cleanly; the launcher's exit " + std::to_string(at.exit_code) + ")";
  } else if (at.outcome.empty()) {
    if (at.exit_code == kExitNumerical) at.outcome = "numerical";
    else if (at.exit_code == kExitHealth) at.outcome = "health";
    else if (at.exit_code == kExitCheckpoint) at.outcome = "checkpoint";
    else if (at.exit_code == kExitConfig) at.outcome = "config";
    else if (ok_exit) at.outcome = "stopped", at.detail = "exited before the last step without being asked";
    else at.outcome = "crash";
    if (at.outcome == "crash") {
      // Ranks that died without saying why: those that had reported and sent
      // no exit event.
      std::vector<std::string> dead;
      for (const auto& [r, s] : ranks_)
        if (s.seen && !s.exited) {
          dead.push_back("rank " + std::to_string(r) + " (host " + s.host + ")");
          at.blamed_hosts.insert(s.host);
        }
      at.detail = "exit " + std::to_string(at.exit_code) + (dead.empty() ? "" : "; no exit report from " + JoinNames(dead, ", "));
      if (dead.size() == static_cast<size_t>(at.ranks) && at.ranks > 1) at.blamed_hosts.clear();  // cannot tell
    }
    for (const auto& [r, s] : ranks_)
      if (s.exited && !s.exit_ok && at.detail.empty()) at.detail = "rank " + std::to_string(r) + ": " + s.exit_message;
  }
  LOG_INFO("launch: attempt %d ended: %s%s%s (exit %d, steps %lld..%lld)", at.index, at.outcome.c_str(),
           at.detail.empty() ? "" : ": ", at.detail.c_str(), at.exit_code,
           static_cast<long long>(std::max<int64_t>(0, at.resumed_step)), static_cast<long long>(at.last_step));
  return at;
}

}  // namespace myriad::supervise
