// Token sampling from logits: greedy (temperature 0), or temperature with
// optional top-k and top-p (nucleus) truncation. Deterministic given the Rng.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace myriad {

struct SamplingParams {
  float temperature = 0.8f;  // 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
};

int32_t SampleToken(const float* logits, int64_t V, const SamplingParams& p, Rng* rng);

// The distribution SampleToken draws from: the kept ids, most likely first
// (ties: lower id first), and their probabilities (summing to 1). Greedy is
// the argmax with probability 1.
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<double> prob;
  double ProbOf(int32_t id) const;
  // An id drawn from the distribution with `u` uniform in [0, 1).
  int32_t Draw(double u) const;
};
TokenDistribution SamplingDistribution(const float* logits, int64_t V, const SamplingParams& p);

}  // namespace myriad
