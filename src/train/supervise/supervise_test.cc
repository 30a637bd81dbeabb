// Fault plans, heartbeats over real UDP, the communication trace, host lists.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "train/comm/trace.h"
#include "train/supervise/faults.h"
#include "train/supervise/heartbeat.h"
#include "train/supervise/supervisor.h"

namespace myriad::supervise {
namespace {

TEST(FaultSpec, ParsesEveryKindAndRoundTrips) {
  auto f = ParseFaults("kill:rank=1,step=7;hang:step=9;nan:rank=2,step=3;tear:step=8;corrupt:step=12;"
                       "health:host=node1;health:host=n2,once=1;diskfull:step=4;slow:rank=1,ms=30");
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->size(), 9u);
  EXPECT_EQ((*f)[8].ms, 30);
  EXPECT_EQ((*f)[8].step, 1);       // from the start
  EXPECT_FALSE((*f)[8].one_shot());  // every step
  EXPECT_EQ((*f)[0].kind, FaultKind::kKill);
  EXPECT_EQ((*f)[0].rank, 1);
  EXPECT_EQ((*f)[0].step, 7);
  EXPECT_EQ((*f)[1].rank, 0);  // default
  EXPECT_EQ((*f)[5].host, "node1");
  EXPECT_FALSE((*f)[5].one_shot());  // a host that keeps failing
  EXPECT_TRUE((*f)[6].one_shot());
  for (size_t i = 0; i < f->size(); ++i) EXPECT_EQ((*f)[i].id, static_cast<int>(i));
  auto again = ParseFaults(FaultsToSpec(*f));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(FaultsToSpec(*again), FaultsToSpec(*f));
}

TEST(FaultSpec, BadSpecsNameTheirProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"explode:step=3", "unknown kind \"explode\""},
      {"kill:rank=1", "needs step=S"},
      {"kill:step=0", "needs step=S"},
      {"kill:step=x", "step=\"x\" is not a number"},
      {"kill:step=3,when=now", "unknown key \"when\""},
      {"kill:step", "\"step\" is not key=value"},
      {"health:step=2", "health needs host=NAME"},
      {"health:host=a,once=2", "once=\"2\" must be 0 or 1"},
      {"slow:rank=1", "slow needs ms=N"},
  };
  for (const auto& [spec, want] : cases) {
    auto f = ParseFaults(spec);
    ASSERT_FALSE(f.ok()) << spec;
    EXPECT_NE(f.status().message().find(want), std::string::npos) << f.status().message();
  }
  EXPECT_TRUE(ParseFaults("").ok());
}

TEST(FaultInjector, FiresOnItsRankAndStepOnceAndLeavesAMarker) {
  const std::string dir = (std::filesystem::temp_directory_path() / "myriad-fault-test").string();
  std::filesystem::remove_all(dir);
  auto plan = ParseFaults("nan:rank=1,step=5;diskfull:step=8;health:host=h1;tear:step=12");
  ASSERT_TRUE(plan.ok());
  FaultInjector r0(*plan, 0, "h0", dir), r1(*plan, 1, "h1", dir);
  EXPECT_FALSE(r0.NanAt(5));  // another rank's
  EXPECT_FALSE(r1.NanAt(4));
  EXPECT_TRUE(r1.NanAt(5));
  EXPECT_FALSE(r1.DiskFullAt(8));  // rank 0 writes checkpoints
  EXPECT_TRUE(r0.DiskFullAt(8));
  EXPECT_EQ(r0.HealthFailure(), "");
  EXPECT_NE(r1.HealthFailure().find("health:id=2,host=h1"), std::string::npos);
  EXPECT_TRUE(r0.DamageAt(12));
  EXPECT_FALSE(r0.DamageAt(8));
  EXPECT_FALSE(r1.DamageAt(12));
  // Markers for the one-shot faults that fired (not for the host's health fault).
  EXPECT_EQ(FiredFaults(dir, *plan), (std::vector<int>{0, 1}));
  r0.AfterStep(5);  // nothing planned: returns
  std::filesystem::remove_all(dir);
}

