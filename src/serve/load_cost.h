// Load or recompute: a cached prefix found in a lower KV tier is worth
// loading only when reading its blocks is faster than computing them again.
// The model: reading a block from a tier takes block_bytes * seconds_per_byte
// of that tier, measured from its TierStats (bytes_read / read_seconds, which
// include each Get's latency) once it has read at least a few blocks, a prior
// per tier name until then; recomputing takes kBlockTokens / prefill tokens
// per second of this machine's runner, measured at engine start and updated
// as it runs. For a run of matched blocks (each from its own tier) the plan
// loads the leading k blocks and recomputes the rest, k chosen to minimise
// the total, so the plan's estimate is never above recomputing everything.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "serve/kvcache/tier.h"

namespace myriad::serve {

// Prior read speed of a tier before it has been measured (bytes/s): host
// memory, local disk, a remote store, or anything else.
double PriorBytesPerSecond(const std::string& tier_name);

struct LoadPlan {
  int64_t load_blocks = 0;        // leading matched blocks to read from their tiers
  int64_t recompute_blocks = 0;   // matched blocks after those, recomputed instead
  double load_seconds = 0, recompute_seconds = 0;  // estimate of the plan's parts
  double all_recompute_seconds = 0;                // estimate of recomputing every matched block
  bool async = false;                              // some loaded block is read by the I/O thread
};

// Of `seconds_per_block` (the read time of each matched block, in prefix
// order) choose how many leading blocks to load, recomputing the rest at
// `recompute_seconds_per_block`; ties go to loading. The first
// `inline_blocks` are read at admission by the scheduler itself (memory
// copies); loading any block after them means the request waits for the I/O
// thread and sits out at least one step, which costs `async_seconds` once.
LoadPlan ChooseLoadPlan(const std::vector<double>& seconds_per_block, double recompute_seconds_per_block,
                        int64_t inline_blocks = -1, double async_seconds = 0);

// Thread-safe: the scheduler reads it, and its measurements come from the
// scheduler (prefill) and from tier stats.
class LoadCostModel {
 public:
  LoadCostModel(int64_t block_bytes, double prefill_tokens_per_second);
  // A measured prefill: `tokens` prompt tokens took `seconds` (a moving
  // average of the throughput; the first call replaces the start value).
  void ObservePrefill(int64_t tokens, double seconds);
  double prefill_tokens_per_second() const;
  // Read seconds of one block from a tier with these stats.
  double TierSecondsPerBlock(const std::string& tier_name, const TierStats& st) const;
  double RecomputeSecondsPerBlock() const;
  // A step's duration (moving average of the batched forwards): what a
  // request that waits for the I/O thread loses at least.
  void ObserveStep(double seconds);
  double step_seconds() const;
  int64_t block_bytes() const { return block_bytes_; }

 private:
  const int64_t block_bytes_;
  mutable std::mutex mu_;
  double tps_;
  int64_t observed_ = 0;
  double step_ = 0.01;
  int64_t steps_ = 0;
};

}  // namespace myriad::serve
