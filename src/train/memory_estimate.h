// The memory a training run needs, estimated from its config before
// anything is allocated: the one estimate that `myriad train` checks against
// this machine's memory before it allocates (CheckRunMemory) and that
// pre-flight's "memory" item reports (train/supervise/preflight.h).
//
// Bytes per rank, fp32 throughout (master weights, gradients, AdamW moments
// and activations are all fp32 in Myriad).
//
// Parameters. From the model's ParamLayout (src/model/params.h), cut as the
// ranks cut it:
//   - tensor-parallel tensors (q/k/v/o, FFN and expert widths) / tp: exact,
//     from the layout of tp rank 0 (ShardPlan{tp}); when tp does not divide
//     the model (a layout error, reported by the layout check) every block
//     tensor is divided by tp instead;
//   - routed-expert tensors / ep (every expert has the same size, so this is
//     exact when ep divides model.n_routed_experts);
//   - main-layer tensors / pp; everything outside the main layers (embedding,
//     final norm, head, MTP modules) is counted whole, as the last pipeline
//     stage holds it: the estimate is for the largest stage, a little high
//     for pp > 1 (by about one embedding when the first stage is smaller).
// P_local below is this rank's parameter count so cut (before ZeRO), P the
// whole model's. ZeRO shards over the replica groups the code uses (src/
// train/parallel/zero.h): dense tensors over R = dp*ep*cp, routed experts
// over R = dp*cp (both = dp when ep = cp = 1):
//   params     = 4 * P_local / (zero == 3 ? R : 1)  [+ zero 3: the largest block, gathered whole]
//   grads      = 4 * P_local  [+ zero >= 2: 4 * P_local / R, the owned shard, + 4 * P_local, the
//                padded send copies of the reduce-scatter]: the model keeps its whole gradient at
//                every stage (micro-batches accumulate into it; ZeroSync reduces once, on the last)
//   optimizer  = 2 * 4 * P_local / (zero >= 1 ? R : 1)  (AdamW exp_avg and exp_avg_sq)
// (the bracketed terms hold with R = 1 too: ZeroSync keeps them whatever its group sizes)
//
// Activations: a rough estimate (upper side) of what the backward keeps:
//   D   = dp * ep                        ranks that see different sequences
//   S   = batch_size * grad_accum / D    sequences per rank per step (>= 1)
//   M   = pp > 1 ? microbatches (0: 2*pp) : max(1, grad_accum / D)   micro-batches
//   b   = ceil(S / M)                    sequences per micro-batch
//   N   = b * seq_len / cp               tokens per micro-batch on this rank
//   F   = pp > 1 ? min(pp, M) : 1        micro-batches in flight (1F1B)
//   a_dense = 16*d_model + 4*d_ff/tp                          floats per token, dense layer
//   a_moe   = 16*d_model + 2*n_routed_experts
//             + top_k*(2*d_model + 4*d_expert/tp) + 4*n_shared_experts*d_expert/tp   ... MoE layer
//             (both + a_mla under MLA: 4*n_heads*max(qk_nope + qk_rope, v)
//             + n_heads*(qk_nope + 2*v) + 3*kv_lora_rank + qk_rope + 2*q_lora_rank,
//             the padded attention rows and the projections kept for backward)
//   a   = the mean of a_dense / a_moe over the model's layers
//   L   = ceil(n_layers / pp) + mtp_depth     layers on the largest stage
//   activations = 4 * F * N * (L * a + 2 * vocab_size * (1 + mtp_depth))
// (16*d_model: norms, q/k/v, attention output, residuals and their saved
// inputs; 4*width: gate, up, activation and its input; 2*vocab: logits and
// their gradient for the head and each MTP head). Attention keeps no T x T
// scores (the kernels are flash-style), so there is no seq_len^2 term.
//
// Checkpoints (train/checkpoint/async_writer.h): a save copies this rank's
// parameters and moments to the host (12 * P_local; on one rank that copy
// becomes the snapshot itself, so there this term is an upper bound's
// margin, counted anyway); rank 0 also holds up
// to two snapshots of the whole model (the one being written and the one
// handed over: 2 * 12 * P), with more than one rank the whole tensors it
// gathers them into (12 * P), and, unless train.snapshot_dir = "none", the
// shared-memory copies (tmpfs is memory: the two kept and the one being
// written, 3 * 12 * P). Only rank 0 holds the last three (root_only).
//
// Buffers: the step's token batches (4 * grad_accum * batch_size *
// (seq_len + 1)) and an evaluation batch, the RoPE tables (4 * max_seq_len *
// head_dim, and the indexer's), 64 MiB for the runtime (the health check's
// and the peak measurement's matrices, thread stacks, the code), and with
// zero >= 1 the all-gather's staging buffer (one segment at a time: at most
// the largest block, counted as that).
//
// total = params + grads + optimizer + activations + checkpoint + buffers;
// ranks sharing a host need HostBytes(ranks there).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/config.h"
#include "train/comm/comm.h"
#include "train/train_config.h"

namespace myriad {

struct MemoryEstimate {  // bytes, on the largest rank (rank 0)
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, checkpoint = 0, buffers = 0, total = 0;
  int64_t root_only = 0;  // the part of `checkpoint` that only rank 0 holds
  // The keys that lower the parameters' parts (those of the largest group of
  // tensors) and the activations' (the logits' or the layers'), for hints.
  std::string param_keys, activation_keys;
  // Bytes for `ranks_here` ranks on one host, rank 0 among them.
  int64_t HostBytes(int64_t ranks_here) const;
  // "params 12.3 MiB + grads 12.3 MiB + optimizer 24.6 MiB + activations 3.1 MiB
  //  + checkpoint 61.5 MiB + buffers 64.1 MiB = total 177.9 MiB"
  std::string ToString() const;
  nlohmann::json ToJson() const;
};

// Sequences per rank per step, micro-batches, sequences per micro-batch and
// micro-batches in flight for the layout `d` (as DistTrainer::Create plans them).
struct BatchPlan {
  int64_t per_rank = 1, micro = 1, per_micro = 1, in_flight = 1;
};
BatchPlan PlanBatches(const TrainConfig& t, const ParallelDims& d, int64_t microbatches);

// Estimated bytes on the largest rank for the layout in t.parallel (formula
// above). `ranks` is the world size: when t.parallel is trivial (all 1) and
// ranks > 1, the ranks are counted as data parallelism (dp = ranks). The
// configs must have passed validation (LoadRunConfig): their sizes fit.
MemoryEstimate EstimateRankMemory(const ModelConfig& m, const TrainConfig& t, int ranks);

// MemAvailable from /proc/meminfo, in bytes; -1 when it cannot be read.
int64_t MemAvailableBytes();

// Ok when `ranks_here` ranks of estimate `e` fit in `available` bytes (< 0:
// unknown, not compared); else one line with the numbers, the parts that
// need the most and the keys that lower them.
Status CheckMemoryFits(const MemoryEstimate& e, int64_t ranks_here, int64_t available);

// What `myriad train` checks before it allocates: the estimate for this
// world, times the ranks on this machine, against MemAvailable. Every rank
// of `world` calls it (it counts the ranks that share this machine).
Status CheckRunMemory(const ModelConfig& m, const TrainConfig& t, comm::Comm* world);

// "0 B", "512 B", "12.3 KiB", "4.0 MiB", "3.2 GiB".
std::string FormatBytes(int64_t bytes);

}  // namespace myriad
