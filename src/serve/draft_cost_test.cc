// The draft-length plan against closed forms.
#include "serve/draft_cost.h"

#include <gtest/gtest.h>

#include <cmath>

namespace myriad::serve {
namespace {

TEST(DraftCost, ExpectedTokensIsTheGeometricSum) {
  EXPECT_DOUBLE_EQ(ExpectedTokens({0.5}, 0), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedTokens({0.5}, 3), 1 + 0.5 + 0.25 + 0.125);
  EXPECT_DOUBLE_EQ(ExpectedTokens({0.9, 0.5}, 3), 1 + 0.9 + 0.45 + 0.225);  // the last rate repeats
  EXPECT_DOUBLE_EQ(ExpectedTokens({1.0}, 4), 5.0);
}

TEST(DraftCost, SpeculatesWhenWeightBoundAndNotWhenComputeBound) {
  DraftPlanInputs in;
  in.alpha = {0.8};
  // Weight-bound: a step costs 10 ms whatever it carries (b ~ 0): the longest draft wins.
  in.a = 0.010, in.b = 1e-6;
  EXPECT_EQ(ChooseDraftLength(in, 1, 6), 6);
  // Compute-bound: every token costs the same, a draft only adds work.
  in.a = 1e-6, in.b = 0.001;
  EXPECT_EQ(ChooseDraftLength(in, 1, 6), 0);
  // Between: at batch 1 with a = 10 b, k = 1 gives 1.8 tokens for 12 b
  // against 1 token for 11 b: speculate; at batch 64 the a term is small:
  // (64 * 1.8) / (10 b + 128 b) < 64 / (10 b + 64 b): do not.
  in.a = 0.010, in.b = 0.001;
  double rate = 0;
  EXPECT_GE(ChooseDraftLength(in, 1, 1, &rate), 1);
  EXPECT_NEAR(rate, 1.8 / 0.012, 1e-9);
  EXPECT_EQ(ChooseDraftLength(in, 64, 4), 0);
  // Drafting cost counts: free drafts at alpha 0.8 win at batch 1, drafts
  // costing more than a whole step lose.
  in.a = 0.010, in.b = 1e-6, in.draft_seconds = 0.05;
  EXPECT_EQ(ChooseDraftLength(in, 1, 4), 0);
}

TEST(DraftCost, ModelFitsTheStepTimesAndTheAcceptance) {
  DraftCostModel m(0.5, 8);
  for (int i = 0; i < 50; ++i)
    for (int n : {1, 4, 16}) m.ObserveForward(n, 0.002 + 0.0005 * n);
  for (int i = 0; i < 400; ++i) m.ObserveVerification(i % 4 == 0 ? 1 : 3, i % 4 == 0 ? 0 : 2);  // 75%: 2 of 3
  const DraftPlanInputs in = m.inputs();
  EXPECT_NEAR(in.a, 0.002, 1e-6);
  EXPECT_NEAR(in.b, 0.0005, 1e-7);
  ASSERT_EQ(in.alpha.size(), 3u);
  EXPECT_NEAR(in.alpha[0], 0.75, 0.02);  // accepted at 0 in 3 of 4 verifications
  EXPECT_NEAR(in.alpha[1], 1.0, 0.03);   // given position 0 accepted, position 1 always was
  EXPECT_NEAR(in.alpha[2], 0.0, 0.03);   // and position 2 never
}

}  // namespace
}  // namespace myriad::serve
