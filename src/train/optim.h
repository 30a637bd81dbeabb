// AdamW with decoupled weight decay, global-norm clipping and the warmup +
// cosine schedule of docs/model.md. The state (moments) belongs to the
// trainer (DistTrainer: flat, or the slices a rank owns under ZeRO); this is
// the arithmetic it applies.
#pragma once

#include <cstdint>

namespace myriad {

struct OptimConfig {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup_steps = 100, steps = 1000;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
};

// Learning rate at 1-based step s.
double LearningRate(const OptimConfig& c, int64_t s);

// The factor clipping multiplies the gradients by, given their global L2
// norm (1 when within grad_clip or clipping is off).
double ClipScale(const OptimConfig& c, double grad_norm);

// One AdamW update of n parameters at 1-based step s with learning rate lr,
// the gradients scaled by grad_scale (clipping); `decay`: the tensor takes
// weight decay.
void AdamWUpdate(const OptimConfig& c, int64_t s, double lr, double grad_scale, bool decay, int64_t n,
                 float* param, const float* grad, float* m, float* v);

}  // namespace myriad
