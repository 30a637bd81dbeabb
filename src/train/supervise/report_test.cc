// The launch report from synthetic attempt outcomes: ETTR, lost steps and
// time lost per fault against numbers worked out by hand; checkpoints; the
// text form; the write through Env.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/fault_env.h"
#include "train/supervise/report.h"

namespace myriad::supervise {
namespace {

// An attempt that started at `start`, resumed from `resumed`, and ran steps
// first..last of step_s each, the first finishing at first_done.
AttemptOutcome Ran(int index, const std::string& outcome, double start, int64_t resumed, int64_t first,
                   int64_t last, double first_done, double step_s, double end) {
  AttemptOutcome a;
  a.index = index;
  a.ranks = 1;
  a.dp = 1;
  a.hosts = {"solo"};
  a.outcome = outcome;
  a.start_s = start;
  a.end_s = end;
  a.resumed_step = resumed;
  for (int64_t s = first; s <= last; ++s) a.steps[s] = {first_done + step_s * static_cast<double>(s - first), step_s};
  a.last_step = last >= first ? last : 0;
  return a;
}

TEST(Report, EttrAndTimeLostPerFaultInClosedForm) {
  LaunchSummary sum;
  // Attempt 0 (fresh) runs steps 1..6 of 0.5 s from t = 1.5 (step 1 done at
  // 2.0, step 4 at 3.5, step 6 at 4.5) and crashes at 5.0. Attempt 1
  // starts at 6.0, resumes from step 4, runs steps 5..10 (step 5 done at
  // 8.0, so computing from 7.5) and completes at 11.0. Wall 12.0.
  sum.attempts.push_back(Ran(0, "crash", 1.0, -1, 1, 6, 2.0, 0.5, 5.0));
  sum.attempts.push_back(Ran(1, "completed", 6.0, 4, 5, 10, 8.0, 0.5, 11.0));
  sum.wall_s = 12.0;
  sum.state = FinalState::kCompleted;
  sum.restarts = 1;
  const nlohmann::json r = BuildReport(sum);
  // Productive: steps 1..4 of attempt 0 and 5..10 of attempt 1 = 10 x 0.5 s.
  EXPECT_DOUBLE_EQ(r["productive_s"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(r["ettr"].get<double>(), 5.0 / 12.0);
  // Attempt 0 lost steps 5 and 6, and the time from the end of step 4 (3.5)
  // to the start of attempt 1's first step (7.5): 4.0 s.
  EXPECT_EQ(r["attempts"][0]["lost_steps"], 2);
  EXPECT_DOUBLE_EQ(r["attempts"][0]["lost_s"].get<double>(), 4.0);
  EXPECT_EQ(r["attempts"][1]["lost_steps"], 0);
  EXPECT_DOUBLE_EQ(r["attempts"][1]["lost_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(r["lost_s"].get<double>(), 4.0);
  EXPECT_EQ(r["attempts"][0]["resumed_step"], 0);  // a fresh start reads as step 0
  EXPECT_DOUBLE_EQ(r["attempts"][0]["seconds"].get<double>(), 4.0);
  EXPECT_EQ(r["attempts"][1]["outcome"], "completed");
  EXPECT_EQ(r["completed"], true);
  EXPECT_EQ(r["state"], "completed");
  EXPECT_EQ(r["restarts"], 1);
}

TEST(Report, AnAttemptThatComputedNothingAndAFailureAtTheEnd) {
  LaunchSummary sum;
  // 0: steps 1..6 (0.5 s, step 4 done at 3.5), crash at 5.0.
  // 1: starts 6.0, fails its health check at 6.5 without a step.
  // 2: starts 7.0, resumes from 4, step 5 done at 9.0 (computing from 8.5),
  //    steps 5..7, hangs; the launch gives up at wall 14.0.
  sum.attempts.push_back(Ran(0, "crash", 1.0, -1, 1, 6, 2.0, 0.5, 5.0));
  sum.attempts.push_back(Ran(1, "health", 6.0, 4, 1, 0, 0, 0.5, 6.5));
  sum.attempts.push_back(Ran(2, "hang", 7.0, 4, 5, 7, 9.0, 0.5, 13.0));
  sum.wall_s = 14.0;
  sum.state = FinalState::kFailed;
  sum.error = "restart budget spent (2 restarts); last: hang";
  const nlohmann::json r = BuildReport(sum);
  // 0 lost from 3.5 to attempt 1's start (it computed nothing): 2.5 s.
  EXPECT_DOUBLE_EQ(r["attempts"][0]["lost_s"].get<double>(), 2.5);
  // 1 lost from its own start (no step 4 of its own) to 8.5: 2.5 s.
  EXPECT_DOUBLE_EQ(r["attempts"][1]["lost_s"].get<double>(), 2.5);
  EXPECT_EQ(r["attempts"][1]["lost_steps"], 0);
  // 2, the last, lost from its start to the end of the launch: 7.0 s; its
  // steps count (no attempt redid them).
  EXPECT_DOUBLE_EQ(r["attempts"][2]["lost_s"].get<double>(), 7.0);
  EXPECT_EQ(r["attempts"][2]["lost_steps"], 0);
  EXPECT_DOUBLE_EQ(r["lost_s"].get<double>(), 12.0);
  // Productive: 4 + 3 steps of 0.5 s.
  EXPECT_DOUBLE_EQ(r["productive_s"].get<double>(), 3.5);
  EXPECT_DOUBLE_EQ(r["ettr"].get<double>(), 0.25);
  EXPECT_EQ(r["completed"], false);
  EXPECT_EQ(r["state"], "failed");
  EXPECT_EQ(r["error"], sum.error);
}

TEST(Report, AFreshRestartRedoesEverythingAndAStopLosesNothing) {
  LaunchSummary sum;
  // 0: steps 1..3 (1 s each, step 1 done at 1.0), crash; 1 starts over
  // (resumed from nothing) at 5.0 and runs step 1 done at 6.0; then a stop.
  sum.attempts.push_back(Ran(0, "crash", 0.0, -1, 1, 3, 1.0, 1.0, 3.5));
  sum.attempts.push_back(Ran(1, "stopped", 5.0, -1, 1, 1, 6.0, 1.0, 6.5));
  sum.wall_s = 8.0;
  sum.state = FinalState::kStopped;
  const nlohmann::json r = BuildReport(sum);
  EXPECT_EQ(r["attempts"][0]["lost_steps"], 3);
  EXPECT_DOUBLE_EQ(r["attempts"][0]["lost_s"].get<double>(), 5.0);  // from its start (0) to 5.0
  EXPECT_DOUBLE_EQ(r["attempts"][1]["lost_s"].get<double>(), 0.0);  // stopped: not a fault
  EXPECT_DOUBLE_EQ(r["productive_s"].get<double>(), 1.0);
  EXPECT_EQ(r["state"], "stopped");
  EXPECT_EQ(r["completed"], false);
}

TEST(Report, CheckpointsStragglersHostsAndFaults) {
  LaunchSummary sum;
  AttemptOutcome a = Ran(0, "completed", 0, -1, 1, 2, 1, 1, 3);
  a.ranks = 3;
  a.hosts = {"b", "a", "b"};
  a.checkpoints = {{{"ok", true}, {"step", 4}, {"attempt", 0}, {"blocked_s", 0.1}, {"persist_s", 0.3}},
                   {{"ok", true}, {"step", 8}, {"attempt", 0}, {"blocked_s", 0.3}, {"persist_s", 0.5}},
                   {{"ok", false}, {"step", 12}, {"attempt", 0}}};
  a.stragglers = {{{"attempt", 0}, {"rank", 2}, {"host", "b"}, {"ratio", 2.0}}};
  sum.attempts.push_back(a);
  sum.wall_s = 4;
  sum.state = FinalState::kCompleted;
  sum.faults_planned = 3;
  sum.faults_fired = 2;
  sum.excluded_hosts = {"c"};
  sum.host_history = {{"c", {{"failures", 2}, {"excluded", true}}}};
  const nlohmann::json r = BuildReport(sum);
  EXPECT_EQ(r["attempts"][0]["hosts"], "a:1,b:2");
  const nlohmann::json& c = r["checkpoints"];
  EXPECT_EQ(c["saves"], 2);
  EXPECT_EQ(c["failed"], 1);
  EXPECT_DOUBLE_EQ(c["blocked_mean_s"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(c["blocked_max_s"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(c["save_mean_s"].get<double>(), 0.6);          // (0.4 + 0.8) / 2
  EXPECT_DOUBLE_EQ(c["blocked_fraction"].get<double>(), 0.4 / 1.2);
  EXPECT_EQ(c["per_save"].size(), 2u);
  EXPECT_EQ(r["stragglers"].size(), 1u);
  EXPECT_EQ(r["faults_planned"], 3);
  EXPECT_EQ(r["faults_fired"], 2);
  EXPECT_EQ(r["excluded_hosts"], (nlohmann::json{"c"}));
  EXPECT_EQ(r["host_history"]["c"]["failures"], 2);

  const std::string text = FormatReport(r);
  EXPECT_NE(text.find("outcome: completed after 1 attempt(s), 4.0 s wall"), std::string::npos) << text;
  EXPECT_NE(text.find("  attempt 0: 3 rank(s) on a:1,b:2, steps 0..2, completed (lost 0 steps, 0.0 s)"),
            std::string::npos) << text;
  EXPECT_NE(text.find("\nETTR 0.500 (productive step time 2.0 s of 4.0 s wall)"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpoints: 2 saves; training blocked 0.200 s per save on average (max 0.300 s), 33.3%"),
            std::string::npos) << text;
  EXPECT_NE(text.find("excluded hosts: [\"c\"]"), std::string::npos) << text;
  sum.state = FinalState::kStopped;
  EXPECT_NE(FormatReport(BuildReport(sum)).find("outcome: NOT completed (stopped) after 1"), std::string::npos);
}

TEST(Report, AFailedWriteNamesTheFileAndKeepsThePreviousReport) {
  const std::string dir = (std::filesystem::temp_directory_path() / "myriad-report-test").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/report.json";
  LaunchSummary sum;
  sum.state = FinalState::kCompleted;
  const nlohmann::json r = BuildReport(sum);
  ASSERT_TRUE(WriteReport(Env::Default(), path, r).ok());
  EXPECT_EQ(nlohmann::json::parse(*Env::Default()->ReadFile(path)), r);

  FaultEnv fenv;
  fenv.SetEnospcAfterBytes(10, "report.json");  // the disk fills part-way
  sum.state = FinalState::kFailed;
  const Status s = WriteReport(&fenv, path, BuildReport(sum));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("cannot write the report: " + path + ".tmp", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("No space left on device"), std::string::npos) << s.message();
  EXPECT_EQ(nlohmann::json::parse(*Env::Default()->ReadFile(path)), r);  // the previous one, whole
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace myriad::supervise
