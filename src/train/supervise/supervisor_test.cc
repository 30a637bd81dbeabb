// The supervision loop (Supervise) on scripted jobs: attempts, restarts,
// host exclusion, stops, the budget, and the files it writes through Env --
// including a report write that fails (FaultEnv) without losing the state.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "core/fault_env.h"
#include "train/supervise/scripted_runtime.h"
#include "train/supervise/supervisor.h"

namespace myriad::supervise {
namespace {

using testing::EventMsg;
using testing::ScriptedJob;
using testing::ScriptedRuntime;
using testing::StepMsg;

class SuperviseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("myriad-supervise-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    opt_.config_path = "c.toml";
    opt_.overrides = {"train.steps=8"};
    opt_.hosts = {{"solo", 1}};
    opt_.emulate_hosts = true;
    opt_.backoff_s = 0.5;
    opt_.hang_timeout_s = 2;
    opt_.heartbeat_s = 0.2;
    setup_.state_dir = dir_;
    setup_.myriad_bin = "/bin/myriad";
    setup_.dp = 1;
    setup_.ckpt_every = 4;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Read(const std::string& name) {
    auto r = Env::Default()->ReadFile(dir_ + "/" + name);
    return r.ok() ? *r : "";
  }
  static std::string EnvOf(const AttemptCommand& c, const std::string& var) {
    for (const auto& [k, v] : c.env)
      if (k == var) return v;
    return "<unset>";
  }
  static bool Has(const AttemptCommand& c, const std::string& arg) {
    return std::find(c.argv.begin(), c.argv.end(), arg) != c.argv.end();
  }

  // Steps first..last of 0.1 s on rank `rank`, from 0.1 s after the start.
  static void Steps(ScriptedJob* j, int64_t first, int64_t last, int rank = 0, const std::string& host = "solo") {
    for (int64_t s = first; s <= last; ++s)
      j->messages.push_back({0.1 * static_cast<double>(s - first + 2), StepMsg(rank, host, s, 0.1)});
  }
  // Resumes from `resumed`, runs to step 8 and completes.
  static ScriptedJob Completes(int64_t resumed, const std::string& host = "solo") {
    ScriptedJob j;
    j.messages.push_back({0.1, EventMsg(0, host, "start", {{"resumed_step", resumed}})});
    Steps(&j, resumed + 1, 8, 0, host);
    const double end = 0.1 * static_cast<double>(8 - resumed + 2);
    j.messages.push_back({end, EventMsg(0, host, "exit", {{"ok", true}, {"completed", true}})});
    j.exit_after_s = end;
    return j;
  }
  // Runs steps 1..6 and is killed (no exit event).
  static ScriptedJob Killed() {
    ScriptedJob j;
    j.messages.push_back({0.1, EventMsg(0, "solo", "start", {{"resumed_step", 0}})});
    Steps(&j, 1, 6);
    j.exit_after_s = 0.8;
    j.exit = {0, SIGKILL};
    return j;
  }

  std::string dir_;
  LaunchOptions opt_;
  LaunchSetup setup_;
};

TEST_F(SuperviseTest, RestartsAfterACrashAndWritesReportAndHostsThroughEnv) {
  auto plan = ParseFaults("kill:step=6");
  ASSERT_TRUE(plan.ok());
  setup_.plan = *plan;
  // The rank fires the fault during attempt 0 (its marker is there when the
  // supervisor looks after the attempt).
  std::filesystem::create_directories(dir_ + "/faults");
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), dir_ + "/faults/fired_0", "", false).ok());
  ScriptedRuntime rt;
  rt.jobs = {Killed(), Completes(4)};
  nlohmann::json report;
  const Status s = Supervise(opt_, setup_, &rt, rt.now - 2, &report);
  ASSERT_TRUE(s.ok()) << s.message();

  ASSERT_EQ(rt.started.size(), 2u);
  EXPECT_EQ(EnvOf(rt.started[0], "MYRIAD_FAULTS"), "kill:id=0,rank=0,step=6");
  EXPECT_EQ(EnvOf(rt.started[1], "MYRIAD_FAULTS"), "");  // fired: left out of the next attempt
  EXPECT_EQ(EnvOf(rt.started[1], "MYRIAD_ATTEMPT"), "1");
  EXPECT_EQ(EnvOf(rt.started[1], "MYRIAD_EMULATED_HOSTS"), "solo");
  EXPECT_EQ(EnvOf(rt.started[1], "MYRIAD_FAULT_DIR"), dir_ + "/faults");
  EXPECT_TRUE(Has(rt.started[1], "train.steps=8"));
  EXPECT_EQ(rt.started[1].argv[0], "/bin/myriad");  // one rank: no mpirun
  // The backoff (0.5 s) lies between the crash and the restart.
  EXPECT_GE(rt.start_times[1] - (rt.start_times[0] + 0.8), 0.5);
  EXPECT_LT(rt.start_times[1] - (rt.start_times[0] + 0.8), 0.7);

  EXPECT_EQ(report["state"], "completed");
  ASSERT_EQ(report["attempts"].size(), 2u);
  EXPECT_EQ(report["attempts"][0]["outcome"], "crash");
  EXPECT_EQ(report["attempts"][0]["lost_steps"], 2);  // 5 and 6, redone from checkpoint 4
  EXPECT_EQ(report["attempts"][1]["outcome"], "completed");
  EXPECT_EQ(report["faults_planned"], 1);
  EXPECT_EQ(report["faults_fired"], 1);
  EXPECT_EQ(report["restarts"], 1);
  EXPECT_GT(report["wall_s"].get<double>(), 2.0);  // counted from the launch's start
  EXPECT_EQ(nlohmann::json::parse(Read("report.json")), report);
  const auto hosts = nlohmann::json::parse(Read("hosts.json"));
  EXPECT_EQ(hosts["hosts"]["solo"]["failures"], 1);
  EXPECT_FALSE(hosts["hosts"]["solo"].value("excluded", false));  // the only host
}

