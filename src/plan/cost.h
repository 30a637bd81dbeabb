// The cost model: for a job, a cluster and a parallel layout, the time of
// one optimizer step (compute per layer, each collective on the tiers it
// crosses, the pipeline's bubble, what overlaps with what) and the memory
// each device needs. docs/planning.md derives every term.
//
// Rank order is Myriad's (train/parallel/mesh.h), innermost first:
//   rank = tp_r + tp * (cp_r + cp * (ep_r + ep * (dp_r + dp * pp_r)))
// so tensor-parallel partners share a node first and the pipeline is the
// outermost dimension.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/parallel_dims.h"
#include "plan/desc.h"

namespace myriad::plan {

enum class Recompute { kNone, kSelective, kFull };
const char* RecomputeName(Recompute r);

// A candidate: the degrees (ParallelDims, model/parallel_dims.h, the one
// layout type, which training's [parallel] extends too) and the knobs the
// cost model prices.
struct Layout : ParallelDims {
  int64_t micro_batch = 1;   // sequences per micro-batch (per dp*ep replica)
  int zero = 1;              // ZeRO stage 0-3 (over the replicas of each parameter)
  Recompute recompute = Recompute::kNone;
  int64_t interleave = 1;    // model chunks per pipeline stage (interleaved 1F1B)
  int64_t devices() const { return int64_t{dp} * tp * pp * ep * cp; }
  // "dp8 tp8 pp4 ep1 cp1 mb1 zero1 rc=none v1"
  std::string ToString() const;
};
// "dp=6,tp=8,pp=64,mb=1,zero=1,rc=full,v=2" or as ToString prints it, "dp6
// tp8 ..." (keys dp tp pp ep cp mb zero rc
// v; missing ones keep the defaults above).
Result<Layout> ParseLayout(const std::string& spec);

// ---------------------------------------------------------------- collectives

// How a group of ranks spreads over the cluster's tiers: per_level[k] is how
// many members share one tier-k block for each member of the level below
// (per_level[0]: members on one node); the product is the group's size.
struct GroupSpan {
  std::vector<int64_t> per_level;
  int64_t size() const;
  int outermost() const;  // the largest level with more than one member (-1: a single rank)
};
// The span of the group formed by dimensions given as (stride, size), the
// strides in rank order and nested (each stride >= the previous stride*size).
GroupSpan SpanOf(const ClusterDesc& c, const std::vector<std::pair<int64_t, int64_t>>& dims);

enum class Algo { kNone, kRing, kTree, kHierarchical };
const char* AlgoName(Algo a);
struct CollCost {
  double seconds = 0;
  Algo algo = Algo::kNone;
};
// `bytes` is the whole buffer (each member's input for all-reduce and
// reduce-scatter, the gathered output for all-gather). The fastest of a
// ring over the slowest tier crossed, a double binary tree, and a
// hierarchical ring per tier (reduce-scatter in, all-reduce across, gather out).
CollCost AllReduce(const ClusterDesc& c, const GroupSpan& g, double bytes);
CollCost AllGather(const ClusterDesc& c, const GroupSpan& g, double bytes);
// An all-gather's traffic plus the reduction: (g-1)/g of the buffer read
// twice and written once at the device's reduce_bw (free when 0).
CollCost ReduceScatter(const ClusterDesc& c, const GroupSpan& g, double bytes);
// Each member sends `bytes` in total, an equal share to every member; the
// traffic leaving each tier block goes over that tier's links, all tiers at
// once; `imbalance` (>= 1) scales the busiest member's share.
CollCost AllToAll(const ClusterDesc& c, const GroupSpan& g, double bytes, double imbalance = 1.0);
// Point to point between ranks `stride` apart.
double SendRecv(const ClusterDesc& c, int64_t stride, double bytes);

// ---------------------------------------------------------------- the model

struct MemoryBreakdown {
  double weights = 0, grads = 0, optimizer = 0;  // per device, the busiest stage
  double activations = 0;                        // in flight under 1F1B
  double logits = 0, buffers = 0;                // head's fp32 logits; gathered ZeRO-3 layers, comm buffers
  double total = 0;
  double capacity = 0;                           // device memory * usable fraction
};

struct StepEstimate {
  bool feasible = false;
  std::string why;            // when not feasible
  int64_t microbatches = 0;   // per pipeline (per dp*ep replica) per step
  double step_s = 0;
  // Parts of the step (seconds; comm figures are what is exposed, not hidden
  // behind compute).
  double compute_s = 0;       // the pipeline's busiest stage, all micro-batches
  double bubble_s = 0;        // 1F1B fill and drain
  double tp_s = 0, cp_s = 0, ep_s = 0, pp_s = 0, dp_s = 0, zero3_s = 0;
  double optimizer_s = 0;
  double tokens_per_s = 0;
  double model_flops_per_token = 0;  // 6 * active params + causal attention (no recompute)
  double mfu = 0;                    // model FLOPs / (step time * devices * peak)
  double hw_flops_per_step = 0;      // what the devices execute, recompute included
  MemoryBreakdown mem;
};

// Checks that the layout can run the job at all: the micro-batch divides a
// replica's sequences, the ZeRO stage is 0-3, the degrees multiply to the
// cluster's devices, and ParallelDims::Validate (the rules training applies;
// Myriad's own limits, DSA's, when job.myriad_limits) passes with the job's
// figures; the message names the first rule broken, prefixed with the layout.
Status CheckLayout(const JobDesc& job, const ClusterDesc& c, const Layout& l);

// Contiguous stages for per-layer times `t` (each stage at least one layer)
// minimising the slowest stage, whose time includes `first_extra` on the
// first and `last_extra` on the last. Sizes, first stage first.
std::vector<int64_t> BalanceStages(const std::vector<double>& t, double first_extra, double last_extra, int64_t P);

// The estimate; infeasible layouts (CheckLayout or memory) say why.
StepEstimate Estimate(const JobDesc& job, const ClusterDesc& c, const Layout& l);

// Serving memory: weights on `devices` devices (tensor-parallel inside a
// node, pipelined across nodes) and what is left for the KV cache.
struct ServingMemory {
  int64_t devices = 0, tp = 0, pp = 0;
  double weights_per_device = 0;     // bytes
  double kv_bytes_per_token = 0;     // per device: k and v of its layers' kv heads, or MLA's latent rows (+ DSA indexer keys)
  double gqa_kv_bytes_per_token = 0; // the same with GQA attention of equal width (model/flops.h GqaAtEqualWidth)
  double kv_capacity_tokens = 0;     // per replica: what fits beside the weights (0 if the weights do not)
  bool fits = false;
};
// `kv_bytes`: bytes per cached element (2: bf16, 1: int8/fp8).
ServingMemory EstimateServing(const JobDesc& job, const ClusterDesc& c, int64_t devices, double kv_bytes = 2);
// The fewest devices (1, 2, 4, ... up to the cluster) whose weights leave
// at least `kv_fraction` of their memory to the KV cache.
ServingMemory SmallestServing(const JobDesc& job, const ClusterDesc& c, double kv_fraction = 0.2, double kv_bytes = 2);

// FLOPs per token (forward, trained): model/flops.h, shared with the trainer.
using ::myriad::ForwardFlopsPerToken;
using ::myriad::TrainFlopsPerToken;
// Megatron-LM's count for a GPT (Narayanan et al. 2021, eq. 3): FLOPs per
// iteration with full recomputation, 96 B s l h^2 (1 + s/6h + V/16lh).
double MegatronFlopsPerIteration(double batch, double seq, double layers, double hidden, double vocab);

}  // namespace myriad::plan
