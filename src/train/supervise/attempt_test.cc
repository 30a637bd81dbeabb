// The attempt monitor (hang detection, outcome classes, stragglers) on
// synthetic heartbeat streams, and the attempt runner on scripted jobs (no
// processes: scripted_runtime.h).
#include <gtest/gtest.h>

#include <signal.h>

#include <string>

#include "train/supervise/attempt.h"
#include "train/supervise/attempt_runner.h"
#include "train/supervise/scripted_runtime.h"

namespace myriad::supervise {
namespace {

using testing::Beat;
using testing::EventMsg;
using testing::ScriptedJob;
using testing::ScriptedRuntime;
using testing::StepMsg;

nlohmann::json At(nlohmann::json m, int attempt = 0) {
  m["attempt"] = attempt;
  return m;
}

AttemptOutcome Seed(int ranks, std::vector<std::string> hosts, int index = 0) {
  AttemptOutcome o;
  o.index = index;
  o.ranks = ranks;
  o.dp = ranks;
  o.hosts = std::move(hosts);
  return o;
}

WatchOptions Watch(double hang_s, double startup_s = 300) {
  WatchOptions w;
  w.hang_timeout_s = hang_s;
  w.startup_timeout_s = startup_s;
  w.heartbeat_s = 0.2;
  return w;
}

// Two ranks after step 10: rank 1 stuck outside any collective, rank 0
// waiting in AllReduce (op #383) from t = 1. Both keep beating every 0.2 s
// up to `until` (rank 1 stops beating at t = 1 when rank1_beats is false).
void FeedTwoRankHang(AttemptMonitor* m, double until, bool rank1_beats = true) {
  m->OnMessage(At(StepMsg(0, "a", 10, 0.1)), 1.0);
  m->OnMessage(At(StepMsg(1, "b", 10, 0.1)), 1.0);
  for (int k = 0;; ++k) {
    const double t = 1.0 + 0.2 * k;
    if (t > until + 1e-9) break;
    m->OnMessage(At(Beat(0, "a", 10, "step", "AllReduce", "mpi world 2", 383, 1, 0.2 * k)), t);
    if (rank1_beats || k == 0) m->OnMessage(At(Beat(1, "b", 10, "hung (injected)", "", "", 382, 0, 0)), t);
  }
}

TEST(HangDetector, NamesTheStuckRankFirstThenTheCollectiveTheOtherWaitsIn) {
  AttemptMonitor m(Seed(2, {"a", "b"}), Watch(4));
  FeedTwoRankHang(&m, 5.0);
  EXPECT_FALSE(m.CheckHang(4.9));  // 3.9 s without progress: not more than the timeout
  m.OnMessage(At(Beat(0, "a", 10, "step", "AllReduce", "mpi world 2", 383, 1, 4.2)), 5.2);
  m.OnMessage(At(Beat(1, "b", 10, "hung (injected)", "", "", 382, 0, 0)), 5.2);
  ASSERT_TRUE(m.CheckHang(5.2));
  EXPECT_EQ(m.hang_report(),
            "no progress for 4.2 s; rank 1 (host b): step 10, phase hung (injected), not in a collective (last: none); "
            "rank 0 (host a): step 10, phase step, waiting in AllReduce on \"mpi world 2\" (op #383) for 4.2 s");
  EXPECT_EQ(m.outcome().outcome, "hang");
  EXPECT_EQ(m.outcome().blamed_hosts, (std::set<std::string>{"b"}));  // not the host of the waiting rank
  EXPECT_FALSE(m.CheckHang(6.0));  // reported once
  const AttemptOutcome o = m.Finish({0, SIGKILL}, 6.0);
  EXPECT_EQ(o.outcome, "hang");  // the exit that followed does not reclassify it
  EXPECT_EQ(o.exit_code, 128 + SIGKILL);
}

TEST(HangDetector, SaysWhenARanksHeartbeatsStopped) {
  AttemptMonitor m(Seed(2, {"a", "b"}), Watch(4));
  FeedTwoRankHang(&m, 5.2, /*rank1_beats=*/false);
  ASSERT_TRUE(m.CheckHang(5.2));
  // Rank 1's last message is 4.2 s old, more than 3 beats + 1 s.
  EXPECT_NE(m.hang_report().find("rank 1 (host b): step 10, phase hung (injected), not in a collective (last: none), "
                                 "heartbeats stopped; rank 0"),
            std::string::npos)
      << m.hang_report();
}

TEST(HangDetector, CollectivesThatAdvanceAreProgress) {
  // Rank 0 sits in collectives the whole time but their sequence number moves:
  // not a hang, however long the step.
  AttemptMonitor m(Seed(1, {"a"}), Watch(2));
  for (int k = 0; k <= 100; ++k) {
    m.OnMessage(At(Beat(0, "a", 3, "step", "AllToAll", "ep 2", 10 + k, 1, 0.1)), 0.2 * k);
    EXPECT_FALSE(m.CheckHang(0.2 * k)) << k;
  }
  // Then the sequence stops: a hang 2 s later (the last change was at t = 20).
  for (int k = 101; k <= 112; ++k) m.OnMessage(At(Beat(0, "a", 3, "step", "AllToAll", "ep 2", 110, 1, 0.2 * (k - 100))), 0.2 * k);
  EXPECT_FALSE(m.CheckHang(21.9));
  EXPECT_TRUE(m.CheckHang(22.1));
  EXPECT_NE(m.hang_report().find("waiting in AllToAll on \"ep 2\" (op #110)"), std::string::npos) << m.hang_report();
}

TEST(HangDetector, ARankThatNeverReportsCountsAfterTheStartupTimeout) {
  AttemptMonitor m(Seed(2, {"a", "b"}), Watch(100, /*startup_s=*/3));
  for (int k = 1; k <= 20; ++k) {
    m.OnMessage(At(StepMsg(0, "a", k, 0.1)), 0.2 * k);  // rank 0 makes progress
    if (0.2 * k <= 3.0) {
      EXPECT_FALSE(m.CheckHang(0.2 * k)) << k;
    }
  }
  ASSERT_TRUE(m.CheckHang(4.0));
  EXPECT_EQ(m.hang_report().rfind("1 rank(s) never reported within 3 s; ", 0), 0u) << m.hang_report();
  EXPECT_NE(m.hang_report().find("rank 1: never reported"), std::string::npos) << m.hang_report();
}

TEST(AttemptOutcome, ClassesExitsAndEvents) {
  {  // rank 0 said it completed, exit 0
    AttemptMonitor m(Seed(1, {"solo"}), Watch(10));
    m.OnMessage(At(EventMsg(0, "solo", "start", {{"resumed_step", 8}})), 0.5);
    for (int s = 9; s <= 12; ++s) m.OnMessage(At(StepMsg(0, "solo", s, 0.25)), 0.5 + 0.25 * (s - 8));
    m.OnMessage(At(EventMsg(0, "solo", "checkpoint", {{"ok", true}, {"blocked_s", 0.01}})), 1.6);
    m.OnMessage(At(EventMsg(0, "solo", "exit", {{"ok", true}, {"completed", true}})), 1.7);
    const AttemptOutcome o = m.Finish({0, 0}, 1.8);
    EXPECT_EQ(o.outcome, "completed");
    EXPECT_EQ(o.resumed_step, 8);
    EXPECT_EQ(o.last_step, 12);
    ASSERT_EQ(o.steps.size(), 4u);
    EXPECT_DOUBLE_EQ(o.steps.at(9).done_s, 0.75);
    EXPECT_DOUBLE_EQ(o.steps.at(9).step_s, 0.25);
    EXPECT_EQ(o.checkpoints.size(), 1u);
    EXPECT_DOUBLE_EQ(o.end_s, 1.8);
  }
  {  // killed without an exit event: a crash, the silent rank named and blamed
    AttemptMonitor m(Seed(1, {"solo"}), Watch(10));
    m.OnMessage(At(StepMsg(0, "solo", 7, 0.1)), 1.0);
    const AttemptOutcome o = m.Finish({0, SIGKILL}, 1.1);
    EXPECT_EQ(o.outcome, "crash");
    EXPECT_EQ(o.detail, "exit 137; no exit report from rank 0 (host solo)");
    EXPECT_EQ(o.blamed_hosts, (std::set<std::string>{"solo"}));
  }
  {  // two ranks both silent: cannot tell which host, none blamed
    AttemptMonitor m(Seed(2, {"a", "b"}), Watch(10));
    m.OnMessage(At(StepMsg(0, "a", 7, 0.1)), 1.0);
    m.OnMessage(At(StepMsg(1, "b", 7, 0.1)), 1.0);
    const AttemptOutcome o = m.Finish({1, 0}, 1.1);
    EXPECT_EQ(o.outcome, "crash");
    EXPECT_TRUE(o.blamed_hosts.empty());
  }
  {  // one of two ranks said why it failed: the other is the one blamed
    AttemptMonitor m(Seed(2, {"a", "b"}), Watch(10));
    m.OnMessage(At(StepMsg(0, "a", 7, 0.1)), 1.0);
    m.OnMessage(At(EventMsg(1, "b", "exit", {{"ok", false}, {"message", "peer lost"}})), 1.0);
    const AttemptOutcome o = m.Finish({1, 0}, 1.1);
    EXPECT_EQ(o.outcome, "crash");
    EXPECT_EQ(o.detail, "exit 1; no exit report from rank 0 (host a)");
    EXPECT_EQ(o.blamed_hosts, (std::set<std::string>{"a"}));
  }
  {  // numerical event, then exit 3
    AttemptMonitor m(Seed(1, {"solo"}), Watch(10));
    m.OnMessage(At(EventMsg(0, "solo", "numerical", {{"message", "loss is NaN at step 6"}})), 1.0);
    const AttemptOutcome o = m.Finish({3, 0}, 1.1);
    EXPECT_EQ(o.outcome, "numerical");
    EXPECT_EQ(o.detail, "loss is NaN at step 6");
    EXPECT_TRUE(o.blamed_hosts.empty());
  }
  {  // a failed health check names and blames its host
    AttemptMonitor m(Seed(2, {"a", "b"}), Watch(10));
    m.OnMessage(At(EventMsg(1, "b", "health", {{"ok", false}, {"report", {{"failure", "gemm mismatch"}}}})), 0.3);
    const AttemptOutcome o = m.Finish({4, 0}, 0.4);
    EXPECT_EQ(o.outcome, "health");
    EXPECT_EQ(o.detail, "rank 1 on b");
    EXPECT_EQ(o.blamed_hosts, (std::set<std::string>{"b"}));
  }
  {  // exit codes alone
    const std::pair<int, const char*> codes[] = {{3, "numerical"}, {4, "health"}, {5, "checkpoint"}, {2, "crash"}};
    for (const auto& [code, want] : codes) {
      AttemptMonitor m(Seed(1, {"solo"}), Watch(10));
      EXPECT_EQ(m.Finish({code, 0}, 1).outcome, want) << code;
    }
  }
  {  // exit 0 before the last step, asked or not
    AttemptMonitor asked(Seed(1, {"solo"}), Watch(10)), not_asked(Seed(1, {"solo"}), Watch(10));
    asked.NoteStopForwarded();
    const AttemptOutcome a = asked.Finish({0, 0}, 1), n = not_asked.Finish({0, 0}, 1);
    EXPECT_EQ(a.outcome, "stopped");
    EXPECT_EQ(a.detail, "by signal; checkpoint written");
    EXPECT_EQ(n.outcome, "stopped");
    EXPECT_EQ(n.detail, "exited before the last step without being asked");
  }
  {  // after a forwarded stop both ranks exited cleanly (checkpoint written),
     // but mpirun says 1: stopped, not a crash; one rank without a clean exit:
     // a crash
    for (bool both : {true, false}) {
      AttemptMonitor m(Seed(2, {"a", "b"}), Watch(10));
      m.OnMessage(At(StepMsg(0, "a", 7, 0.1)), 1.0);
      m.OnMessage(At(StepMsg(1, "b", 7, 0.1)), 1.0);
      m.NoteStopForwarded();
      m.OnMessage(At(EventMsg(0, "a", "exit", {{"ok", true}, {"completed", false}, {"reason", "signal"}})), 1.2);
      if (both) m.OnMessage(At(EventMsg(1, "b", "exit", {{"ok", true}, {"reason", "signal"}})), 1.2);
      const AttemptOutcome o = m.Finish({1, 0}, 1.3);
      EXPECT_EQ(o.outcome, both ? "stopped" : "crash") << both;
      if (both) {
        EXPECT_EQ(o.detail, "by signal; checkpoint written (every rank exited cleanly; the launcher's exit 1)");
      }
      EXPECT_EQ(o.exit_code, 1);
    }
  }
  {  // a late datagram of the previous attempt is not this attempt's
    AttemptMonitor m(Seed(1, {"solo"}, /*index=*/1), Watch(10));
    m.OnMessage(At(StepMsg(0, "solo", 7, 0.1), /*attempt=*/0), 0.1);
    const AttemptOutcome o = m.Finish({0, SIGKILL}, 0.2);
    EXPECT_TRUE(o.steps.empty());
    EXPECT_EQ(o.detail, "exit 137");  // no rank of this attempt was heard
  }
}

TEST(AttemptOutcome, AStragglerIsReportedOnceWithItsHost) {
  // Three ranks; rank 2 computes 0.2 s per step, the others 0.1 s: median
  // over ranks 0.1, ratio 2 > 1.5. Judged when rank 0's window (8) is full.
  AttemptMonitor m(Seed(3, {"a", "b", "c"}), Watch(10));
  for (int s = 1; s <= 12; ++s) {
    const double t = s;
    m.OnMessage(At(StepMsg(1, "b", s, 0.2, 0.1)), t);
    m.OnMessage(At(StepMsg(2, "c", s, 0.2, 0.2)), t);
    m.OnMessage(At(StepMsg(0, "a", s, 0.2, 0.1)), t);
    EXPECT_EQ(m.outcome().stragglers.size(), s < 8 ? 0u : 1u) << s;
  }
  const nlohmann::json& sg = m.outcome().stragglers.at(0);
  EXPECT_EQ(sg["rank"], 2);
  EXPECT_EQ(sg["host"], "c");
  EXPECT_DOUBLE_EQ(sg["ratio"].get<double>(), 2.0);
}

// ---- the runner on scripted jobs

AttemptCommand Command(bool use_mpi) {
  AttemptCommand c;
  c.argv = {use_mpi ? "mpirun" : "myriad", "train"};
  c.use_mpi = use_mpi;
  return c;
}

ScriptedJob HangingJob(double until) {  // beats every 0.2 s, stuck at step 9 outside any collective
  ScriptedJob j;
  j.messages.push_back({0.1, StepMsg(0, "solo", 9, 0.1)});
  for (double t = 0.2; t < until; t += 0.2) j.messages.push_back({t, Beat(0, "solo", 9, "hung (injected)")});
  return j;
}

TEST(AttemptRunner, ALoneHungProcessIsKilledWithItsGroup) {
  ScriptedRuntime rt;
  rt.jobs.push_back(HangingJob(60));
  const double launch_start = rt.now - 5;
  auto o = RunAttempt(Command(false), Seed(1, {"solo"}), Watch(2), &rt, launch_start);
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->outcome, "hang");
  EXPECT_EQ(o->exit_code, 128 + SIGKILL);
  ASSERT_EQ(rt.signals.size(), 1u);
  EXPECT_EQ(rt.signals[0].sig, SIGKILL);
  EXPECT_TRUE(rt.signals[0].whole_group);
  // The last progress was at 0.2 s (the phase changed): killed just after 2.2 s.
  EXPECT_GT(rt.signals[0].at - rt.start_times[0], 2.2);
  EXPECT_LT(rt.signals[0].at - rt.start_times[0], 2.4);
  EXPECT_DOUBLE_EQ(o->start_s, 5.0);  // on the launch's timeline
  EXPECT_NEAR(o->end_s, 5.0 + (rt.signals[0].at - rt.start_times[0]), 0.1);
}

TEST(AttemptRunner, AHungMpiJobGetsSigtermThenSigkillWhenItStays) {
  ScriptedRuntime rt;
  rt.jobs.push_back(HangingJob(60));  // ignores SIGTERM
  auto o = RunAttempt(Command(true), Seed(1, {"solo"}), Watch(2), &rt, rt.now);
  ASSERT_TRUE(o.ok());
  ASSERT_EQ(rt.signals.size(), 2u);
  EXPECT_EQ(rt.signals[0].sig, SIGTERM);
  EXPECT_FALSE(rt.signals[0].whole_group);  // to mpirun, which ends every rank
  EXPECT_EQ(rt.signals[1].sig, SIGKILL);
  EXPECT_TRUE(rt.signals[1].whole_group);
  EXPECT_GT(rt.signals[1].at - rt.signals[0].at, 10.0);
  EXPECT_LT(rt.signals[1].at - rt.signals[0].at, 10.2);
  EXPECT_EQ(o->outcome, "hang");

  ScriptedRuntime polite;  // goes on SIGTERM: no SIGKILL
  ScriptedJob j = HangingJob(60);
  j.term_exit_after_s = 0.5;
  polite.jobs.push_back(j);
  ASSERT_TRUE(RunAttempt(Command(true), Seed(1, {"solo"}), Watch(2), &polite, polite.now).ok());
  EXPECT_EQ(polite.signals.size(), 1u);
}

TEST(AttemptRunner, ForwardsAStopOnceAndTheJobStops) {
  ScriptedRuntime rt;
  ScriptedJob j;
  for (int s = 1; s <= 100; ++s) j.messages.push_back({0.1 * s, StepMsg(0, "solo", s, 0.1)});
  j.stop_exit_after_s = 0.3;  // checkpoints and exits 0
  j.term_exit_after_s = 0.3;  // SIGTERM would kill it
  rt.jobs.push_back(j);
  rt.stop_at = rt.now + 1.0;
  auto o = RunAttempt(Command(false), Seed(1, {"solo"}), Watch(2), &rt, rt.now);
  ASSERT_TRUE(o.ok());
  ASSERT_EQ(rt.signals.size(), 1u);
  EXPECT_EQ(rt.signals[0].sig, kJobStopSignal);
  EXPECT_FALSE(rt.signals[0].whole_group);
  EXPECT_TRUE(o->stop_forwarded);
  EXPECT_EQ(o->outcome, "stopped");
  EXPECT_GE(o->last_step, 10);
  EXPECT_LE(o->last_step, 14);
}

// mpirun, sent SIGTERM, SIGTERMs the ranks, SIGKILLs them a moment later and
// exits 1: the stop goes to it as kJobStopSignal, which it forwards to every
// rank -- and only once every rank has reported (before that a rank is still
// starting and has no handler for it).
TEST(AttemptRunner, AStopToMpirunWaitsForEveryRankAndIsNotSigterm) {
  ScriptedRuntime rt;
  ScriptedJob j;
  j.messages.push_back({0.2, EventMsg(0, "a", "start", {{"resumed_step", 0}})});
  j.messages.push_back({2.0, Beat(1, "b", 0, "init")});  // rank 1 reports late
  for (int s = 1; s <= 100; ++s) {
    j.messages.push_back({2.0 + 0.1 * s, StepMsg(0, "a", s, 0.1)});
    j.messages.push_back({2.0 + 0.1 * s, StepMsg(1, "b", s, 0.1)});
  }
  j.stop_exit_after_s = 0.3;
  j.term_exit_after_s = 0.3;  // SIGTERM: killed
  rt.jobs.push_back(j);
  rt.stop_at = rt.now + 1.0;  // while rank 1 is still starting
  auto o = RunAttempt(Command(true), Seed(2, {"a", "b"}), Watch(30), &rt, rt.now);
  ASSERT_TRUE(o.ok());
  ASSERT_EQ(rt.signals.size(), 1u);
  EXPECT_EQ(rt.signals[0].sig, kJobStopSignal);
  EXPECT_FALSE(rt.signals[0].whole_group);  // to mpirun, which forwards it
  EXPECT_GE(rt.signals[0].at - rt.start_times[0], 2.0);  // not before rank 1 was heard
  EXPECT_LT(rt.signals[0].at - rt.start_times[0], 2.2);
  EXPECT_EQ(o->outcome, "stopped");
}

TEST(AttemptRunner, CollectsEverythingUpToAndAfterTheExit) {
  ScriptedRuntime rt;
  ScriptedJob j;
  j.messages.push_back({0.2, EventMsg(0, "solo", "start", {{"resumed_step", 4}})});
  for (int s = 5; s <= 8; ++s) j.messages.push_back({0.2 + 0.25 * (s - 4), StepMsg(0, "solo", s, 0.25)});
  j.messages.push_back({1.5, EventMsg(0, "solo", "exit", {{"ok", true}, {"completed", true}})});
  j.exit_after_s = 1.5;  // the exit event and the exit at the same time
  rt.jobs.push_back(j);
  auto o = RunAttempt(Command(false), Seed(1, {"solo"}), Watch(2), &rt, rt.now - 10);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->outcome, "completed");
  EXPECT_EQ(o->resumed_step, 4);
  EXPECT_EQ(o->last_step, 8);
  EXPECT_NEAR(o->steps.at(5).done_s, 10.45, 1e-9);
  EXPECT_TRUE(rt.signals.empty());

