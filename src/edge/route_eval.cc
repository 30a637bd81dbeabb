#include "edge/route_eval.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace myriad::edge {

std::vector<CurvePoint> QualityCurve(const std::vector<double>& score, const std::vector<double>& q_edge,
                                     const std::vector<double>& q_remote) {
  const size_t n = score.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] > score[b]; });
  double sum = std::accumulate(q_edge.begin(), q_edge.end(), 0.0);
  const double dn = n ? static_cast<double>(n) : 1.0;
  std::vector<CurvePoint> curve{{0.0, sum / dn}};
  for (size_t k = 0; k < n; ++k) {
    sum += q_remote[order[k]] - q_edge[order[k]];
    curve.push_back({(k + 1) / dn, sum / dn});
  }
  return curve;
}

std::vector<CurvePoint> RandomCurve(const std::vector<double>& q_edge, const std::vector<double>& q_remote) {
  const size_t n = q_edge.size();
  const double dn = n ? static_cast<double>(n) : 1.0;
  const double e = std::accumulate(q_edge.begin(), q_edge.end(), 0.0) / dn;
  const double r = std::accumulate(q_remote.begin(), q_remote.end(), 0.0) / dn;
  std::vector<CurvePoint> curve;
  for (size_t k = 0; k <= n; ++k) curve.push_back({k / dn, e + (k / dn) * (r - e)});
  return curve;
}

std::vector<double> OracleScore(const std::vector<double>& q_edge, const std::vector<double>& q_remote) {
  std::vector<double> s(q_edge.size());
  for (size_t i = 0; i < s.size(); ++i) s[i] = q_remote[i] - q_edge[i];
  return s;
}

double Apgr(const std::vector<CurvePoint>& curve) {
  if (curve.size() < 2) return 0;
  const double qe = curve.front().quality, qc = curve.back().quality;
  if (qc == qe) return 0;
  double area = 0;
  for (size_t i = 1; i < curve.size(); ++i) {
    const double a = (curve[i - 1].quality - qe) / (qc - qe), b = (curve[i].quality - qe) / (qc - qe);
    area += 0.5 * (a + b) * (curve[i].remote_share - curve[i - 1].remote_share);
  }
  return area;
}

double CloudCallsCut(const std::vector<CurvePoint>& curve, double tolerance) {
  if (curve.empty()) return 0;
  const double target = curve.back().quality - tolerance;
  double best = 0;
  for (const CurvePoint& p : curve)
    if (p.quality >= target - 1e-12) best = std::max(best, 1.0 - p.remote_share);
  return best;
}

std::vector<double> KnnScores(const std::vector<std::vector<float>>& train, const std::vector<int>& train_labels,
                              const std::vector<std::vector<float>>& query, int k) {
  auto norm = [](const std::vector<float>& v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s);
  };
  std::vector<double> tn(train.size());
  for (size_t i = 0; i < train.size(); ++i) tn[i] = norm(train[i]);
  std::vector<double> out;
  const size_t kk = std::min<size_t>(std::max(1, k), train.size());
  for (const auto& q : query) {
    const double qn = norm(q);
    std::vector<std::pair<double, size_t>> sim;
    for (size_t i = 0; i < train.size(); ++i) {
      double dot = 0;
      for (size_t c = 0; c < q.size() && c < train[i].size(); ++c) dot += static_cast<double>(q[c]) * train[i][c];
      const double d = qn > 0 && tn[i] > 0 ? dot / (qn * tn[i]) : 0;
      sim.push_back({-d, i});
    }
    if (kk == 0) {
      out.push_back(0.5);
      continue;
    }
    std::partial_sort(sim.begin(), sim.begin() + kk, sim.end());
    double s = 0;
    for (size_t j = 0; j < kk; ++j) s += train_labels[sim[j].second];
    out.push_back(s / kk);
  }
  return out;
}

double Percentile(std::vector<double> v, double pct) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(pct / 100.0 * v.size()));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

}  // namespace myriad::edge
