#include "train/parallel/tp/seq_parallel.h"

#include <algorithm>
#include <cstring>

#include "ops/ops.h"

namespace myriad {

RowRange TpRows::Rows(int64_t rows, int tp, int r) {
  const int64_t base = rows / tp, rem = rows % tp;
  RowRange o;
  o.begin = r * base + std::min<int64_t>(r, rem);
  o.end = o.begin + base + (r < rem ? 1 : 0);
  return o;
}

// Ranks' row blocks differ by at most one row: collectives run on blocks
// padded to ceil(rows / tp).
void TpRows::Gather(const float* own, float* full, int64_t rows, int64_t C) {
  const int tp = tp_->size();
  const int64_t chunk = (rows + tp - 1) / tp;
  const RowRange me = OwnRows(rows);
  send_.zero(chunk * C);
  ops::Copy(own, me.size() * C, send_.data());
  recv_.resize(static_cast<size_t>(tp) * chunk * C);
  tp_->AllGather(send_.data(), recv_.data(), chunk * C, comm::DType::kF32);
  for (int q = 0; q < tp; ++q) {
    const RowRange r = Rows(rows, tp, q);
    ops::Copy(recv_.data() + q * chunk * C, r.size() * C, full + r.begin * C);
  }
}

void TpRows::ReduceScatter(const float* full, float* own, int64_t rows, int64_t C) {
  const int tp = tp_->size();
  const int64_t chunk = (rows + tp - 1) / tp;
  send_.zero(static_cast<size_t>(tp) * chunk * C);
  for (int q = 0; q < tp; ++q) {
    const RowRange r = Rows(rows, tp, q);
    ops::Copy(full + r.begin * C, r.size() * C, send_.data() + q * chunk * C);
  }
  recv_.resize(chunk * C);
  tp_->ReduceScatter(send_.data(), recv_.data(), chunk * C, comm::DType::kF32, comm::ReduceOp::kSum);
  ops::Copy(recv_.data(), OwnRows(rows).size() * C, own);
}

}  // namespace myriad
