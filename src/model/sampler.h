// Token sampling from logits: greedy (temperature 0), or temperature with
// optional top-k and top-p (nucleus) truncation. Deterministic given the Rng.
#pragma once

#include <cstdint>
#include <utility>
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

// Log-probabilities under the model's own distribution, log_softmax(logits)
// in double precision -- before temperature, top-k and top-p, as OpenAI and
// vLLM report them: of `token` (whichever way it was chosen), and of the
// top_n most likely ids, most likely first (ties: lower id first, as
// SamplingDistribution and greedy order them).
struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob)
};
TokenLogprobs LogprobsOf(const float* logits, int64_t V, int32_t token, int top_n);

}  // namespace myriad