TEST_F(SuperviseTest, AReportThatCannotBeWrittenIsAClearErrorAndLosesNoState) {
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), dir_ + "/report.json", "{\"old\": true}\n").ok());
  FaultEnv fenv;
  fenv.SetFailRename("report.json");
  opt_.env = &fenv;
  ScriptedRuntime rt;
  rt.jobs = {Killed(), Completes(4)};
  nlohmann::json report;
  const Status s = Supervise(opt_, setup_, &rt, rt.now, &report);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.message();
  EXPECT_EQ(m.rfind("launch: cannot write the report: " + dir_ + "/report.json.tmp: rename to " + dir_ +
                        "/report.json failed",
                    0),
            0u)
      << m;
  EXPECT_NE(m.find("; the job completed; the report is printed above (hint: room and permissions in " + dir_ + ")"),
            std::string::npos)
      << m;
  EXPECT_GE(fenv.faults_fired(), 1);
  // Nothing lost: the report is handed back whole, the earlier report.json is
  // intact (not torn), and the host history was saved.
  EXPECT_EQ(report["state"], "completed");
  EXPECT_EQ(report["attempts"].size(), 2u);
  EXPECT_EQ(Read("report.json"), "{\"old\": true}\n");
  EXPECT_EQ(nlohmann::json::parse(Read("hosts.json"))["hosts"]["solo"]["failures"], 1);

  // A job that failed, and a report that cannot be written: both said.
  opt_.max_restarts = 0;
  ScriptedRuntime rt2;
  rt2.jobs = {Killed()};
  const Status f = Supervise(opt_, setup_, &rt2, rt2.now, &report);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.message().find("cannot write the report"), std::string::npos) << f.message();
  EXPECT_NE(f.message().find("; launch: restart budget spent (0 restarts); last: crash: exit 137"), std::string::npos)
      << f.message();
  EXPECT_EQ(report["state"], "failed");
}

