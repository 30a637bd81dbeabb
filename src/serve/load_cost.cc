#include "serve/load_cost.h"

#include <algorithm>

namespace myriad::serve {

double PriorBytesPerSecond(const std::string& tier_name) {
  if (tier_name == "host") return 5e9;     // a memcpy out of a hash map
  if (tier_name == "disk") return 5e8;     // a file read and checksum, page cache cold
  if (tier_name == "redis") return 1e8;    // a network round trip per block
  return 2e8;
}

LoadPlan ChooseLoadPlan(const std::vector<double>& seconds_per_block, double recompute_seconds_per_block,
                        int64_t inline_blocks, double async_seconds) {
  const int64_t m = static_cast<int64_t>(seconds_per_block.size());
  if (inline_blocks < 0) inline_blocks = m;
  LoadPlan best;
  best.all_recompute_seconds = m * recompute_seconds_per_block;
  double best_cost = best.all_recompute_seconds, load = 0;
  best.recompute_blocks = m;
  best.recompute_seconds = best.all_recompute_seconds;
  for (int64_t k = 1; k <= m; ++k) {
    load += seconds_per_block[k - 1];
    const double rest = (m - k) * recompute_seconds_per_block;
    const double wait = k > inline_blocks ? async_seconds : 0.0;
    if (load + wait + rest <= best_cost) {
      best_cost = load + wait + rest;
      best.load_blocks = k;
      best.recompute_blocks = m - k;
      best.load_seconds = load + wait;
      best.recompute_seconds = rest;
      best.async = k > inline_blocks;
    }
  }
  return best;
}

LoadCostModel::LoadCostModel(int64_t block_bytes, double prefill_tokens_per_second)
    : block_bytes_(block_bytes), tps_(std::max(1.0, prefill_tokens_per_second)) {}

void LoadCostModel::ObservePrefill(int64_t tokens, double seconds) {
  if (tokens <= 0 || seconds <= 0) return;
  const double sample = tokens / seconds;
  std::lock_guard<std::mutex> lock(mu_);
  tps_ = observed_++ == 0 ? sample : 0.8 * tps_ + 0.2 * sample;
}

double LoadCostModel::prefill_tokens_per_second() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tps_;
}

double LoadCostModel::TierSecondsPerBlock(const std::string& tier_name, const TierStats& st) const {
  // Trust the measurement once it covers a few blocks.
  if (st.bytes_read >= 4 * block_bytes_ && st.read_seconds > 0)
    return block_bytes_ * (st.read_seconds / static_cast<double>(st.bytes_read));
  return block_bytes_ / PriorBytesPerSecond(tier_name);
}

void LoadCostModel::ObserveStep(double seconds) {
  if (seconds <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  step_ = steps_++ == 0 ? seconds : 0.9 * step_ + 0.1 * seconds;
}

double LoadCostModel::step_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_;
}

double LoadCostModel::RecomputeSecondsPerBlock() const {
  return kBlockTokens / prefill_tokens_per_second();
}

}  // namespace myriad::serve
