// The ParallelHooks the model sees in a distributed run: ZeRO events and
// expert parallelism, composed.
#pragma once

#include "model/shard.h"
#include "train/parallel/ep/dispatch.h"
#include "train/parallel/tp/seq_parallel.h"
#include "train/parallel/zero.h"

namespace myriad {

class DistHooks : public ParallelHooks {
 public:
  DistHooks(ZeroSync* zero, ExpertParallel* ep, TpRows* sp) : zero_(zero), ep_(ep), sp_(sp) {}
  bool SeqParallel() const override { return sp_ != nullptr; }
  RowRange OwnRows(int64_t rows) const override { return sp_ ? sp_->OwnRows(rows) : RowRange{0, rows}; }
  void GatherRows(const float* own, float* full, int64_t rows, int64_t C) override { sp_->Gather(own, full, rows, C); }
  void ReduceScatterRows(const float* full, float* own, int64_t rows, int64_t C) override {
    sp_->ReduceScatter(full, own, rows, C);
  }
  void SumLosses(double* v, int n) override { if (sp_) sp_->SumLosses(v, n); }
  float ReplicatedGradScale() const override { return sp_ ? sp_->replicated_scale() : 1.f; }
  bool ExpertsRemote() const override { return ep_ != nullptr; }
  void ExpertsForward(int moe_block, const ExpertRows& rows, float* y) override { ep_->Forward(moe_block, rows, y); }
  void ExpertsBackward(int moe_block, const float* dy, float* dx) override { ep_->Backward(moe_block, dy, dx); }
  void BeforeStep(bool) override { zero_->BeforeStep(); }
  void BeforeBlockForward(int b) override { zero_->BeforeBlock(b); }
  void AfterBlockForward(int b) override { zero_->AfterBlockForward(b); }
  void BeforeBlockBackward(int b) override { zero_->BeforeBlock(b); }
  void AfterBlockBackward(int b) override { zero_->AfterBlockBackward(b); }
  void AfterBackward() override { zero_->AfterBackward(); }

 private:
  ZeroSync* zero_;
  ExpertParallel* ep_;
  TpRows* sp_;
};

}  // namespace myriad
