#include "train/supervise/restart_policy.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"

namespace myriad::supervise {

HostHistory HostHistory::Load(Env* env, const std::string& path, bool reset) {
  HostHistory h;
  if (reset || !env->FileExists(path)) return h;
  auto text = env->ReadFile(path);
  if (!text.ok()) {
    LOG_WARN("launch: %s; starting a new host history", text.status().message().c_str());
    return h;
  }
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("hosts") || !j["hosts"].is_object()) {
    LOG_WARN("launch: %s is not a host history; starting a new one", path.c_str());
    return h;
  }
  h.j_ = j;
  return h;
}

Status HostHistory::Save(Env* env, const std::string& path) const {
  Status s = WriteFileAtomic(env, path, j_.dump(2) + "\n");
  if (!s.ok()) return Status::Error("cannot save the host history: " + s.message());
  return Status::Ok();
}

int HostHistory::Failures(const std::string& h) const {
  return j_["hosts"].contains(h) && j_["hosts"][h].is_object() ? j_["hosts"][h].value("failures", 0) : 0;
}

bool HostHistory::Excluded(const std::string& h) const {
  return j_["hosts"].contains(h) && j_["hosts"][h].is_object() && j_["hosts"][h].value("excluded", false);
}

void HostHistory::Fail(const std::string& h, const std::string& why) {
  auto& e = j_["hosts"][h];
  if (!e.is_object()) e = nlohmann::json::object();
  e["failures"] = e.value("failures", 0) + 1;
  e["events"].push_back(why);
}

void HostHistory::Exclude(const std::string& h) {
  auto& e = j_["hosts"][h];
  if (!e.is_object()) e = nlohmann::json::object();
  e["excluded"] = true;
}

RestartPolicy::RestartPolicy(RestartOptions options, std::vector<HostSlots> hosts, bool track_hosts, int dp,
                             HostHistory* history)
    : opt_(options), hosts_(std::move(hosts)), track_hosts_(track_hosts), dp_(dp), history_(history) {
  for (const auto& h : hosts_) {
    base_ranks_ += h.slots;
    if (track_hosts_ && history_->Excluded(h.name)) excluded_.push_back(h.name);
  }
}

Result<AttemptLayout> RestartPolicy::NextLayout() const {
  AttemptLayout l;
  for (const auto& h : hosts_)
    if (std::find(excluded_.begin(), excluded_.end(), h.name) == excluded_.end()) l.live.push_back(h);
  for (const auto& h : l.live) {
    l.ranks += h.slots;
    for (int i = 0; i < h.slots; ++i) l.rank_hosts.push_back(h.name.empty() ? "localhost" : h.name);
  }
  if (l.ranks == 0) return Status::Error("every host is excluded");
  l.dp = dp_;
  if (l.ranks != base_ranks_) {
    const int per_replica = base_ranks_ / dp_;
    if (l.ranks % per_replica != 0)
      return Status::Error("cannot continue on " + std::to_string(l.ranks) + " ranks: tp*pp*ep*cp = " +
                           std::to_string(per_replica) + " does not divide them");
    l.dp = l.ranks / per_replica;
    l.dp_shrunk = true;
  }
  return l;
}

RestartDecision RestartPolicy::AfterAttempt(const AttemptOutcome& at, const AttemptLayout& layout) {
  RestartDecision d;
  if (at.outcome == "completed" || at.stop_forwarded) return d;  // kEnd
  if (track_hosts_) {
    for (const std::string& h : at.blamed_hosts) {
      if (h.empty() || h == "localhost") continue;
      history_->Fail(h, "attempt " + std::to_string(at.index) + ": " + at.outcome);
      if (history_->Failures(h) >= opt_.exclude_after &&
          std::find(excluded_.begin(), excluded_.end(), h) == excluded_.end() && layout.live.size() > 1) {
        history_->Exclude(h);
        excluded_.push_back(h);
        d.excluded_now.push_back(h);
        LOG_WARN("launch: host %s failed %d times: excluded; continuing on the other hosts", h.c_str(),
                 history_->Failures(h));
      }
    }
    d.history_changed = true;
  }
  if (at.outcome == "config") {  // the same config fails the same way every time
    d.kind = RestartDecision::kGiveUp;
    d.error = "the job's config is refused, so restarting cannot help" + (at.detail.empty() ? "" : ": " + at.detail);
    return d;
  }
  if (restarts_ >= opt_.max_restarts) {
    d.kind = RestartDecision::kGiveUp;
    d.error = "restart budget spent (" + std::to_string(opt_.max_restarts) + " restarts); last: " + at.outcome +
              (at.detail.empty() ? "" : ": " + at.detail);
    return d;
  }
  ++restarts_;
  // Backoff: doubles while attempts fail without moving past their checkpoint.
  const int64_t resumed = std::max<int64_t>(0, at.resumed_step);
  const bool progressed = at.last_step > resumed && opt_.ckpt_every > 0 && at.last_step - resumed >= opt_.ckpt_every;
  consecutive_ = progressed ? 1 : consecutive_ + 1;
  d.kind = RestartDecision::kRestart;
  d.delay_s = std::min(opt_.backoff_max_s, opt_.backoff_s * std::pow(2.0, consecutive_ - 1));
  LOG_INFO("launch: restarting in %.1f s (restart %d of at most %d)", d.delay_s, restarts_, opt_.max_restarts);
  return d;
}

}  // namespace myriad::supervise
