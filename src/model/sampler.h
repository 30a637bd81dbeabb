// Token sampling from logits: greedy (temperature 0), or temperature with
// optional top-k and top-p (nucleus) truncation. Deterministic given the Rng.
#pragma once

#include <cstdint>

#include "core/rng.h"

namespace myriad {

struct SamplingParams {
  float temperature = 0.8f;  // 0: greedy
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no limit
};

int32_t SampleToken(const float* logits, int64_t V, const SamplingParams& p, Rng* rng);

}  // namespace myriad
