// The restart policy on synthetic attempt outcomes: backoff, budget, host
// blame and exclusion, the next layout; the host history through Env.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/fault_env.h"
#include "train/supervise/restart_policy.h"

namespace myriad::supervise {
namespace {

AttemptOutcome Failed(int index, const std::string& outcome, int64_t resumed, int64_t last,
                      std::set<std::string> blamed = {}, const std::string& detail = "") {
  AttemptOutcome a;
  a.index = index;
  a.outcome = outcome;
  a.detail = detail;
  a.resumed_step = resumed;
  a.last_step = last;
  a.blamed_hosts = std::move(blamed);
  return a;
}

RestartOptions Options(int max_restarts, double backoff, double backoff_max, int exclude_after = 2,
                       int64_t ckpt_every = 4) {
  return {max_restarts, backoff, backoff_max, exclude_after, ckpt_every};
}

TEST(RestartPolicy, BackoffDoublesWhileAttemptsDoNotGetACheckpointFurther) {
  HostHistory h;
  RestartPolicy p(Options(20, 1, 5), {{"", 1}}, /*track_hosts=*/false, 1, &h);
  auto layout = p.NextLayout();
  ASSERT_TRUE(layout.ok());
  // Five crashes that each die 2 steps after their checkpoint: 1, 2, 4, then the cap.
  const double want[] = {1, 2, 4, 5, 5};
  for (int i = 0; i < 5; ++i) {
    const RestartDecision d = p.AfterAttempt(Failed(i, "crash", 8, 10), *layout);
    ASSERT_EQ(d.kind, RestartDecision::kRestart) << i;
    EXPECT_DOUBLE_EQ(d.delay_s, want[i]) << i;
    EXPECT_FALSE(d.history_changed);  // hosts not named: nothing to count
  }
  // One that got a whole interval (4 steps) past its checkpoint resets it ...
  EXPECT_DOUBLE_EQ(p.AfterAttempt(Failed(5, "hang", 8, 12), *layout).delay_s, 1);
  // ... and the next failure without progress doubles again from there.
  EXPECT_DOUBLE_EQ(p.AfterAttempt(Failed(6, "crash", 12, 13), *layout).delay_s, 2);
  // A fresh start (resumed -1 counts as 0) that reached step 4 progressed.
  EXPECT_DOUBLE_EQ(p.AfterAttempt(Failed(7, "crash", -1, 4), *layout).delay_s, 1);
  EXPECT_EQ(p.restarts(), 8);
}

// A config the trainer refuses (exit kExitConfig) fails the same way on
// every restart: the policy gives up at once, naming it.
TEST(RestartPolicy, ARefusedConfigIsNotRestarted) {
  HostHistory h;
  RestartPolicy p(Options(20, 1, 5), {{"", 1}}, false, 1, &h);
  const AttemptLayout l = *p.NextLayout();
  AttemptOutcome at = Failed(0, "config", -1, 0);
  at.detail = "rank 0: model.vocab_size=0 is out of range";
  const RestartDecision d = p.AfterAttempt(at, l);
  EXPECT_EQ(d.kind, RestartDecision::kGiveUp);
  EXPECT_NE(d.error.find("restarting cannot help: rank 0: model.vocab_size=0"), std::string::npos) << d.error;
  EXPECT_EQ(p.restarts(), 0);
}

TEST(RestartPolicy, WithoutCheckpointsNoAttemptCountsAsProgress) {
  HostHistory h;
  RestartPolicy p(Options(20, 0.5, 100, 2, /*ckpt_every=*/0), {{"", 1}}, false, 1, &h);
  const AttemptLayout l = *p.NextLayout();
  EXPECT_DOUBLE_EQ(p.AfterAttempt(Failed(0, "crash", 0, 50), l).delay_s, 0.5);
  EXPECT_DOUBLE_EQ(p.AfterAttempt(Failed(1, "crash", 0, 50), l).delay_s, 1.0);
  EXPECT_DOUBLE_EQ(p.AfterAttempt(Failed(2, "crash", 0, 50), l).delay_s, 2.0);
}

TEST(RestartPolicy, GivesUpWhenTheBudgetIsSpentNamingTheLastFailure) {
  HostHistory h;
  RestartPolicy p(Options(2, 0.1, 1), {{"", 2}}, false, 2, &h);
  const AttemptLayout l = *p.NextLayout();
  EXPECT_EQ(p.AfterAttempt(Failed(0, "crash", 0, 3), l).kind, RestartDecision::kRestart);
  EXPECT_EQ(p.AfterAttempt(Failed(1, "numerical", 0, 3), l).kind, RestartDecision::kRestart);
  const std::string hang =
      "no progress for 4.2 s; rank 1 (host b): step 10, phase step, not in a collective (last: none); "
      "rank 0 (host a): step 10, phase step, waiting in AllReduce on \"mpi world 2\" (op #383) for 4.2 s";
  const RestartDecision d = p.AfterAttempt(Failed(2, "hang", 0, 10, {}, hang), l);
  EXPECT_EQ(d.kind, RestartDecision::kGiveUp);
  EXPECT_EQ(d.error, "restart budget spent (2 restarts); last: hang: " + hang);
  EXPECT_EQ(p.restarts(), 2);
}

TEST(RestartPolicy, EndsOnCompletionOrAForwardedStop) {
  HostHistory h;
  RestartPolicy p(Options(0, 1, 1), {{"a", 1}, {"b", 1}}, true, 2, &h);
  const AttemptLayout l = *p.NextLayout();
  AttemptOutcome done = Failed(0, "completed", 0, 24, {"a"});
  EXPECT_EQ(p.AfterAttempt(done, l).kind, RestartDecision::kEnd);
  AttemptOutcome stopped = Failed(1, "crash", 0, 9, {"b"});  // a crash after the stop was asked for
  stopped.stop_forwarded = true;
  const RestartDecision d = p.AfterAttempt(stopped, l);
  EXPECT_EQ(d.kind, RestartDecision::kEnd);
  EXPECT_FALSE(d.history_changed);
  EXPECT_EQ(h.Failures("b"), 0);  // not counted against the host
}

TEST(RestartPolicy, AHostThatKeepsFailingIsExcludedAndDpShrinks) {
  HostHistory h;
  // dp 2 on two hosts, one rank each (tp*pp*ep*cp = 1).
  RestartPolicy p(Options(10, 1, 60, /*exclude_after=*/2), {{"node0", 1}, {"node1", 1}}, true, 2, &h);
  AttemptLayout l = *p.NextLayout();
  EXPECT_EQ(l.ranks, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_FALSE(l.dp_shrunk);
  EXPECT_EQ(l.rank_hosts, (std::vector<std::string>{"node0", "node1"}));

  RestartDecision d = p.AfterAttempt(Failed(0, "health", 0, 0, {"node1"}), l);
  EXPECT_EQ(d.kind, RestartDecision::kRestart);
  EXPECT_TRUE(d.history_changed);
  EXPECT_TRUE(d.excluded_now.empty());
  EXPECT_EQ(h.Failures("node1"), 1);
  l = *p.NextLayout();
  EXPECT_EQ(l.ranks, 2);

  d = p.AfterAttempt(Failed(1, "health", 0, 0, {"node1"}), l);
  EXPECT_EQ(d.excluded_now, (std::vector<std::string>{"node1"}));
  EXPECT_EQ(h.Failures("node1"), 2);
  EXPECT_TRUE(h.Excluded("node1"));
  EXPECT_EQ(h.json()["hosts"]["node1"]["events"], (nlohmann::json{"attempt 0: health", "attempt 1: health"}));
  EXPECT_EQ(p.excluded(), (std::vector<std::string>{"node1"}));

  l = *p.NextLayout();
  EXPECT_EQ(l.ranks, 1);
  EXPECT_EQ(l.dp, 1);
  EXPECT_TRUE(l.dp_shrunk);
  EXPECT_EQ(l.rank_hosts, (std::vector<std::string>{"node0"}));

  // The last host left is never excluded, however often it fails.
  for (int i = 2; i < 5; ++i) EXPECT_TRUE(p.AfterAttempt(Failed(i, "crash", 0, 1, {"node0"}), l).excluded_now.empty());
  EXPECT_EQ(h.Failures("node0"), 3);
  EXPECT_FALSE(h.Excluded("node0"));
  EXPECT_TRUE(p.NextLayout().ok());
}

TEST(RestartPolicy, UnnamedHostsAreNeverBlamed) {
  HostHistory h;
  RestartPolicy p(Options(10, 1, 60, 1), {{"a", 1}, {"b", 1}}, true, 2, &h);
  const AttemptLayout l = *p.NextLayout();
  const RestartDecision d = p.AfterAttempt(Failed(0, "crash", 0, 1, {"", "localhost"}), l);
  EXPECT_TRUE(d.excluded_now.empty());
  EXPECT_TRUE(h.json()["hosts"].empty());
}

TEST(RestartPolicy, LayoutsThatCannotRunAreTheLaunchsError) {
  HostHistory h;
  h.Exclude("a");
  h.Exclude("b");
  RestartPolicy all_out(Options(10, 1, 60), {{"a", 1}, {"b", 1}}, true, 2, &h);
  EXPECT_EQ(all_out.excluded(), (std::vector<std::string>{"a", "b"}));  // from the history
  EXPECT_EQ(all_out.NextLayout().status().message(), "every host is excluded");
  // Without named hosts the history is not consulted.
  RestartPolicy untracked(Options(10, 1, 60), {{"a", 1}, {"b", 1}}, false, 2, &h);
  EXPECT_TRUE(untracked.NextLayout().ok());

  // Three ranks per replica (tp 3): two ranks left cannot hold one.
  HostHistory h2;
  RestartPolicy p(Options(10, 1, 60, 1), {{"a", 2}, {"b", 1}}, true, 1, &h2);
  const AttemptLayout l = *p.NextLayout();
  EXPECT_EQ(l.rank_hosts, (std::vector<std::string>{"a", "a", "b"}));
  p.AfterAttempt(Failed(0, "crash", 0, 1, {"b"}), l);
  EXPECT_EQ(p.NextLayout().status().message(), "cannot continue on 2 ranks: tp*pp*ep*cp = 3 does not divide them");
}

TEST(HostHistory, RoundTripsThroughEnvAndSurvivesAFailedSave) {
  const std::string dir = (std::filesystem::temp_directory_path() / "myriad-host-history-test").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/hosts.json";
  Env* env = Env::Default();
  EXPECT_TRUE(HostHistory::Load(env, path, false).json()["hosts"].empty());  // none yet

  HostHistory h;
  h.Fail("node1", "attempt 0: health");
  h.Exclude("node1");
  ASSERT_TRUE(h.Save(env, path).ok());
  HostHistory back = HostHistory::Load(env, path, false);
  EXPECT_EQ(back.Failures("node1"), 1);
  EXPECT_TRUE(back.Excluded("node1"));
  EXPECT_TRUE(HostHistory::Load(env, path, /*reset=*/true).json()["hosts"].empty());

  // A save that fails part-way leaves the saved history as it was.
  FaultEnv fenv;
  fenv.SetFailAppend(1, "hosts.json");
  back.Fail("node1", "attempt 1: crash");
  const Status s = back.Save(&fenv, path);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot save the host history"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("hosts.json"), std::string::npos) << s.message();
  EXPECT_EQ(HostHistory::Load(env, path, false).Failures("node1"), 1);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // Not a history: a new one.
  ASSERT_TRUE(WriteFileAtomic(env, path, "[1, 2]").ok());
  EXPECT_TRUE(HostHistory::Load(env, path, false).json()["hosts"].empty());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace myriad::supervise
