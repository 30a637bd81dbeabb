// Speculative decoding with n-gram drafts: the drafter's matches by hand,
// ForwardAll and Truncate against token-by-token decoding, greedy output
// identical to plain greedy decoding, and the accept-or-resample rule
// drawing exactly the sampler's distribution.
#include "model/speculative.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace myriad {
namespace {

TEST(NgramDrafter, TheLongestMostRecentMatchIsContinued) {
  NgramDrafter d;  // n from 3 down to 1
  //                            0  1  2  3  4  5  6  7  8
  const std::vector<int32_t> c = {5, 6, 7, 8, 9, 6, 7, 1, 6, 7};
  // Last 3 = {1, 6, 7}: no earlier match; last 2 = {6, 7}: at 5 (then 1, 6, 7) and at 1 (then 8, 9, 6, 7, 1, 6, 7).
  EXPECT_EQ(d.Draft(c, 2), (std::vector<int32_t>{1, 6}));      // the most recent has 2 after it
  EXPECT_EQ(d.Draft(c, 3), (std::vector<int32_t>{1, 6, 7}));
  EXPECT_EQ(d.Draft(c, 10), (std::vector<int32_t>{8, 9, 6, 7, 1, 6, 7}));  // the one with the most after it
  EXPECT_EQ(d.Draft({1, 2, 3}, 4), (std::vector<int32_t>{}));   // nothing repeats
  EXPECT_EQ(d.Draft({4, 4}, 3), (std::vector<int32_t>{4}));
  EXPECT_TRUE(d.Draft(c, 0).empty());
}

ModelConfig Tiny(bool moe) {
  ModelConfig c;
  c.vocab_size = 61; c.d_model = 32; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48;
  c.n_dense_layers = moe ? 1 : 2; c.n_routed_experts = moe ? 4 : 0; c.top_k = 2; c.d_expert = 16;
  c.n_shared_experts = moe ? 1 : 0; c.max_seq_len = 96; c.init_std = 0.3;
  return c;
}

TEST(Speculative, ForwardAllAndTruncateMatchTokenByToken) {
  Model model(Tiny(true));
  model.InitWeights(5);
  const int64_t V = model.config().vocab_size;
  std::vector<int32_t> t = {3, 9, 14, 3, 9, 27, 1, 50};
  InferenceSession one(model, 64), all(model, 64);
  std::vector<float> want;
  for (int32_t x : t) {
    const float* lg = one.Forward(&x, 1);
    want.insert(want.end(), lg, lg + V);
  }
  all.Forward(t.data(), 3);
  const float* rows = all.ForwardAll(t.data() + 3, 5);
  for (int64_t i = 0; i < 5 * V; ++i) ASSERT_NEAR(rows[i], want[3 * V + i], 1e-4f) << i;
  // Roll back 3 positions and feed other tokens: as if they had come first.
  all.Truncate(5);
  const std::vector<int32_t> other = {7, 7, 2};
  const float* lg = all.ForwardAll(other.data(), 3);
  InferenceSession fresh(model, 64);
  fresh.Forward(t.data(), 5);
  const float* ref = fresh.ForwardAll(other.data(), 3);
  for (int64_t i = 0; i < 3 * V; ++i) ASSERT_NEAR(lg[i], ref[i], 1e-4f) << i;
  EXPECT_EQ(all.len(), 8);
}

// Plain greedy decoding of n tokens after `prompt`.
std::vector<int32_t> Greedy(const Model& m, const std::vector<int32_t>& prompt, int n) {
  InferenceSession s(m, 96);
  const float* lg = s.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
  SamplingParams g;
  g.temperature = 0;
  Rng rng(1);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = SampleToken(lg, m.config().vocab_size, g, &rng);
    out.push_back(t);
    lg = s.Forward(&t, 1);
  }
  return out;
}

TEST(Speculative, GreedyOutputIsIdenticalAndDraftsAreAccepted) {
  for (bool moe : {false, true}) {
    Model model(Tiny(moe));
    model.InitWeights(moe ? 8 : 9);
    std::vector<int32_t> prompt;
    for (int r = 0; r < 4; ++r)
      for (int32_t x : {11, 12, 13, 14, 15, 16}) prompt.push_back(x);  // repetitive: prompt lookup finds drafts
    const int N = 48;
    const std::vector<int32_t> want = Greedy(model, prompt, N);
    for (int k : {1, 3, 6}) {
      InferenceSession s(model, 96);
      const float* lg = s.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
      SamplingParams g;
      g.temperature = 0;
      Rng rng(1);
      std::vector<int32_t> context = prompt, out;
      std::vector<int32_t> emit = {SampleToken(lg, model.config().vocab_size, g, &rng)};
      SpeculativeStats st;
      while (static_cast<int>(out.size()) < N) {
        for (int32_t t : emit) out.push_back(t), context.push_back(t);
        emit = VerifyDraft(&s, context.back(), NgramDrafter{}.Draft(context, k), model.config().vocab_size, g,
                           &rng, &st);
      }
      out.resize(N);
      EXPECT_EQ(out, want) << "moe " << moe << " k " << k;
      EXPECT_GT(st.AcceptanceRate(), 0.0) << "moe " << moe << " k " << k;
      EXPECT_LT(st.steps, N) << "fewer forwards than tokens";
    }
  }
}

TEST(Speculative, AcceptOrResampleDrawsTheSamplersDistribution) {
  // A fixed distribution; every draft token in turn, including one outside it.
  const float logits[6] = {2.0f, 1.5f, 0.3f, -1.0f, 0.9f, -3.0f};
  SamplingParams sp;
  sp.temperature = 0.9f;
  sp.top_k = 5;
  const TokenDistribution p = SamplingDistribution(logits, 6, sp);
  ASSERT_EQ(p.ids.size(), 5u);
  const int kDraws = 200000;
  for (int32_t draft : {0, 1, 3, 5}) {
    Rng rng(100 + draft);
    std::vector<int> count(6, 0);
    int accepted = 0;
    for (int i = 0; i < kDraws; ++i) {
      bool ok = false;
      count[AcceptOrResample(p, draft, &rng, &ok)]++;
      accepted += ok;
    }
    for (int32_t id = 0; id < 6; ++id) {
      const double want = p.ProbOf(id), got = static_cast<double>(count[id]) / kDraws;
      const double sigma = std::sqrt(want * (1 - want) / kDraws) + 1e-12;
      EXPECT_LE(std::fabs(got - want), 5 * sigma + 1e-9) << "draft " << draft << " id " << id;
    }
    EXPECT_NEAR(static_cast<double>(accepted) / kDraws, p.ProbOf(draft), 0.005) << "draft " << draft;
  }
}

}  // namespace
}  // namespace myriad
