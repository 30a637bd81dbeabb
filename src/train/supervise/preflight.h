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
//   memory            EstimateRankMemory for the ranks on this host fits MemAvailable (CheckMemoryFits)
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
#include "train/memory_estimate.h"
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

// The memory estimate (its formula) and the check against the memory here
// are train/memory_estimate.h's, shared with `myriad train`.
using ::myriad::EstimateRankMemory;
using ::myriad::FormatBytes;
using ::myriad::MemoryEstimate;

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

// Estimated size of one checkpoint of the whole model: weights and the two
// AdamW moments in fp32, plus safetensors headers and the manifest.
int64_t EstimateCheckpointBytes(const ModelConfig& m);

PreflightReport RunPreflight(const PreflightOptions& o);

}  // namespace myriad::supervise
