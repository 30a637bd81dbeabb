#include "train/optim.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace myriad {

double LearningRate(const OptimConfig& c, int64_t s) {
  if (c.warmup_steps > 0 && s <= c.warmup_steps)
    return c.lr * static_cast<double>(s) / static_cast<double>(c.warmup_steps);
  double p = static_cast<double>(s - c.warmup_steps) /
             static_cast<double>(std::max<int64_t>(1, c.steps - c.warmup_steps));
  p = std::min(1.0, std::max(0.0, p));
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * p));
}

double ClipScale(const OptimConfig& c, double grad_norm) {
  return c.grad_clip > 0 ? std::min(1.0, c.grad_clip / (grad_norm + 1e-6)) : 1.0;
}

void AdamWUpdate(const OptimConfig& c, int64_t s, double lr, double grad_scale, bool decay, int64_t n,
                 float* param, const float* grad, float* m, float* v) {
  AdamWParams a;
  a.n = n;
  a.lr = static_cast<float>(lr);
  a.beta1 = static_cast<float>(c.beta1);
  a.beta2 = static_cast<float>(c.beta2);
  a.eps = static_cast<float>(c.eps);
  a.weight_decay = decay ? static_cast<float>(c.weight_decay) : 0.f;
  a.step = s;
  a.param = param;
  a.grad = grad;
  a.m = m;
  a.v = v;
  a.grad_scale = static_cast<float>(grad_scale);
  ops::AdamW(a);
}

}  // namespace myriad
