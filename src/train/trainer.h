// The training loop behind `myriad train`: data, metrics, evaluation,
// checkpoints and resumption around DistTrainer's step -- one rank of an
// mpirun job, or a world of one rank without mpirun.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/loader.h"
#include "model/config.h"
#include "model/model.h"
#include "train/comm/comm.h"
#include "train/train_config.h"

namespace myriad {

// Exit codes of `myriad train` that tell the supervisor what failed (any
// other non-zero code, or a signal, is a crash).
inline constexpr int kExitNumerical = 3;   // NaN/Inf loss or a loss spike
inline constexpr int kExitHealth = 4;      // the device health check failed
inline constexpr int kExitCheckpoint = 5;  // checkpoints keep failing to be written
inline constexpr int kExitConfig = 6;      // the config is refused (or needs more memory than there is):
                                           // restarting cannot help, so the supervisor gives up at once

struct RunSpec {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key=value
  bool fresh = false;                  // ignore checkpoints in out_dir
  int64_t stop_after = 0;              // stop (and save) after this many steps in this run
  bool quiet = false;                  // no progress line
  comm::Comm* world = nullptr;         // ranks of a distributed run (null or size 1: one process)
  int* exit_code = nullptr;            // set to a kExit* code when RunTraining fails for that reason
};

// "1h05m", "3m07s" (progress lines' ETA and totals); "?" when not finite.
std::string FormatDuration(double seconds);

// Reads, checks and cross-checks a config file (+ overrides). `extra`, when
// given, reads the keys of other sections (post-training's [rl] and
// [distill]) from the same document before unknown keys are refused.
Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                     ModelConfig* model, TrainConfig* train,
                     const std::function<void(ConfigDoc*)>& extra = nullptr);

struct EvalResult {
  double loss = 0;        // mean next-token loss (nats)
  double perplexity = 0;
  int64_t tokens = 0;
};
// Mean main loss over `batches` batches read from the start of `val`.
EvalResult Evaluate(Model& model, DataLoader& val, int B, int T, int64_t batches);
// The same with the main loss of a batch [B, T+1] computed by `loss_of`;
// the loader's cursor is restored afterwards.
EvalResult EvaluateWith(DataLoader& val, int B, int T, int64_t batches,
                        const std::function<double(const int32_t*)>& loss_of);

// Copies parameters and expert biases from a checkpoint into a whole
// `model` (inference, evaluation); checks names and shapes with clear
// errors. Training state is DistTrainer::Restore's.
struct LoadedCheckpoint;
Status RestoreModel(const LoadedCheckpoint& ckpt, Model* model);

Status RunTraining(const RunSpec& spec);

}  // namespace myriad
