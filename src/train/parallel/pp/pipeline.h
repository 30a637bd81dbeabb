// Pipeline parallelism: the model's main layers cut into stages, one per
// rank of the pp group, and the 1F1B schedule that runs a step's
// micro-batches through them (docs/parallel.md, "Pipeline parallelism").
// The model computes (Model::StageForward/StageBackward); this moves the
// boundary activations and gradients between neighbouring stages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model.h"
#include "train/comm/comm.h"
#include "train/parallel/zero.h"

namespace myriad {

// First layer of each of `pp` stages (and n_layers at the end): from
// parallel.pp_layers ("3,2,...": layers per stage) or, when `spec` is
// empty, as even as possible (the earlier stages take the remainder; the
// last stage also carries the head and MTP modules).
Result<std::vector<int>> StageLayers(int64_t n_layers, int pp, const std::string& spec);

class Pipeline {
 public:
  // `model` is this rank's stage (set_slots(pp) already); `zero` reduces its
  // gradients during the last micro-batch's backward. Not owned.
  Pipeline(comm::Comm* pp, Model* model, ZeroSync* zero) : pp_(pp), model_(model), zero_(zero) {}

  // 1F1B over M micro-batches of mb sequences (tokens [M*mb, T+1]), every
  // loss scaled by `scale`; adds this stage's loss terms (scaled) to *loss.
  // Collective over the pp group.
  void Step(const int32_t* tokens, int64_t M, int64_t mb, int T, float scale, LossParts* loss);
  // Forward only, stage after stage, of one batch [B, T+1]: the main loss,
  // on every stage. Collective over the pp group.
  double ForwardLoss(const int32_t* tokens, int B, int T);

  // Of the last Step: the schedule's idle fraction (P-1)/(M+P-1), and the
  // measured one (time waiting for neighbours, averaged over the stages).
  double bubble_theory() const { return bubble_theory_; }
  double bubble_measured() const { return bubble_measured_; }

 private:
  comm::Comm* pp_;
  Model* model_;
  ZeroSync* zero_;
  std::vector<Buf<float>> act_in_, act_out_, grad_out_;  // per slot (device)
  Buf<float> grad_in_, eval_in_;
  double bubble_theory_ = 0, bubble_measured_ = 0;
};

}  // namespace myriad
