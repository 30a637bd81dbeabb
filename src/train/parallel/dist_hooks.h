// The ParallelHooks the model sees in a distributed run: ZeRO events and
// expert parallelism, composed.
#pragma once

#include "model/shard.h"
#include "train/parallel/cp/context_parallel.h"
#include "train/parallel/ep/dispatch.h"
#include "train/parallel/tp/seq_parallel.h"
#include "train/parallel/zero.h"

namespace myriad {

class DistHooks : public ParallelHooks {
 public:
  // Any of ep, sp, cp may be null (that transform is off). `loss_group`
  // sums loss terms over the tp and cp ranks (null when both are 1).
  DistHooks(ZeroSync* zero, ExpertParallel* ep, TpRows* sp, ContextParallel* cp, comm::Comm* loss_group)
      : zero_(zero), ep_(ep), sp_(sp), cp_(cp), loss_group_(loss_group) {}
  int SeqShards() const override { return cp_ ? cp_->size() : 1; }
  void LocalPositions(int T, int32_t* pos) override { cp_->LocalPositions(T, pos); }
  bool AttentionForward(int block, const AttentionParams& p) override { return cp_ && cp_->AttentionForward(block, p); }
  bool AttentionBackward(int block, const AttentionBackwardParams& p) override {
    return cp_ && cp_->AttentionBackward(block, p);
  }
  void SumSeqStats(int, double* v, int64_t n) override { if (cp_) cp_->SumSeqStats(v, n); }
  void GatherSeq(const float* local, float* full, int B, int T, int64_t C) override { cp_->GatherSeq(local, full, B, T, C); }
  void ReduceScatterSeq(float* full, float* local, int B, int T, int64_t C) override {
    cp_->ReduceScatterSeq(full, local, B, T, C);
  }
  bool SeqParallel() const override { return sp_ != nullptr; }
  RowRange OwnRows(int64_t rows) const override { return sp_ ? sp_->OwnRows(rows) : RowRange{0, rows}; }
  void GatherRows(const float* own, float* full, int64_t rows, int64_t C) override { sp_->Gather(own, full, rows, C); }
  void ReduceScatterRows(const float* full, float* own, int64_t rows, int64_t C) override {
    sp_->ReduceScatter(full, own, rows, C);
  }
  void SumLosses(double* v, int n) override {
    if (loss_group_) loss_group_->AllReduce(v, n, comm::DType::kF64, comm::ReduceOp::kSum);
  }
  float ReplicatedGradScale() const override { return sp_ ? sp_->replicated_scale() : 1.f; }
  bool ExpertsRemote() const override { return ep_ != nullptr; }
  void SetSlot(int slot) override { if (ep_) ep_->set_slot(slot); }
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
  ContextParallel* cp_;
  comm::Comm* loss_group_;
};

}  // namespace myriad