TEST_F(SuperviseTest, AHostThatKeepsFailingIsExcludedAndTheJobFinishesOnTheOther) {
  opt_.hosts = {{"node0", 1}, {"node1", 1}};
  opt_.exclude_after = 2;
  setup_.dp = 2;
  auto failing_health = [] {
    ScriptedJob j;
    j.messages.push_back({0.1, EventMsg(0, "node0", "health", {{"ok", true}}, 0, "health")});
    j.messages.push_back({0.1, EventMsg(1, "node1", "health", {{"ok", false}, {"report", {{"failure", "injected"}}}},
                                        0, "health")});
    j.exit_after_s = 0.3;
    j.exit = {4, 0};
    return j;
  };
  ScriptedRuntime rt;
  rt.jobs = {failing_health(), failing_health(), Completes(0, "node0")};
  nlohmann::json report;
  const Status s = Supervise(opt_, setup_, &rt, rt.now, &report);
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(rt.started.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(rt.started[i].argv[0], "mpirun") << i;
    EXPECT_TRUE(Has(rt.started[i], "-np") && Has(rt.started[i], "2")) << i;
    EXPECT_FALSE(Has(rt.started[i], "--host")) << i;  // emulated: names only
    EXPECT_EQ(EnvOf(rt.started[i], "MYRIAD_EMULATED_HOSTS"), "node0,node1");
  }
  EXPECT_EQ(rt.started[2].argv[0], "/bin/myriad");
  EXPECT_TRUE(Has(rt.started[2], "parallel.dp=1"));
  EXPECT_EQ(EnvOf(rt.started[2], "MYRIAD_EMULATED_HOSTS"), "node0");
  EXPECT_EQ(report["excluded_hosts"], (nlohmann::json{"node1"}));
  EXPECT_EQ(report["attempts"][0]["outcome"], "health");
  EXPECT_EQ(report["attempts"][2]["dp"], 1);
  EXPECT_EQ(report["attempts"][2]["hosts"], "node0:1");
  const auto hosts = nlohmann::json::parse(Read("hosts.json"));
  EXPECT_EQ(hosts["hosts"]["node1"]["failures"], 2);
  EXPECT_EQ(hosts["hosts"]["node1"]["excluded"], true);
  EXPECT_FALSE(hosts["hosts"].contains("node0"));

  // The next launch starts without the excluded host.
  ScriptedRuntime again;
  again.jobs = {Completes(8, "node0")};
  ASSERT_TRUE(Supervise(opt_, setup_, &again, again.now, &report).ok());
  EXPECT_TRUE(Has(again.started[0], "parallel.dp=1"));
}

TEST_F(SuperviseTest, AStopDuringTheBackoffEndsTheLaunchAsStopped) {
  ScriptedRuntime rt;
  rt.jobs = {Killed(), Completes(4)};
  rt.stop_at = rt.now + 1.0;  // after the crash (0.8 s), during the 0.5 s backoff
  nlohmann::json report;
  const Status s = Supervise(opt_, setup_, &rt, rt.now, &report);
  EXPECT_TRUE(s.ok()) << s.message();  // asked to stop, and stopped: exit 0
  EXPECT_EQ(rt.started.size(), 1u);
  EXPECT_EQ(report["state"], "stopped");
  EXPECT_EQ(nlohmann::json::parse(Read("report.json"))["state"], "stopped");
}

// SIGTERM to `myriad launch` while the job trains: the job is asked to stop
// (kJobStopSignal), checkpoints and exits -- even when mpirun's own exit code
// says 1, every rank said it stopped cleanly -- and the launch reports
// "stopped" and succeeds; nothing restarts.
TEST_F(SuperviseTest, AStopForwardedToTheJobIsReportedStoppedNotACrash) {
  ScriptedRuntime rt;
  ScriptedJob j;
  j.messages.push_back({0.1, EventMsg(0, "solo", "start", {{"resumed_step", 0}})});
  Steps(&j, 1, 20);
  j.messages.push_back({1.25, EventMsg(0, "solo", "exit", {{"ok", true}, {"completed", false}, {"reason", "signal"}})});
  std::sort(j.messages.begin(), j.messages.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  j.stop_exit_after_s = 0.3;
  j.stop_exit = {1, 0};
  rt.jobs = {j, Completes(10)};
  rt.stop_at = rt.now + 1.0;
  nlohmann::json report;
  const Status s = Supervise(opt_, setup_, &rt, rt.now, &report);
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(rt.started.size(), 1u);
  ASSERT_EQ(rt.signals.size(), 1u);
  EXPECT_EQ(rt.signals[0].sig, kJobStopSignal);
  EXPECT_EQ(report["state"], "stopped");
  ASSERT_EQ(report["attempts"].size(), 1u);
  EXPECT_EQ(report["attempts"][0]["outcome"], "stopped");
  EXPECT_EQ(nlohmann::json::parse(Read("report.json"))["attempts"][0]["outcome"], "stopped");
}

TEST_F(SuperviseTest, GivesUpWhenTheRestartBudgetIsSpent) {
  opt_.max_restarts = 1;
  ScriptedRuntime rt;
  rt.jobs = {Killed(), Killed()};
  nlohmann::json report;
  const Status s = Supervise(opt_, setup_, &rt, rt.now, &report);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("launch: restart budget spent (1 restarts); last: crash: exit 137; no exit report from "
                              "rank 0 (host solo)",
                              0),
            0u)
      << s.message();
  EXPECT_EQ(report["state"], "failed");
  EXPECT_EQ(report["restarts"], 1);
  EXPECT_EQ(report["attempts"].size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(Read("hosts.json"))["hosts"]["solo"]["failures"], 2);
}

}  // namespace
}  // namespace myriad::supervise
