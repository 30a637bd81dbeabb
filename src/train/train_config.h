// TrainConfig: the [train] and [data] sections of a config, with defaults.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/status.h"
#include "model/parallel_dims.h"
#include "train/optim.h"

namespace myriad {

// [parallel]: the layout of a distributed run (docs/parallel.md): the
// degrees (ParallelDims, model/parallel_dims.h: the one layout type and its
// validator) and how training runs them.
struct ParallelConfig : ParallelDims {
  int zero = 1;                // ZeRO stage 0-3 for data parallelism
  int microbatches = 0;        // pipeline micro-batches per step (0: 2*pp)
  std::string pp_layers;       // main layers per stage, e.g. "3,2,2,1" ("": as even as possible)
  int ranks_per_node = 0;      // 0: real machines (MPI shared-memory split)
  bool hierarchical = false;   // two-level gradient all-reduce (intra/inter node)
  std::string compression = "none";  // inter-node gradient stage: none | bf16 | int8
  // The pipeline's micro-batches per data rank: `microbatches`, or 2*pp when 0.
  int64_t pipeline_microbatches() const {
    return microbatches > 0 ? microbatches : 2 * static_cast<int64_t>(pp);
  }
};

struct TrainConfig {
  int64_t seq_len = 256;
  int64_t batch_size = 8;
  int64_t grad_accum = 1;
  int64_t steps = 1000;
  OptimConfig optim;
  uint64_t seed = 1234;
  int64_t log_every = 1;
  int64_t eval_every = 0;      // 0: only at the end
  int64_t eval_batches = 8;
  int64_t ckpt_every = 0;      // 0: only at the end
  int64_t keep_last = 3;
  int64_t threads = 0;         // 0: all cores
  std::string out_dir = "runs/default";
  std::string data_dir = "data/default";
  std::string metrics_file;    // default: out_dir/metrics.jsonl
  // Start from this model's weights (a Hugging Face folder, or a run or step
  // directory: `myriad import`'s or a Myriad run's) with a fresh optimizer at
  // step 0: fine-tuning (train/init_from.h). "": the model is initialised.
  std::string init_from;
  std::string precision = "auto";  // "auto" | "fp32" | "bf16" (docs/precision.md)
  // Steady running (docs/supervisor.md).
  bool async_checkpoint = true;    // snapshot to memory, persist in the background
  std::string snapshot_dir = "auto";  // shared-memory copy of each checkpoint ("auto": /dev/shm/myriad-<hash of out_dir>; "none": off)
  bool health_check = true;        // device self-test at start (every rank)
  double loss_spike_factor = 0;    // > 1: a loss above factor x its moving average is a fault (0: off)
  ParallelConfig parallel;

  // Reads [train], [data] and [parallel]; every integer key within its
  // range (docs/config.md), every float finite (ConfigDoc).
  static TrainConfig Read(ConfigDoc* doc);
  Status Validate() const;
  // One step's sizes from this batch and the model `m` fit in 64-bit byte
  // counts (tokens x per-token activations and logits); an overflow names
  // the keys. LoadRunConfig calls it after both configs validate.
  Status CheckSizes(const ModelConfig& m) const;
  // The layout in `parallel` against the model, this batch and `world_size`
  // ranks: ParallelDims::Validate with [train]'s figures (the check
  // DistTrainer::Create and pre-flight make). Errors start "parallel: ".
  Status ValidateLayout(const ModelConfig& m, int world_size) const;
  nlohmann::json ToJson() const;
};


}  // namespace myriad
