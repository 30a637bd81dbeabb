// AdamW with decoupled weight decay over the model's flat parameter buffer,
// global-norm clipping and the warmup + cosine schedule of docs/model.md.
#pragma once

#include <cstdint>
#include <vector>

#include "model/params.h"

namespace myriad {

struct OptimConfig {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup_steps = 100, steps = 1000;
  double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, grad_clip = 1.0;
};

// Learning rate at 1-based step s.
double LearningRate(const OptimConfig& c, int64_t s);

class AdamWOptimizer {
 public:
  AdamWOptimizer(const ParamLayout& layout, const OptimConfig& cfg);
  // One update at 1-based step s. Returns the global L2 norm of the grads
  // before clipping.
  double Step(float* params, const float* grads, int64_t s);
  std::vector<float>& exp_avg() { return m_; }
  std::vector<float>& exp_avg_sq() { return v_; }
  const OptimConfig& config() const { return cfg_; }
  double last_lr() const { return last_lr_; }

 private:
  const ParamLayout& layout_;
  OptimConfig cfg_;
  std::vector<float> m_, v_;
  double last_lr_ = 0;
};

}  // namespace myriad
