#include "train/train_step.h"

#include <algorithm>

namespace myriad {

StepStats TrainOneStep(Model& model, AdamWOptimizer& opt,
                       const std::vector<const int32_t*>& micro_batches, int B, int T,
                       int64_t step) {
  StepStats st;
  const int A = static_cast<int>(micro_batches.size());
  model.ZeroGrads();
  model.ClearExpertLoad();
  // DSA: dense warm-up for the first dsa_warmup_steps steps.
  if (model.config().dsa()) model.set_dsa_dense(step <= model.config().dsa_warmup_steps);
  for (const int32_t* tokens : micro_batches) {
    LossParts lp = model.Step(tokens, B, T, /*backward=*/true, 1.f / static_cast<float>(A));
    st.loss += lp.total / A;
    st.loss_main += lp.main / A;
    st.loss_mtp += lp.mtp / A;
    st.loss_aux += lp.aux / A;
    st.loss_indexer += lp.indexer / A;
  }
  st.expert_load = model.expert_load();
  for (const auto& load : st.expert_load) {
    int64_t sum = 0, mx = 0;
    for (auto c : load) sum += c, mx = std::max(mx, c);
    if (sum > 0) st.max_imbalance = std::max(st.max_imbalance, static_cast<double>(mx) * load.size() / sum);
  }
  st.grad_norm = opt.Step(model.params().data(), model.grads().data(), step);
  st.lr = opt.last_lr();
  model.ApplyBiasUpdate();
  return st;
}

}  // namespace myriad
