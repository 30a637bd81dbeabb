// The calibration's fits against samples made from known parameters.
#include "plan/calibrate.h"

#include <gtest/gtest.h>

namespace myriad::plan {
namespace {

TEST(PlanCalibrate, FitsRecoverKnownParameters) {
  // FitTwo: t = 3 x1 + 0.5 x2 exactly: both recovered, worst error 0.
  double err = 1;
  const auto [p1, p2] = FitTwo({1, 2, 3, 4}, {5, 1, 7, 2}, {5.5, 6.5, 12.5, 13}, &err);
  EXPECT_NEAR(p1, 3, 1e-9);
  EXPECT_NEAR(p2, 0.5, 1e-9);
  EXPECT_LT(err, 1e-9);
  // Collectives on 4 ranks from beta = 10 GB/s (send/recv), all-reduce at
  // half of it, all-to-all at 0.8, alpha = 2 us: the fits give them back.
  std::vector<CommSample> s;
  const double g = 4, beta = 10e9, alpha = 2e-6;
  for (double n : {4096.0, 65536.0, 1048576.0, 16777216.0}) {
    s.push_back({"sendrecv", n, n / beta + alpha});
    s.push_back({"allreduce", n, 2 * (g - 1) / g * n / (0.5 * beta) + 2 * (g - 1) * alpha});
    s.push_back({"allgather", n, (g - 1) / g * n / beta + (g - 1) * alpha});
    s.push_back({"alltoall", n, (g - 1) / g * n / (0.8 * beta) + (g - 1) * alpha});
  }
  Calibration cal;
  FitComm(s, 4, &cal);
  EXPECT_NEAR(cal.comm_bandwidth, beta, 1e-6 * beta);
  EXPECT_NEAR(cal.allreduce_eff, 0.5, 1e-6);
  EXPECT_NEAR(cal.allgather_eff, 1.0, 1e-6);
  EXPECT_NEAR(cal.alltoall_eff, 0.8, 1e-6);
  EXPECT_NEAR(cal.comm_latency, alpha, 1e-9);
  // The calibrated cluster reproduces a sample through the cost model.
  const ClusterDesc c = CalibratedCluster(cal, 4);
  GroupSpan span{{4}};
  EXPECT_NEAR(AllReduce(c, span, 16777216.0).seconds, 2 * 0.75 * 16777216.0 / 5e9 + 6 * alpha, 1e-9);
  EXPECT_NEAR(AllToAll(c, span, 1048576.0).seconds, 0.75 * 1048576.0 / 8e9 + 3 * alpha, 1e-9);
}

TEST(PlanCalibrate, ExpertParallelImbalanceByHand) {
  // Two MoE layers of 4 experts over ep=2: ranks hold experts {0,1} and {2,3}.
  // Layer 1: 30 vs 10 tokens -> 30 / 20 = 1.5; layer 2: 20 vs 20 -> 1.
  const std::vector<std::vector<double>> load{{10, 20, 5, 5}, {10, 10, 15, 5}};
  EXPECT_DOUBLE_EQ(EpImbalance(load, 2), (1.5 + 1.0) / 2);
  // ep=4: layer 1: 20 / 10 = 2; layer 2: 15 / 10 = 1.5.
  EXPECT_DOUBLE_EQ(EpImbalance(load, 4), (2.0 + 1.5) / 2);
  EXPECT_DOUBLE_EQ(EpImbalance(load, 1), 1.0);
  EXPECT_DOUBLE_EQ(EpImbalance({}, 2), 1.0);
}

}  // namespace
}  // namespace myriad::plan
