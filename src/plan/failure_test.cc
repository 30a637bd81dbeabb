// Tests for the failure simulator: each simulated quantity is checked against
// an oracle derived here independently (exact checkpoint arithmetic, the
// expected time of a restartable stretch under Poisson failures, Young/Daly),
// plus recovery-policy orderings, determinism and config parsing.
#include "plan/failure.h"

#include <cmath>
#include <gtest/gtest.h>

namespace myriad::plan {
namespace {

constexpr double kHour = 3600;

// A job of `devices` with one crash-like component whose job-level MTBF is
// `mtbf_hours` (no detection, no repair), no blocking, restart or load.
FailureSpec OneComponent(double mtbf_hours, int64_t devices = 1000) {
  FailureSpec s;
  s.devices = devices;
  s.devices_per_node = 8;
  s.components = {{"x", 1.0 / (mtbf_hours * static_cast<double>(devices)), false, 0, 0}};
  s.ckpt_blocking_seconds = 0;
  s.restart_seconds = 0;
  s.load_seconds = 0;
  return s;
}

// Mean of an exponential(lam) draw given it is below x.
double TruncMean(double lam, double x) {
  const double p = std::exp(-lam * x);
  return 1 / lam - x * p / (1 - p);
}

// Oracle, by counting attempts: getting through `a` exposed seconds that a
// failure sends back to the start. Failed attempts are geometric with mean
// e^{lam a} - 1, each lasting TruncMean(lam, a), then down time d and a
// recovery of r exposed seconds, whose own failed attempts (mean
// e^{lam r} - 1) each cost TruncMean(lam, r) + d.
double Stretch(double lam, double a, double d, double r) {
  const double recovery = r > 0 ? r + std::expm1(lam * r) * (TruncMean(lam, r) + d) : 0;
  return a + std::expm1(lam * a) * (TruncMean(lam, a) + d + recovery);
}

// Oracle for the whole job: count its checkpoint segments by hand.
double OracleWall(const FailureSpec& s, double lam, double d) {
  const double work = s.work_hours * kHour, tau = s.ckpt_interval_seconds;
  int64_t ckpts = 0;
  if (tau > 0)
    while (static_cast<double>(ckpts + 1) * tau < work) ++ckpts;
  if (ckpts == 0) return Stretch(lam, work, d, s.restart_seconds);
  const double seg = tau + s.ckpt_blocking_seconds, r1 = s.restart_seconds + s.load_seconds;
  return Stretch(lam, seg, d, s.restart_seconds) +
         static_cast<double>(ckpts - 1) * Stretch(lam, seg, d, r1) +
         Stretch(lam, work - static_cast<double>(ckpts) * tau, d, r1);
}

void ExpectAccountsForWall(const FailureSpec& s, const FailureResult& r) {
  const double parts = s.work_hours + r.lost_work_hours + r.checkpoint_hours + r.restart_hours +
                       r.detect_hours + r.response_hours + r.repair_wait_hours;
  EXPECT_NEAR(parts, r.wall_hours, 1e-9 * r.wall_hours);
}

TEST(FailureSimTest, ZeroRateCostsExactlyTheCheckpointStalls) {
  FailureSpec s = OneComponent(1);
  s.components[0].rate_per_hour = 0;
  s.work_hours = 10;
  s.ckpt_blocking_seconds = 10;
  s.trials = 3;
  for (double tau : {420.0, 1800.0, 0.0, 50000.0}) {  // partial last, exact fit, never, > job
    s.ckpt_interval_seconds = tau;
    int64_t ckpts = 0;  // checkpoints are taken after tau, 2 tau, ... while work remains
    if (tau > 0)
      while (static_cast<double>(ckpts + 1) * tau < 36000) ++ckpts;
    FailureResult r = SimulateFailures(s);
    EXPECT_DOUBLE_EQ(r.ettr, 36000 / (36000 + 10.0 * static_cast<double>(ckpts))) << tau;
    EXPECT_EQ(r.failures, 0);
    EXPECT_EQ(r.wall_hours_stderr, 0);
    EXPECT_DOUBLE_EQ(r.wall_hours_p90, r.wall_hours);
    EXPECT_DOUBLE_EQ(r.checkpoint_hours, 10.0 * static_cast<double>(ckpts) / kHour);
    EXPECT_DOUBLE_EQ(AnalyticEttr(s), r.ettr);
  }
}

TEST(FailureSimTest, MeanWallMatchesClosedFormForOneExponentialComponent) {
  FailureSpec s = OneComponent(2.0);
  s.work_hours = 100.2;  // 200 full segments and a partial one
  s.ckpt_interval_seconds = 1800;
  s.ckpt_blocking_seconds = 60;
  s.restart_seconds = 1200;  // long enough that failures during recovery matter
  s.load_seconds = 600;
  s.trials = 400;
  const double lam = 1 / (2.0 * kHour);
  const double oracle = OracleWall(s, lam, 0);
  FailureResult r = SimulateFailures(s);
  EXPECT_GT(r.failures, 40);
  EXPECT_NEAR(r.wall_hours, oracle / kHour, 4 * r.wall_hours_stderr);
  EXPECT_LT(r.wall_hours_stderr, 0.005 * r.wall_hours);  // the check has teeth
  EXPECT_NEAR(AnalyticWallSeconds(s), oracle, 1e-9 * oracle);
  ExpectAccountsForWall(s, r);
}

TEST(FailureSimTest, DownTimeMixtureWithoutSparesMatchesClosedForm) {
  // Two components with different detection and repair, no spare nodes: each
  // failure waits for its own repair, so D is the rate-weighted mean.
  FailureSpec s = OneComponent(3.0);
  s.components = {{"a", 1.0 / (4.0 * 1000), false, 30, 1800},
                  {"b", 1.0 / (12.0 * 125), true, 600, 0}};  // per node: 125 nodes
  s.spare_nodes = 0;
  s.work_hours = 60;
  s.ckpt_interval_seconds = 900;
  s.ckpt_blocking_seconds = 20;
  s.restart_seconds = 200;
  s.load_seconds = 100;
  s.trials = 400;
  const double la = 1 / (4.0 * kHour), lb = 1 / (12.0 * kHour), lam = la + lb;
  EXPECT_NEAR(JobFailureRate(s), lam, 1e-15);
  const double d = (la * (30 + 1800) + lb * 600) / lam;
  const double oracle = OracleWall(s, lam, d);
  FailureResult r = SimulateFailures(s);
  EXPECT_NEAR(r.wall_hours, oracle / kHour, 4 * r.wall_hours_stderr);
  EXPECT_NEAR(AnalyticWallSeconds(s), oracle, 1e-9 * oracle);
  // Failures split by rate (binomial), and each "a" waits its full repair.
  const double pa = la / lam, n = r.failures * static_cast<double>(s.trials);
  EXPECT_NEAR(r.failures_by_component[0] / r.failures, pa, 5 * std::sqrt(pa * (1 - pa) / n));
  EXPECT_NEAR(r.repair_wait_hours, r.failures_by_component[0] * 0.5, 1e-9);
  EXPECT_DOUBLE_EQ(r.spare_shortages, r.failures_by_component[0]);
  ExpectAccountsForWall(s, r);
}

TEST(FailureSimTest, BestIntervalIsNearYoungDalyWhenCheckpointsAreCheap) {
  FailureSpec s = OneComponent(5.0);
  s.work_hours = 1000;
  s.ckpt_blocking_seconds = 30;  // C / MTBF = 1/600
  s.restart_seconds = 600;
  s.load_seconds = 300;
  s.trials = 100;
  const double yd = YoungDalyInterval(30, 5 * kHour);
  EXPECT_NEAR(yd, std::sqrt(2 * 30 * 18000.0), 1e-9);
  IntervalSweep sw = BestCheckpointInterval(s);
  EXPECT_DOUBLE_EQ(sw.young_daly_s, yd);
  ASSERT_EQ(sw.curve.size(), 25u);
  EXPECT_NEAR(sw.curve.front().first, yd / 8, 1e-6);
  EXPECT_NEAR(sw.curve.back().first, yd * 8, 1e-6);
  EXPECT_NEAR(sw.best_interval_s / yd, 1.0, 0.3) << sw.best_interval_s << " vs " << yd;
  for (const auto& [iv, ettr] : sw.curve) EXPECT_LE(ettr, sw.best_ettr + 1e-12) << iv;
  // The edges of the sweep are clearly worse than the middle.
  EXPECT_LT(sw.curve.front().second, sw.best_ettr - 0.02);
  EXPECT_LT(sw.curve.back().second, sw.best_ettr - 0.02);
  EXPECT_NEAR(DalyInterval(30, 5 * kHour) / yd, 1.0, 0.02);
}

TEST(FailureSimTest, NoCheckpointsOnABigClusterCollapses) {
  FailureSpec s = OneComponent(5.0, 10000);
  s.work_hours = 20;  // lambda W = 4
  s.ckpt_interval_seconds = 0;
  s.trials = 400;
  const double lam = 1 / (5.0 * kHour), w = 20 * kHour;
  const double closed = std::expm1(lam * w) / lam;  // restart from the beginning each time
  FailureResult r = SimulateFailures(s);
  EXPECT_NEAR(r.wall_hours, closed / kHour, 4 * r.wall_hours_stderr);
  EXPECT_LT(r.ettr, 0.1);
  EXPECT_EQ(r.checkpoint_hours, 0);
  s.ckpt_interval_seconds = 1800;  // the same job with checkpoints
  EXPECT_GT(SimulateFailures(s).ettr, 0.9);

  // The default cluster and job without checkpoints: hopeless; runs stop at
  // the cap and say so.
  FailureSpec d;
  d.ckpt_interval_seconds = 0;
  d.trials = 2;
  d.max_failures_per_trial = 1000;
  EXPECT_LT(AnalyticEttr(d), 1e-12);
  FailureResult rd = SimulateFailures(d);
  EXPECT_EQ(rd.truncated_trials, 2);
  EXPECT_EQ(rd.failures, 1000);
}

TEST(FailureSimTest, AutoRecoveryBeatsManualResponse) {
  FailureSpec s;
  s.work_hours = 300;
  s.trials = 100;
  FailureResult automatic = SimulateFailures(s);
  s.auto_recovery = false;
  FailureResult manual = SimulateFailures(s);
  const double se = std::hypot(automatic.ettr_stderr, manual.ettr_stderr);
  EXPECT_GT(automatic.ettr, manual.ettr + 5 * se);
  EXPECT_EQ(automatic.response_hours, 0);
  EXPECT_NEAR(manual.response_hours, manual.failures * 1.0, 1e-9);  // 60 min each
  ExpectAccountsForWall(s, manual);
}

TEST(FailureSimTest, NoSpareNodesWithLongRepairsLowersEttr) {
  FailureSpec s;  // defaults: 16 spares, device repairs take 48 h
  s.work_hours = 300;
  s.trials = 100;
  FailureResult spares = SimulateFailures(s);
  EXPECT_LT(spares.spare_shortages, 0.01);  // 16 spares cover ~6 nodes in repair
  s.spare_nodes = 0;
  FailureResult none = SimulateFailures(s);
  EXPECT_LT(none.ettr, spares.ettr - 0.3);
  EXPECT_GT(none.repair_wait_hours, 10 * spares.repair_wait_hours + 1);
  // Without spares the closed form is exact: check the simulator against it.
  EXPECT_NEAR(none.wall_hours, AnalyticWallSeconds(s) / kHour, 4 * none.wall_hours_stderr);
  ExpectAccountsForWall(s, none);
  // With ample spares the closed form (repair wait 0) is a close approximation.
  s.spare_nodes = 16;
  EXPECT_NEAR(spares.ettr, AnalyticEttr(s), 0.01);
}

TEST(FailureSimTest, SameSeedSameResultDifferentSeedDifferent) {
  FailureSpec s;
  s.work_hours = 200;
  s.trials = 20;
  FailureResult a = SimulateFailures(s), b = SimulateFailures(s);
  EXPECT_EQ(a.wall_hours, b.wall_hours);
  EXPECT_EQ(a.failures, b.failures);
  EXPECT_EQ(a.lost_work_hours, b.lost_work_hours);
  EXPECT_EQ(a.wall_hours_p90, b.wall_hours_p90);
  s.seed = 2;
  FailureResult c = SimulateFailures(s);
  EXPECT_NE(a.wall_hours, c.wall_hours);
  EXPECT_NE(a.lost_work_hours, c.lost_work_hours);
}

TEST(FailureSpecTest, DefaultsWhenTheSectionIsEmpty) {
  auto doc = ConfigDoc::Parse("", "t.toml");
  ASSERT_TRUE(doc.ok());
  auto spec = ParseFailureSpec(**doc, "failures");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const FailureSpec def;
  EXPECT_EQ(spec->devices, 10000);
  EXPECT_EQ(spec->devices_per_node, 8);
  EXPECT_EQ(spec->ckpt_interval_seconds, 1800);
  EXPECT_EQ(spec->spare_nodes, def.spare_nodes);
  ASSERT_EQ(spec->components.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(spec->components[i].rate_per_hour, def.components[i].rate_per_hour, 1e-18);
    EXPECT_EQ(spec->components[i].repair_seconds, def.components[i].repair_seconds);
  }
  // Llama 3 405B: 419 interruptions in 54 days on 16,384 GPUs.
  FailureSpec llama = def;
  llama.devices = 16384;
  EXPECT_NEAR(JobFailureRate(llama) * 54 * 24 * kHour, 419, 10);
  EXPECT_TRUE((*doc)->Finish().ok());
}

TEST(FailureSpecTest, ReadsOverridesInFriendlyUnits) {
  auto doc = ConfigDoc::Parse(R"(
[failures]
devices = 4096
devices_per_node = 4
work_hours = 500
ckpt_interval_minutes = 20
ckpt_blocking_seconds = 5
restart_seconds = 420
load_seconds = 90
auto_recovery = false
manual_response_minutes = 30
spare_nodes = 0
trials = 50
seed = 7
[failures.device]
rate_per_1000_device_days = 2.4
detect_seconds = 15
repair_hours = 2
[failures.host]
rate_per_1000_node_days = 1
[failures.software]
per_node = true
rate_per_1000_node_days = 0.5
)", "t.toml");
  ASSERT_TRUE(doc.ok()) << doc.status().message();
  auto s = ParseFailureSpec(**doc, "failures");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE((*doc)->Finish().ok());
  EXPECT_EQ(s->devices, 4096);
  EXPECT_EQ(s->nodes(), 1024);
  EXPECT_DOUBLE_EQ(s->work_hours, 500);
  EXPECT_DOUBLE_EQ(s->ckpt_interval_seconds, 1200);
  EXPECT_DOUBLE_EQ(s->ckpt_blocking_seconds, 5);
  EXPECT_DOUBLE_EQ(s->restart_seconds, 420);
  EXPECT_DOUBLE_EQ(s->load_seconds, 90);
  EXPECT_FALSE(s->auto_recovery);
  EXPECT_DOUBLE_EQ(s->manual_response_seconds, 1800);
  EXPECT_EQ(s->spare_nodes, 0);
  EXPECT_EQ(s->trials, 50);
  EXPECT_EQ(s->seed, 7u);
  EXPECT_DOUBLE_EQ(s->components[0].rate_per_hour, 2.4 / 24000);
  EXPECT_DOUBLE_EQ(s->components[0].detect_seconds, 15);
  EXPECT_DOUBLE_EQ(s->components[0].repair_seconds, 7200);
  EXPECT_DOUBLE_EQ(s->components[1].rate_per_hour, 1.0 / 24000);
  EXPECT_TRUE(s->components[3].per_node);
  EXPECT_DOUBLE_EQ(s->components[3].rate_per_hour, 0.5 / 24000);
  // 4096 devices x 2.4 + 1024 nodes x 1 + network default + 1024 x 0.5 per 1000 days.
  const double per_day = (4096 * 2.4 + 1024 * 1.0 + 4096 * 0.055 + 1024 * 0.5) / 1000;
  EXPECT_NEAR(JobFailureRate(*s) * 24 * kHour, per_day, 1e-9);
}

TEST(FailureSpecTest, EachInvalidValueNamesItsKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"failures.devices=10001", "failures.devices="},
      {"failures.devices=0", "failures.devices="},
      {"failures.devices_per_node=0", "failures.devices_per_node="},
      {"failures.work_hours=0", "failures.work_hours="},
      {"failures.ckpt_interval_minutes=0.1", "failures.ckpt_interval_minutes="},  // 6 s < 10 s
      {"failures.ckpt_interval_minutes=-1", "failures.ckpt_interval_minutes="},
      {"failures.ckpt_blocking_seconds=-1", "failures.ckpt_blocking_seconds="},
      {"failures.restart_seconds=-5", "failures.restart_seconds="},
      {"failures.load_seconds=-1", "failures.load_seconds="},
      {"failures.manual_response_minutes=-1", "failures.manual_response_minutes="},
      {"failures.spare_nodes=-1", "failures.spare_nodes="},
      {"failures.trials=0", "failures.trials="},
      {"failures.max_failures_per_trial=0", "failures.max_failures_per_trial="},
      {"failures.device.rate_per_1000_device_days=-0.1", "failures.device.rate_per_1000_device_days="},
      {"failures.network.detect_seconds=-1", "failures.network.detect_seconds="},
      {"failures.host.repair_hours=-2", "failures.host.repair_hours="},
      {"failures.host.rate_per_1000_device_days=1", "failures.host.rate_per_1000_node_days"},
      {"failures.device.rate_per_1000_node_days=1", "failures.device.rate_per_1000_device_days"},
  };
  for (const auto& [set, key] : cases) {
    auto doc = ConfigDoc::Parse("", "t.toml", {set});
    ASSERT_TRUE(doc.ok()) << set;
    auto s = ParseFailureSpec(**doc, "failures");
    ASSERT_FALSE(s.ok()) << set;
    const std::string m = s.status().message();
    EXPECT_NE(m.find(key), std::string::npos) << set << " -> " << m;
    EXPECT_NE(m.find("hint:"), std::string::npos) << m;
    EXPECT_EQ(m.rfind("t.toml: ", 0), 0u) << m;
  }
  // A non-finite number is the document's to report (ConfigDoc::GetFloat), as for every section.
  auto nan = ConfigDoc::Parse("", "t.toml", {"failures.host.rate_per_1000_node_days=nan"});
  ASSERT_TRUE(nan.ok());
  EXPECT_TRUE(ParseFailureSpec(**nan, "failures").ok());
  EXPECT_NE((*nan)->Finish().message().find("failures.host.rate_per_1000_node_days=nan must be a finite number"),
            std::string::npos);
  // Wrong types are the document's to report, as for every section.
  auto doc = ConfigDoc::Parse("", "t.toml", {"failures.trials=\"many\""});
  ASSERT_TRUE(doc.ok());
  EXPECT_TRUE(ParseFailureSpec(**doc, "failures").ok());
  Status st = (*doc)->Finish();
  EXPECT_NE(st.message().find("failures.trials must be an integer"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace myriad::plan