  ScriptedRuntime broken;
  ScriptedJob f;
  f.start_fails = true;
  broken.jobs.push_back(f);
  auto e = RunAttempt(Command(false), Seed(1, {"solo"}), Watch(2), &broken, 0);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("fork"), std::string::npos);
}

TEST(AttemptCommand, MpirunPassesTheSupervisorsVariables) {
  CommandInputs in;
  in.attempt = 2;
  in.myriad_bin = "/bin/myriad";
  in.config_path = "c.toml";
  in.sets = {"parallel.dp=1"};
  in.train_args = {"-q"};
  in.ranks = 2;
  in.launcher_args = {"--oversubscribe"};
  in.mpi_hosts = "a:1,b:1";
  in.supervisor_address = "127.0.0.1:9";
  const AttemptCommand c = BuildAttemptCommand(in);
  EXPECT_TRUE(c.use_mpi);
  std::string line;
  for (const auto& a : c.argv) line += a + " ";
  EXPECT_EQ(line,
            "mpirun -np 2 --oversubscribe --host a:1,b:1 -x MYRIAD_SUPERVISOR -x MYRIAD_ATTEMPT -x MYRIAD_FAULTS "
            "-x MYRIAD_FAULT_DIR -x MYRIAD_HEARTBEAT_S -x MYRIAD_EMULATED_HOSTS -x MYRIAD_SUPERVISOR_PID "
            "-x MYRIAD_SUPERVISOR_HOST /bin/myriad train --config c.toml --set parallel.dp=1 -q ");
  EXPECT_EQ(c.env[0], (std::pair<std::string, std::string>{"MYRIAD_SUPERVISOR", "127.0.0.1:9"}));
  EXPECT_EQ(c.env[1].second, "2");
  in.ranks = 1;
  in.supervisor_pid = 4321;  // the ranks' lifeline and run lock (lifeline.h, run_lock.h)
  in.supervisor_host = "vm";
  const AttemptCommand one = BuildAttemptCommand(in);
  EXPECT_FALSE(one.use_mpi);
  EXPECT_EQ(one.argv[0], "/bin/myriad");
  auto env_of = [&](const std::string& k) {
    for (const auto& [n, v] : one.env)
      if (n == k) return v;
    return std::string("<unset>");
  };
  EXPECT_EQ(env_of("MYRIAD_SUPERVISOR_PID"), "4321");
  EXPECT_EQ(env_of("MYRIAD_SUPERVISOR_HOST"), "vm");
}

}  // namespace
}  // namespace myriad::supervise
