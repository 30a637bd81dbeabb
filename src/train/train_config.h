// TrainConfig: the [train] and [data] sections of a config, with defaults.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/status.h"
#include "train/optim.h"

namespace myriad {

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

  static TrainConfig Read(ConfigDoc* doc);
  Status Validate() const;
  nlohmann::json ToJson() const;
};


}  // namespace myriad
