// LogprobsOf against a scalar log_softmax written here in long double, and
// the agreement of its order with greedy sampling.
#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/rng.h"

namespace myriad {
namespace {

// log_softmax(x)_i = x_i - log(sum_j exp(x_j)), summed naively (no max shift)
// in long double: a different formula from the one under test.
std::vector<long double> RefLogSoftmax(const std::vector<float>& x) {
  long double z = 0;
  for (float v : x) z += std::exp(static_cast<long double>(v));
  std::vector<long double> out;
  for (float v : x) out.push_back(static_cast<long double>(v) - std::log(z));
  return out;
}

TEST(Logprobs, EqualAnIndependentLogSoftmax) {
  Rng rng(7);
  for (int64_t V : {1, 2, 5, 512, 4099}) {
    std::vector<float> logits(V);
    for (auto& l : logits) l = static_cast<float>((rng.Uniform() - 0.5) * 16.0);
    if (V > 3) logits[3] = logits[1];  // a tie: the lower id comes first
    const std::vector<long double> ref = RefLogSoftmax(logits);
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int32_t token : {0, static_cast<int32_t>(V - 1), static_cast<int32_t>(V / 2)}) {
      const int top_n = static_cast<int>(std::min<int64_t>(V, 20));
      const TokenLogprobs lp = LogprobsOf(logits.data(), V, token, top_n);
      EXPECT_EQ(lp.token, token);
      EXPECT_NEAR(lp.logprob, static_cast<double>(ref[token]), 1e-5) << "V=" << V;
      ASSERT_EQ(static_cast<int>(lp.top.size()), top_n);
      for (int i = 0; i < top_n; ++i) {
        EXPECT_EQ(lp.top[i].first, order[i]) << "V=" << V << " rank " << i;
        EXPECT_NEAR(lp.top[i].second, static_cast<double>(ref[order[i]]), 1e-5);
      }
    }
    // The greedy token is the first of the top list, and its log-probability the largest.
    SamplingParams greedy{0.f, 0, 1.f};
    const int32_t g = SampleToken(logits.data(), V, greedy, nullptr);
    const TokenLogprobs lg = LogprobsOf(logits.data(), V, g, 3);
    EXPECT_EQ(lg.top[0].first, g);
    EXPECT_EQ(lg.logprob, lg.top[0].second);
  }
}

TEST(Logprobs, IgnoreTemperatureAndTruncation) {
  // The reported distribution is the model's, whatever the sampler did:
  // probabilities sum to 1 over the whole vocabulary.
  std::vector<float> logits = {2.f, 1.f, 0.5f, -1.f, 3.f};
  double sum = 0;
  for (int32_t t = 0; t < 5; ++t) sum += std::exp(static_cast<double>(LogprobsOf(logits.data(), 5, t, 0).logprob));
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_TRUE(LogprobsOf(logits.data(), 5, 0, 0).top.empty());
  EXPECT_EQ(LogprobsOf(logits.data(), 5, 0, 99).top.size(), 5u);  // capped at the vocabulary
}

}  // namespace
}  // namespace myriad
