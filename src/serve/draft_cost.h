// How many draft tokens a decode step should verify, from measurements.
//
// A step's forward over n new tokens takes t(n) = a + b n (fitted to the
// measured decode steps: weights read once, a; per-token work, b). With
// acceptance rates alpha_i for draft position i (measured, with a prior), a
// draft of k tokens makes E(k) = 1 + sum_{i=1..k} prod_{m<=i} alpha_m tokens
// per sequence per step. For B decoding sequences the step emits B E(k)
// tokens in t(B (k+1)) + B k d seconds (d: drafting seconds per draft token,
// the MTP modules' forwards; 0 for n-gram drafts). The plan is the k in
// [0, max_k] with the highest tokens per second; 0 means no speculation at
// this batch size: verifying costs more than it saves.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace myriad::serve {

struct DraftPlanInputs {
  double a = 0, b = 0;          // t(n) = a + b n seconds
  std::vector<double> alpha;    // acceptance rate per draft position (the last one repeats)
  double draft_seconds = 0;     // per draft token per sequence
};

// Expected tokens per sequence per step with a draft of k tokens.
double ExpectedTokens(const std::vector<double>& alpha, int k);
// The best k in [0, max_k] for `batch` sequences, and its tokens/s (out).
int ChooseDraftLength(const DraftPlanInputs& in, int batch, int max_k, double* tokens_per_second = nullptr);

// Thread-safe: the scheduler feeds it and plans with it; /metrics reads it.
class DraftCostModel {
 public:
  // prior_alpha: acceptance assumed before measurements (worth
  // `prior_weight` proposals per position).
  explicit DraftCostModel(double prior_alpha = 0.6, double prior_weight = 8);
  // A decode step's forward: `tokens` new tokens in `seconds`.
  void ObserveForward(int64_t tokens, double seconds);
  // One verification's outcome: proposed[i] / accepted[i] per position.
  void ObserveVerification(int proposed, int accepted);
  void ObserveDraftSeconds(int64_t draft_tokens, double seconds);
  int Choose(int batch, int max_k) const;
  DraftPlanInputs inputs() const;

 private:
  mutable std::mutex mu_;
  double prior_alpha_, prior_weight_;
  // Decayed least-squares sums of (n, t).
  double sw_ = 0, sn_ = 0, snn_ = 0, st_ = 0, snt_ = 0;
  std::vector<double> prop_, acc_;  // decayed counts per position
  double draft_tok_ = 0, draft_sec_ = 0;
};

}  // namespace myriad::serve
