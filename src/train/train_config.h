// TrainConfig: the [train] and [data] sections of a config, with defaults.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/status.h"
#include "train/optim.h"

namespace myriad {

// [parallel]: the layout of a distributed run (docs/parallel.md).
struct ParallelConfig {
  int dp = 1, tp = 1, pp = 1, ep = 1, cp = 1;
  int zero = 1;                // ZeRO stage 0-3 for data parallelism
  int microbatches = 0;        // pipeline micro-batches per step (0: 2*pp)
  std::string pp_layers;       // main layers per stage, e.g. "3,2,2,1" ("": as even as possible)
  int ranks_per_node = 0;      // 0: real machines (MPI shared-memory split)
  bool hierarchical = false;   // two-level gradient all-reduce (intra/inter node)
  std::string compression = "none";  // inter-node gradient stage: none | bf16 | int8
  bool trivial() const { return dp * tp * pp * ep * cp == 1; }
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
  std::string precision = "auto";  // "auto" | "fp32" | "bf16" (docs/precision.md)
  // Steady running (docs/supervisor.md).
  bool async_checkpoint = true;    // snapshot to memory, persist in the background
  std::string snapshot_dir = "auto";  // shared-memory copy of each checkpoint ("auto": /dev/shm/myriad-<hash of out_dir>; "none": off)
  bool health_check = true;        // device self-test at start (every rank)
  double loss_spike_factor = 0;    // > 1: a loss above factor x its moving average is a fault (0: off)
  ParallelConfig parallel;

  static TrainConfig Read(ConfigDoc* doc);
  Status Validate() const;
  nlohmann::json ToJson() const;
};


}  // namespace myriad
