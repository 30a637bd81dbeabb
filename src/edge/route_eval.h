// Routing metrics over judged prompts: the quality-vs-remote-share curve of
// a scorer, APGR, cloud calls cut at equal quality, and the reference
// routers (random, kNN over the edge embeddings, the oracle). Pure
// functions of the judge's qualities; docs/edge.md ("Router") defines each.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad::edge {

struct CurvePoint {
  double remote_share = 0;  // k / n
  double quality = 0;       // mean quality with the k highest-scored prompts answered remotely
};

// Prompts sorted by score, highest first (ties kept in input order), the
// top k answered remotely, for k = 0..n: n + 1 points.
std::vector<CurvePoint> QualityCurve(const std::vector<double>& score, const std::vector<double>& q_edge,
                                     const std::vector<double>& q_remote);
// Random routing's expected curve: q_edge_mean + x (q_remote_mean - q_edge_mean) at x = k/n.
std::vector<CurvePoint> RandomCurve(const std::vector<double>& q_edge, const std::vector<double>& q_remote);
// The oracle's score: the judged gain q_remote - q_edge (the best order).
std::vector<double> OracleScore(const std::vector<double>& q_edge, const std::vector<double>& q_remote);

// APGR (RouteLLM): the area under PGR(x) = (Q(x) - Q_edge) / (Q_cloud - Q_edge)
// over x in [0, 1] (trapezoids over the curve's points), Q_edge and Q_cloud the
// curve's end points (all-edge, all-remote). Uncapped: an oracle that beats
// all-remote on a subset gets PGR > 1 there. 0 when Q_cloud == Q_edge.
// Closed forms: random routing 0.5; the oracle on 0/1 qualities where the
// remote answer is right whenever the edge one is and the gap is a share g
// of the prompts: 1 - g / 2.
double Apgr(const std::vector<CurvePoint>& curve);

// Cloud calls cut at equal quality: the largest edge share 1 - k/n over the
// curve's points whose quality >= Q_cloud - tolerance (tolerance 0.005: half
// a point of quality on the [0, 1] scale), Q_cloud the all-remote point.
double CloudCallsCut(const std::vector<CurvePoint>& curve, double tolerance = 0.005);

// kNN over embeddings (cosine similarity): for each query the mean label of
// the k most similar train rows (ties by index).
std::vector<double> KnnScores(const std::vector<std::vector<float>>& train, const std::vector<int>& train_labels,
                              const std::vector<std::vector<float>>& query, int k);

// Percentile (0..100) by nearest rank on a copy; 0 for an empty set.
double Percentile(std::vector<double> v, double pct);

}  // namespace myriad::edge
