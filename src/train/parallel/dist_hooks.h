// The ParallelHooks the model sees in a distributed run: ZeRO events and
// expert parallelism, composed.
#pragma once

#include "model/shard.h"
#include "train/parallel/ep/dispatch.h"
#include "train/parallel/zero.h"

namespace myriad {

class DistHooks : public ParallelHooks {
 public:
  DistHooks(ZeroSync* zero, ExpertParallel* ep) : zero_(zero), ep_(ep) {}
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
};

}  // namespace myriad
