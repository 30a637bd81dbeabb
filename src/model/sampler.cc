#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace myriad {

TokenDistribution SamplingDistribution(const float* logits, int64_t V, const SamplingParams& p) {
  TokenDistribution d;
  if (p.temperature <= 0.f) {
    d.ids = {static_cast<int32_t>(std::max_element(logits, logits + V) - logits)};
    d.prob = {1.0};
    return d;
  }
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = V;
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (p.top_k > 0 && p.top_k < V) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), before);
  } else {
    std::sort(idx.begin(), idx.end(), before);
  }
  std::vector<double> prob(keep);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += (prob[i] = std::exp((logits[idx[i]] - mx) / p.temperature));
  for (auto& q : prob) q /= sum;
  if (p.top_p < 1.f) {
    double cum = 0;
    int64_t n = 0;
    while (n < keep) {
      cum += prob[n++];
      if (cum >= p.top_p) break;
    }
    keep = std::max<int64_t>(1, n);
    sum = 0;
    for (int64_t i = 0; i < keep; ++i) sum += prob[i];
    for (int64_t i = 0; i < keep; ++i) prob[i] /= sum;
  }
  d.ids.assign(idx.begin(), idx.begin() + keep);
  d.prob.assign(prob.begin(), prob.begin() + keep);
  return d;
}

double TokenDistribution::ProbOf(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return prob[i];
  return 0.0;
}

int32_t TokenDistribution::Draw(double u) const {
  double cum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    cum += prob[i];
    if (u < cum) return ids[i];
  }
  return ids.back();
}

int32_t SampleToken(const float* logits, int64_t V, const SamplingParams& p, Rng* rng) {
  if (p.temperature <= 0.f) return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  return SamplingDistribution(logits, V, p).Draw(rng->Uniform());
}

}  // namespace myriad
