// The restart policy of a supervised job: after each attempt, whether to end
// (completed, or stopped on request), restart after a backoff, or give up
// (restart budget spent); which hosts a failure is counted against and which
// hosts are excluded; and the layout (hosts, ranks, dp) of the next attempt.
// Pure logic over attempt outcomes (attempt.h): no processes, no clock, no
// sleeping -- the supervisor does those -- so unit tests feed it synthetic
// outcomes. The host history it keeps is loaded and saved through Env.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/status.h"
#include "train/supervise/attempt.h"

namespace myriad::supervise {

struct HostSlots {
  std::string name;
  int slots = 1;
};

// Failures and exclusions per host, kept across launches in
// <state_dir>/hosts.json: {"hosts": {NAME: {"failures": N, "events": [...],
// "excluded": true}}}.
class HostHistory {
 public:
  HostHistory() = default;
  // Reads `path` (missing: a new history; unreadable or not a history: a
  // warning and a new one). reset: start a new one whatever is there.
  static HostHistory Load(Env* env, const std::string& path, bool reset);
  // Writes it atomically (WriteFileAtomic): a failed save leaves the old file.
  Status Save(Env* env, const std::string& path) const;

  int Failures(const std::string& host) const;
  bool Excluded(const std::string& host) const;
  void Fail(const std::string& host, const std::string& why);
  void Exclude(const std::string& host);
  const nlohmann::json& json() const { return j_; }

 private:
  nlohmann::json j_ = {{"hosts", nlohmann::json::object()}};
};

struct RestartOptions {
  int max_restarts = 10;
  double backoff_s = 1, backoff_max_s = 60;
  int exclude_after = 2;  // failures of one host before it is excluded
  int64_t ckpt_every = 0;  // the trainer's checkpoint interval (0: none)
};

// The hosts, ranks and data parallelism of one attempt.
struct AttemptLayout {
  std::vector<HostSlots> live;          // the hosts not excluded
  std::vector<std::string> rank_hosts;  // host of each rank ("localhost" for an unnamed one)
  int ranks = 0;
  int dp = 0;
  bool dp_shrunk = false;  // dp differs from the configured one (pass --set parallel.dp)
};

struct RestartDecision {
  enum Kind {
    kEnd,      // the attempt completed, or a stop was forwarded to it
    kRestart,  // restart after delay_s
    kGiveUp,   // the restart budget is spent: error says so
  } kind = kEnd;
  double delay_s = 0;
  std::vector<std::string> excluded_now;  // hosts excluded by this decision
  bool history_changed = false;           // the host history is to be saved
  std::string error;
};

class RestartPolicy {
 public:
  // hosts: as given to the launch; track_hosts: they are named (--hosts), so
  // failures are counted per host and hosts can be excluded. dp: the
  // configured data parallelism. history: outlives the policy; hosts it
  // marks excluded start excluded.
  RestartPolicy(RestartOptions options, std::vector<HostSlots> hosts, bool track_hosts, int dp,
                HostHistory* history);

  // The next attempt's layout: the hosts not excluded; dp shrinks with the
  // ranks (the other dimensions stay). Error (the launch's final error) when
  // every host is excluded or tp*pp*ep*cp does not divide the ranks left.
  Result<AttemptLayout> NextLayout() const;

  // After an attempt that ran with `layout`:
  //   - completed, or stopped on request: kEnd;
  //   - else (tracked hosts) each blamed host gets a failure in the history,
  //     and one at exclude_after failures is excluded -- unless it was the
  //     attempt's only host;
  //   - kGiveUp once max_restarts restarts were made;
  //   - else kRestart after backoff_s x 2^(k-1), at most backoff_max_s, where
  //     k counts the attempts in a row that failed without getting a
  //     checkpoint interval past where they resumed (k = 1 after one that did).
  RestartDecision AfterAttempt(const AttemptOutcome& attempt, const AttemptLayout& layout);

  int restarts() const { return restarts_; }
  const std::vector<std::string>& excluded() const { return excluded_; }

 private:
  RestartOptions opt_;
  std::vector<HostSlots> hosts_;
  bool track_hosts_;
  int dp_, base_ranks_ = 0;
  HostHistory* history_;
  std::vector<std::string> excluded_;
  int restarts_ = 0, consecutive_ = 0;
};

}  // namespace myriad::supervise
