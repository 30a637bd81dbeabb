#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace myriad {
namespace {

// The order of ids by likelihood: higher logit first, ties lower id first.
struct MoreLikely {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); }
};

}  // namespace

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
  const MoreLikely before{logits};
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

TokenLogprobs LogprobsOf(const float* logits, int64_t V, int32_t token, int top_n) {
  double mx = logits[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max<double>(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double log_z = mx + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(static_cast<double>(logits[token]) - log_z);
  const int64_t n = std::min<int64_t>(std::max(top_n, 0), V);
  if (n > 0) {
    std::vector<int32_t> idx(V);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), MoreLikely{logits});
    for (int64_t i = 0; i < n; ++i)
      out.top.emplace_back(idx[i], static_cast<float>(static_cast<double>(logits[idx[i]]) - log_z));
  }
  return out;
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
