#include "train/parallel/cp/context_parallel.h"

#include "train/parallel/cp/ring_attention.h"

namespace myriad {

void ContextParallel::LocalPositions(int T, int32_t* pos) const { CpPositions(T, cp_->size(), cp_->rank(), pos); }

bool ContextParallel::AttentionForward(int block, const AttentionParams& p) {
  if (block >= n_layers_) return false;  // MTP modules see whole sequences
  RingAttentionForward(*cp_, p);
  return true;
}

bool ContextParallel::AttentionBackward(int block, const AttentionBackwardParams& p) {
  if (block >= n_layers_) return false;
  RingAttentionBackward(*cp_, p);
  return true;
}

void ContextParallel::GatherSeq(const float* local, float* full, int B, int T, int64_t C) {
  CpAllGather(*cp_, local, B, T, C, full);
}

void ContextParallel::ReduceScatterSeq(float* full, float* local, int B, int T, int64_t C) {
  cp_->AllReduce(full, static_cast<int64_t>(B) * T * C, comm::DType::kF32, comm::ReduceOp::kSum);
  CpScatter(full, local, B, T, C, cp_->size(), cp_->rank());
}

}  // namespace myriad
