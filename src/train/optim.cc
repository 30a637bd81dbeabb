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

AdamWOptimizer::AdamWOptimizer(const ParamLayout& layout, const OptimConfig& cfg)
    : layout_(layout), cfg_(cfg), m_(layout.total(), 0.f), v_(layout.total(), 0.f) {}

double AdamWOptimizer::Step(float* params, const float* grads, int64_t s) {
  const double norm = std::sqrt(ops::SumSquares(grads, layout_.total()));
  const double scale = cfg_.grad_clip > 0 ? std::min(1.0, cfg_.grad_clip / (norm + 1e-6)) : 1.0;
  last_lr_ = LearningRate(cfg_, s);
  for (const auto& p : layout_.params()) {
    AdamWParams a;
    a.n = p.numel;
    a.lr = static_cast<float>(last_lr_);
    a.beta1 = static_cast<float>(cfg_.beta1);
    a.beta2 = static_cast<float>(cfg_.beta2);
    a.eps = static_cast<float>(cfg_.eps);
    a.weight_decay = p.decay ? static_cast<float>(cfg_.weight_decay) : 0.f;
    a.step = s;
    a.param = params + p.offset;
    a.grad = grads + p.offset;
    a.m = m_.data() + p.offset;
    a.v = v_.data() + p.offset;
    a.grad_scale = static_cast<float>(scale);
    ops::AdamW(a);
  }
  return norm;
}

}  // namespace myriad
