// Pre-flight checks: everything a training job needs, checked in seconds
// before ranks are started, so that a run does not die an hour in (or
// after mpirun has spread it over the machines) on a typo, a missing
// tokenizer, a layout that does not divide or a full disk.
//
// RunPreflight runs every check, in order, and never stops at the first
// problem; a check whose input is missing because an earlier one failed
// (e.g. the data check when the config does not load) is reported as
// skipped, with the reason. The items, in order:
//
//   config            LoadRunConfig (train/trainer.h) accepts the config + --set overrides
//   layout            [parallel] passes TrainConfig::ValidateLayout for `ranks` (ParallelDims::Validate: DSA included)
//   memory            EstimateRankMemory x ranks on this host fits MemAvailable
//   data.train        DataLoader::Open(data.dir, "train", seq_len, seed); its vocab fits the model
//   data.val          the "val" split (warn only: a run without one trains, without evaluation)
//   data.tokenizer    <data.dir>/tokenizer.model exists, is a readable non-empty file
//   checkpoint.write  train.out_dir can be created and a probe file written and deleted there
//   checkpoint.space  free disk at train.out_dir holds two checkpoints
//   launcher          ranks > 1: `launcher` is an executable file on PATH; ranks == 1: not needed
//
// Side effect: checkpoint.write creates train.out_dir (as `myriad train`
// would); the probe file is deleted. Nothing else is written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "train/train_config.h"

namespace myriad::supervise {

struct PreflightOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key=value, as for `myriad train`
  int ranks = 1;                       // ranks the job will start
  int ranks_per_host = 0;              // 0: all ranks on this machine (memory is shared between them)
  std::string launcher = "mpirun";     // must be on PATH when ranks > 1 (a name with '/' is used as a path)
  int64_t mem_available_bytes = -1;    // -1: read MemAvailable from /proc/meminfo (tests override)
  int64_t disk_free_bytes = -1;        // -1: statvfs of the checkpoint folder (or its nearest existing parent)
};

struct PreflightItem {
  std::string check;     // "config", "layout", "memory", "data.train", ... (list above)
  bool ok = true;        // false for failures and for skipped checks
  std::string detail;    // what was found, or the problem with its setting, number and a hint
  bool skipped = false;  // not run: its input is missing (detail says why); ok is false
  bool warn = false;     // passed, but worth a look (e.g. no validation split)
};

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
// ZeRO shards over the replica groups the code uses (src/train/parallel/
// zero.h): dense tensors over R = dp*ep*cp, routed experts over R = dp*cp
// (both = dp when ep = cp = 1):
//   params     = 4 * P / (zero == 3 ? R : 1)  [+ zero 3: the largest block, gathered whole]
//   grads      = 4 * P / (zero >= 2 ? R : 1)
//   optimizer  = 2 * 4 * P / (zero >= 1 ? R : 1)  (AdamW exp_avg and exp_avg_sq)
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
//   a   = the mean of a_dense / a_moe over the model's layers
//   L   = ceil(n_layers / pp) + mtp_depth     layers on the largest stage
//   activations = 4 * F * N * (L * a + 2 * vocab_size * (1 + mtp_depth))
// (16*d_model: norms, q/k/v, attention output, residuals and their saved
// inputs; 4*width: gate, up, activation and its input; 2*vocab: logits and
// their gradient for the head and each MTP head). Attention keeps no T x T
// scores (the kernels are flash-style), so there is no seq_len^2 term.
//
// total = params + grads + optimizer + activations.
struct MemoryEstimate {  // bytes per rank
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, total = 0;
  // "params 12.3 MiB + grads 12.3 MiB + optimizer 24.6 MiB + activations 3.1 MiB = total 52.3 MiB"
  std::string ToString() const;
  nlohmann::json ToJson() const;
};

struct PreflightReport {
  std::vector<PreflightItem> items;  // every check, passed or not, in order
  MemoryEstimate memory;
  int64_t checkpoint_bytes = 0;      // estimated size of one checkpoint
  bool ok() const;                   // every item ok (none failed or skipped)
  int problems() const;              // failed items (skipped ones not counted)
  int skipped() const;
  // One line per check ("  ok    config    ...", "  FAIL  ...", "  SKIP  ...",
  // "  warn  ..."), then a summary line: "0 problems", "2 problems, 6 checks skipped".
  std::string Format() const;
  // {"ok": .., "problems": .., "items": [{"check","ok","skipped","warn","detail"}],
  //  "memory": {...}, "checkpoint_bytes": ..}
  nlohmann::json ToJson() const;
  // The item named `check`, or null.
  const PreflightItem* Find(const std::string& check) const;
};

// Estimated bytes per rank for the layout in t.parallel (formula above).
// `ranks` is the world size: when t.parallel is trivial (all 1) and
// ranks > 1, the ranks are counted as data parallelism (dp = ranks). The
// model must have passed ModelConfig::Validate.
MemoryEstimate EstimateRankMemory(const ModelConfig& m, const TrainConfig& t, int ranks);

// Estimated size of one checkpoint of the whole model: weights and the two
// AdamW moments in fp32, plus safetensors headers and the manifest.
int64_t EstimateCheckpointBytes(const ModelConfig& m);

// "0 B", "512 B", "12.3 KiB", "4.0 MiB", "3.2 GiB".
std::string FormatBytes(int64_t bytes);

PreflightReport RunPreflight(const PreflightOptions& o);

}  // namespace myriad::supervise