TEST(Heartbeat, DatagramsReachTheListener) {
  auto listener = HeartbeatListener::Open("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().message();
  setenv("MYRIAD_SUPERVISOR", (*listener)->address().c_str(), 1);
  setenv("MYRIAD_EMULATED_HOSTS", "a,a,b,b", 1);
  setenv("MYRIAD_ATTEMPT", "3", 1);
  Heartbeat& hb = Heartbeat::Global();
  hb.Start(/*rank=*/2, /*world=*/4, /*interval_s=*/0.05);
  ASSERT_TRUE(hb.enabled());
  EXPECT_EQ(hb.host(), "b");
  hb.SetPhase("step");
  hb.StepDone(17, 0.25);
  hb.Event("checkpoint", {{"ok", true}});
  bool got_step = false, got_event = false, got_beat = false;
  for (int i = 0; i < 200 && !(got_step && got_event && got_beat); ++i) {
    nlohmann::json m;
    if (!(*listener)->Receive(0.05, &m)) continue;
    EXPECT_EQ(m["rank"], 2);
    EXPECT_EQ(m["world"], 4);
    EXPECT_EQ(m["host"], "b");
    EXPECT_EQ(m["attempt"], 3);
    if (m["kind"] == "step") {
      got_step = true;
      EXPECT_EQ(m["step"], 17);
      EXPECT_DOUBLE_EQ(m["step_s"].get<double>(), 0.25);
    } else if (m["kind"] == "event") {
      got_event = m["event"] == "checkpoint" && m["ok"] == true;
    } else if (m["kind"] == "beat") {
      got_beat = m.contains("op_seq") && m.contains("in_op") && m["phase"] == "step";
    }
  }
  EXPECT_TRUE(got_step && got_event && got_beat);
  hb.Stop();
  unsetenv("MYRIAD_SUPERVISOR");
  unsetenv("MYRIAD_EMULATED_HOSTS");
  unsetenv("MYRIAD_ATTEMPT");
}

TEST(Heartbeat, HostComesFromTheEnvironment) {
  setenv("MYRIAD_EMULATED_HOSTS", "x,y,z", 1);
  EXPECT_EQ(ReportedHost(0), "x");
  EXPECT_EQ(ReportedHost(2), "z");
  setenv("MYRIAD_HOST", "override", 1);
  EXPECT_EQ(ReportedHost(1), "override");
  unsetenv("MYRIAD_HOST");
  unsetenv("MYRIAD_EMULATED_HOSTS");
  EXPECT_FALSE(ReportedHost(0).empty());  // gethostname
}

TEST(CommTrace, RecordsTheOpInProgressAndWaits) {
  const comm::OpTrace before = comm::CurrentTrace();
  {
    comm::TraceScope a("AllReduce", "mpi world 4");
    const comm::OpTrace t = comm::CurrentTrace();
    EXPECT_EQ(t.op, "AllReduce");
    EXPECT_EQ(t.comm, "mpi world 4");
    EXPECT_EQ(t.in_progress, before.in_progress + 1);
    EXPECT_EQ(t.seq, before.seq + 1);
    EXPECT_GE(t.seconds_in, 0.0);
  }
  EXPECT_EQ(comm::CurrentTrace().in_progress, before.in_progress);
  EXPECT_EQ(comm::CurrentTrace().seconds_in, 0.0);
  {
    comm::TraceScope w("Wait", "");  // a wait keeps the op it waits for
    EXPECT_EQ(comm::CurrentTrace().op, "Wait(AllReduce)");
    EXPECT_EQ(comm::CurrentTrace().comm, "mpi world 4");
  }
  {
    comm::TraceScope w("Wait", "");
    EXPECT_EQ(comm::CurrentTrace().op, "Wait(AllReduce)");  // not Wait(Wait(...))
  }
}

TEST(CommTrace, CountsThisThreadsBlockedTimeOnce) {
  const double b0 = comm::ThreadBlockedSeconds();
  {
    comm::TraceScope outer("AllReduce", "w");
    comm::TraceScope inner("Wait", "");  // nested: not counted twice
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  const double b1 = comm::ThreadBlockedSeconds();
  EXPECT_GE(b1 - b0, 0.029);
  EXPECT_LT(b1 - b0, 0.059);
  double other = -1;
  std::thread([&] { other = comm::ThreadBlockedSeconds(); }).join();
  EXPECT_EQ(other, 0.0);  // per thread
}

TEST(Hosts, ParseAndRejectWithReasons) {
  auto h = ParseHosts("node0:2,node1,node2:4");
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->size(), 3u);
  EXPECT_EQ((*h)[1].slots, 1);
  EXPECT_EQ((*h)[2].slots, 4);
  EXPECT_NE(ParseHosts("a:0").status().message().find("slots must be a number >= 1"), std::string::npos);
  EXPECT_NE(ParseHosts("a:1,a:2").status().message().find("listed twice"), std::string::npos);
  EXPECT_NE(ParseHosts(":2").status().message().find("no host name"), std::string::npos);
  EXPECT_FALSE(ParseHosts("").ok());
}

}  // namespace
}  // namespace myriad::supervise
