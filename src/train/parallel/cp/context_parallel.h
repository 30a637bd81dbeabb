// Context parallelism's side of ParallelHooks: this rank's positions of each
// sequence (two mirrored chunks, ring_attention.h), ring attention for the
// main layers, the balance loss's per-sequence sums, and whole-sequence
// gathers for the MTP modules.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "train/comm/comm.h"

namespace myriad {

class ContextParallel {
 public:
  ContextParallel(comm::Comm* cp, int n_layers) : cp_(cp), n_layers_(n_layers) {}
  int size() const { return cp_->size(); }
  void LocalPositions(int T, int32_t* pos) const;
  bool AttentionForward(int block, const AttentionParams& p);
  bool AttentionBackward(int block, const AttentionBackwardParams& p);
  void SumSeqStats(double* v, int64_t n) { cp_->AllReduce(v, n, comm::DType::kF64, comm::ReduceOp::kSum); }
  void GatherSeq(const float* local, float* full, int B, int T, int64_t C);
  void ReduceScatterSeq(float* full, float* local, int B, int T, int64_t C);

 private:
  comm::Comm* cp_;
  int n_layers_;
};

}  // namespace myriad
