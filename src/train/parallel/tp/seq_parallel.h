// Tensor parallelism's communication: Megatron's column/row split of the
// attention and FFN weights (model/params.cc cuts them) with sequence
// parallelism -- the residual stream between them is split by rows over the
// tp ranks, gathered before each column-parallel projection and
// reduce-scattered after each row-parallel one.
#pragma once

#include <vector>

#include "model/buffer.h"
#include "model/shard.h"
#include "train/comm/comm.h"

namespace myriad {

class TpRows {
 public:
  explicit TpRows(comm::Comm* tp) : tp_(tp) {}
  // Rows [begin, end) of `rows` that rank r holds: contiguous, balanced
  // (the first rows % tp ranks hold one more).
  static RowRange Rows(int64_t rows, int tp, int r);
  RowRange OwnRows(int64_t rows) const { return Rows(rows, tp_->size(), tp_->rank()); }
  void Gather(const float* own, float* full, int64_t rows, int64_t C);
  void ReduceScatter(const float* full, float* own, int64_t rows, int64_t C);
  float replicated_scale() const { return 1.f / static_cast<float>(tp_->size()); }

 private:
  comm::Comm* tp_;
  Buf<float> send_, recv_;  // device
};

}  // namespace myriad
