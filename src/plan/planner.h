// The parallel planner: the layout (dp, tp, pp, ep, cp, micro-batch, ZeRO
// stage, recomputation, interleaving) with the highest estimated throughput
// that fits in device memory; and the dynamic mode, which plans each
// sequence-length bucket of a length distribution on its own and compares
// that with the best single static layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/cost.h"

namespace myriad::plan {

struct SearchSpace {
  std::vector<int64_t> micro_batches = {1, 2, 4, 8, 16};
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<Recompute> recompute = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  std::vector<int64_t> interleave = {1};  // Myriad's pipeline is plain 1F1B; add 2, 4 for engines that interleave
  int64_t max_tp = 0;   // 0: the node's size (tensor parallelism stays on the fastest tier)
  int64_t max_pp = 0;   // 0: n_layers
  int64_t max_cp = 0;   // 0: any that divides the sequence
  int64_t max_ep = 0;   // 0: any that divides the experts
  // Fixed degrees (0: searched).
  int64_t dp = 0, tp = 0, pp = 0, ep = 0, cp = 0;
  // Layouts may leave whole nodes idle (as hot spares) down to this many
  // devices in use (0: every device). A device count like 10,000 = 2^4 5^4
  // rarely factors into degrees that divide a model's shapes.
  int64_t min_devices = 0;
};
// "1,2,4": positive integers, comma-separated; `what` names the list in errors.
Result<std::vector<int64_t>> ParseIntList(const std::string& what, const std::string& text);
// Reads [search] (micro_batches = "1,2,4", interleave = "1,2", max_tp,
// max_pp, max_cp, max_ep, min_devices) over `base`.
Result<SearchSpace> ReadSearchSpace(ConfigDoc* doc, const SearchSpace& base = {});
// The device counts a search tries: the cluster's, then one node fewer at a
// time down to min_devices.
std::vector<int64_t> UsedDeviceCounts(const ClusterDesc& c, const SearchSpace& s);
// The cluster restricted to its first `devices` devices.
ClusterDesc UsingDevices(const ClusterDesc& c, int64_t devices);

struct PlanResult {
  bool found = false;
  Layout layout;
  StepEstimate est;
  int64_t evaluated = 0;  // Estimate calls
  int64_t layouts = 0;    // (dp, tp, pp, ep, cp) tuples that passed the divisibility rules
  std::vector<std::pair<Layout, StepEstimate>> runners_up;  // next best feasible, best first
  std::string why;        // when nothing fits: the reason for the closest layout
};

// Every (dp, tp, pp, ep, cp) whose product is the cluster's device count
// (all of them: see UsedDeviceCounts) and that the job's shapes allow
// (CheckLayout with micro_batch 1).
std::vector<Layout> ParallelLayouts(const JobDesc& job, const ClusterDesc& c, const SearchSpace& s);

// The best layout. Skips a parallel layout whose smallest possible memory
// (over ZeRO stages and recomputation at micro-batch 1) does not fit, and
// stops growing the micro-batch once it no longer fits (memory never falls
// as it grows). `keep` runners-up are returned.
PlanResult FindBest(const JobDesc& job, const ClusterDesc& c, const SearchSpace& s, int keep = 5);
// The same search without any pruning: every combination (for tests).
PlanResult BruteForce(const JobDesc& job, const ClusterDesc& c, const SearchSpace& s);

// ---------------------------------------------------------------- dynamic

struct LengthBucket {
  int64_t seq_len = 4096;
  double token_fraction = 1;  // of the training tokens
};
// "4096:0.6,32768:0.3,262144:0.1" (fractions are normalised).
Result<std::vector<LengthBucket>> ParseBuckets(const std::string& spec);

struct BucketPlan {
  LengthBucket bucket;
  PlanResult dynamic;       // this bucket's own best layout
  StepEstimate static_est;  // the static layout on this bucket (its best micro-batch)
  int64_t static_micro_batch = 0;
  double dynamic_hours = 0, static_hours = 0;  // to train this bucket's tokens
};

struct DynamicPlan {
  bool found = false;
  std::string why;
  std::vector<BucketPlan> buckets;
  Layout static_layout;   // one layout for every bucket (micro-batch per bucket)
  double static_hours = 0, dynamic_hours = 0;
  double switch_hours = 0;  // re-sharding between layouts (weights + optimizer state moved once per switch)
  int64_t switches = 0;
  double static_mfu = 0, dynamic_mfu = 0;  // time-weighted
  // The naive static plan: the longest bucket's own layout used for every
  // bucket (what a run sized for its longest sequences does); 0 if it does
  // not fit some bucket.
  double longest_layout_hours = 0;
};

// Plans every bucket (`job.seq_len` is replaced by each bucket's), and the
// best static layout: the one (dp, tp, pp, ep, cp, ZeRO, recompute,
// interleave) that fits every bucket and trains all the tokens fastest.
// Training visits the buckets `rounds` times (data is mixed in phases), so
// the dynamic plan pays rounds * (distinct layouts) re-shardings.
DynamicPlan PlanDynamic(const JobDesc& job, const ClusterDesc& c, const SearchSpace& s,
                        const std::vector<LengthBucket>& buckets, int64_t rounds = 10);

}  // namespace myriad::plan
