// Routing metrics against closed forms: curve end points, APGR of random
// routing, the oracle and the worst order, cloud calls cut, kNN on a
// hand-made set.
#include "edge/route_eval.h"

#include <gtest/gtest.h>

namespace myriad::edge {
namespace {

// n prompts with 0/1 qualities: the edge right on the first a, the remote on
// the first b >= a (nested), so the gap is a share g = (b - a) / n.
void Nested(int n, int a, int b, std::vector<double>* qe, std::vector<double>* qr) {
  for (int i = 0; i < n; ++i) qe->push_back(i < a), qr->push_back(i < b);
}

TEST(RouteEval, CurveEndPointsAreAllEdgeAndAllRemote) {
  const std::vector<double> qe = {0.2, 0.9, 0.4, 0.0}, qr = {0.8, 0.7, 0.4, 1.0};
  const auto c = QualityCurve({0.3, 0.1, 0.7, 0.5}, qe, qr);
  ASSERT_EQ(c.size(), 5u);
  EXPECT_DOUBLE_EQ(c.front().quality, (0.2 + 0.9 + 0.4 + 0.0) / 4);
  EXPECT_DOUBLE_EQ(c.back().quality, (0.8 + 0.7 + 0.4 + 1.0) / 4);
  EXPECT_DOUBLE_EQ(c.front().remote_share, 0);
  EXPECT_DOUBLE_EQ(c.back().remote_share, 1);
  // Order by score: prompt 2 (0.7) first, then 3 (0.5).
  EXPECT_DOUBLE_EQ(c[1].quality, (0.2 + 0.9 + 0.4 + 0.0) / 4);
  EXPECT_DOUBLE_EQ(c[2].quality, (0.2 + 0.9 + 0.4 + 1.0) / 4);
}

TEST(RouteEval, ApgrClosedForms) {
  std::vector<double> qe, qr;
  const int n = 20, a = 6, b = 14;  // g = 8 / 20
  Nested(n, a, b, &qe, &qr);
  const double g = double(b - a) / n;
  // Random: PGR(x) = x, area 1/2.
  EXPECT_NEAR(Apgr(RandomCurve(qe, qr)), 0.5, 1e-12);
  // Oracle: PGR rises linearly to 1 at x = g, then stays: 1 - g/2.
  EXPECT_NEAR(Apgr(QualityCurve(OracleScore(qe, qr), qe, qr)), 1 - g / 2, 1e-12);
  // Worst order (the gain prompts last): PGR 0 until 1 - g: g/2.
  std::vector<double> worst;
  for (double s : OracleScore(qe, qr)) worst.push_back(-s);
  EXPECT_NEAR(Apgr(QualityCurve(worst, qe, qr)), g / 2, 1e-12);
  // When every prompt needs the cloud (g = 1) the oracle is the random line: 1/2;
  // when the gap is one prompt in a thousand, nearly 1.
  qe.clear(), qr.clear();
  Nested(1000, 0, 1, &qe, &qr);
  EXPECT_NEAR(Apgr(QualityCurve(OracleScore(qe, qr), qe, qr)), 1 - 0.0005, 1e-12);
  // No gap: 0 by definition.
  EXPECT_EQ(Apgr(QualityCurve({1, 2}, {0.5, 0.5}, {0.5, 0.5})), 0);
}

TEST(RouteEval, CloudCallsCutAtEqualQuality) {
  std::vector<double> qe, qr;
  Nested(20, 6, 14, &qe, &qr);
  // The oracle reaches all-remote quality after the 8 gain prompts: 12/20 of calls cut.
  EXPECT_NEAR(CloudCallsCut(QualityCurve(OracleScore(qe, qr), qe, qr)), 0.6, 1e-12);
  // Random routing reaches it only at the end (within 0.005 of 0.7: share 0.99375 -> k = 20).
  EXPECT_NEAR(CloudCallsCut(RandomCurve(qe, qr)), 0.0, 1e-12);
  // The tolerance: with 0.05 (one prompt of 20) the oracle may stop one prompt short.
  EXPECT_NEAR(CloudCallsCut(QualityCurve(OracleScore(qe, qr), qe, qr), 0.05), 0.65, 1e-12);
}

TEST(RouteEval, KnnOnAHandMadeSet) {
  // Two clusters by direction: along x (label 0) and along y (label 1).
  const std::vector<std::vector<float>> train = {{1, 0.1f}, {2, 0}, {1, -0.1f}, {0.1f, 1}, {0, 3}, {-0.1f, 1}};
  const std::vector<int> labels = {0, 0, 0, 1, 1, 1};
  const auto s = KnnScores(train, labels, {{5, 0.2f}, {0.2f, 5}, {1, 1.05f}}, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_DOUBLE_EQ(s[0], 0.0);
  EXPECT_DOUBLE_EQ(s[1], 1.0);
  // On the diagonal, slightly towards y, by cosine: (0.1,1) 0.789, (1,0.1) 0.758,
  // (0,3) 0.724, then (2,0) 0.690: two of the three nearest are label 1.
  EXPECT_NEAR(s[2], 2.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(KnnScores(train, labels, {{1, 0}}, 1)[0], 0.0);
}

TEST(RouteEval, PercentileByNearestRank) {
  EXPECT_EQ(Percentile({5, 1, 4, 2, 3}, 50), 3);
  EXPECT_EQ(Percentile({5, 1, 4, 2, 3}, 99), 5);
  EXPECT_EQ(Percentile({}, 50), 0);
}

}  // namespace
}  // namespace myriad::edge
