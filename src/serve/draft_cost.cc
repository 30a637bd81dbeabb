#include "serve/draft_cost.h"

#include <algorithm>
#include <cmath>

namespace myriad::serve {

double ExpectedTokens(const std::vector<double>& alpha, int k) {
  double e = 1, run = 1;
  for (int i = 0; i < k; ++i) {
    const double a = alpha.empty() ? 0.0 : alpha[std::min<size_t>(i, alpha.size() - 1)];
    run *= std::clamp(a, 0.0, 1.0);
    e += run;
  }
  return e;
}

int ChooseDraftLength(const DraftPlanInputs& in, int batch, int max_k, double* tokens_per_second) {
  int best = 0;
  double best_rate = -1;
  for (int k = 0; k <= std::max(0, max_k); ++k) {
    const double secs = in.a + in.b * batch * (k + 1) + batch * k * in.draft_seconds;
    const double rate = batch * ExpectedTokens(in.alpha, k) / std::max(secs, 1e-12);
    if (rate > best_rate * (1 + 1e-9)) best = k, best_rate = rate;  // ties: the shorter draft
  }
  if (tokens_per_second) *tokens_per_second = best_rate;
  return best;
}

DraftCostModel::DraftCostModel(double prior_alpha, double prior_weight)
    : prior_alpha_(prior_alpha), prior_weight_(prior_weight) {}

void DraftCostModel::ObserveForward(int64_t tokens, double seconds) {
  constexpr double kDecay = 0.995;  // ~200 steps of memory
  std::lock_guard<std::mutex> lock(mu_);
  sw_ = sw_ * kDecay + 1;
  sn_ = sn_ * kDecay + tokens;
  snn_ = snn_ * kDecay + static_cast<double>(tokens) * tokens;
  st_ = st_ * kDecay + seconds;
  snt_ = snt_ * kDecay + tokens * seconds;
}

void DraftCostModel::ObserveVerification(int proposed, int accepted) {
  constexpr double kDecay = 0.999;
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(prop_.size()) < proposed) prop_.resize(proposed, 0.0), acc_.resize(proposed, 0.0);
  for (size_t i = 0; i < prop_.size(); ++i) prop_[i] *= kDecay, acc_[i] *= kDecay;
  for (int i = 0; i < proposed; ++i) {
    prop_[i] += 1;
    acc_[i] += i < accepted ? 1 : 0;
  }
}

void DraftCostModel::ObserveDraftSeconds(int64_t draft_tokens, double seconds) {
  constexpr double kDecay = 0.99;
  std::lock_guard<std::mutex> lock(mu_);
  draft_tok_ = draft_tok_ * kDecay + draft_tokens;
  draft_sec_ = draft_sec_ * kDecay + seconds;
}

DraftPlanInputs DraftCostModel::inputs() const {
  std::lock_guard<std::mutex> lock(mu_);
  DraftPlanInputs in;
  // t = a + b n by weighted least squares; a single size seen: all of it is a.
  const double den = sw_ * snn_ - sn_ * sn_;
  if (sw_ > 0 && std::fabs(den) > 1e-9 * std::max(1.0, sw_ * snn_)) {
    in.b = std::max(0.0, (sw_ * snt_ - sn_ * st_) / den);
    in.a = std::max(0.0, (st_ - in.b * sn_) / sw_);
  } else if (sw_ > 0) {
    in.a = st_ / sw_;
  }
  // Conditional acceptance per position (accepted at i given proposed at i
  // means i accepted, since a draft stops at its first rejection).
  const size_t n = std::max<size_t>(1, prop_.size());
  for (size_t i = 0; i < n; ++i) {
    const double p = i < prop_.size() ? prop_[i] : 0, a = i < acc_.size() ? acc_[i] : 0;
    in.alpha.push_back((a + prior_alpha_ * prior_weight_) / (p + prior_weight_));
  }
  in.draft_seconds = draft_tok_ > 0 ? draft_sec_ / draft_tok_ : 0;
  return in;
}

int DraftCostModel::Choose(int batch, int max_k) const { return ChooseDraftLength(inputs(), batch, max_k); }

}  // namespace myriad::serve
