// One optimizer step: forward/backward over the micro-batches (gradient
// accumulation as the mean of micro-batch gradients), clipping, AdamW, and
// the auxiliary-loss-free bias update. Shared by the trainer and the golden
// test, so the test exercises the code users run.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"
#include "train/optim.h"

namespace myriad {

struct StepStats {
  double loss = 0;        // mean over micro-batches of the total loss
  double loss_main = 0, loss_mtp = 0, loss_aux = 0;
  double loss_indexer = 0;  // DSA indexers' KL (their own gradient; not in loss)
  double grad_norm = 0;   // before clipping
  double lr = 0;
  std::vector<std::vector<int64_t>> expert_load;  // per MoE block, this step
  double max_imbalance = 0;  // max over blocks of max_load / mean_load
};

// micro_batches[a] points at tokens [B, T+1]. `step` is 1-based.
StepStats TrainOneStep(Model& model, AdamWOptimizer& opt,
                       const std::vector<const int32_t*>& micro_batches, int B, int T,
                       int64_t step);

}  // namespace myriad
