#include "train/parallel/ep/dispatch.h"

#include <cstring>

#include "core/check.h"
#include "ops/ops.h"

namespace myriad {

DispatchPlan PlanDispatch(comm::Comm& ep, const ExpertRows& rows) {
  DispatchPlan p;
  p.ep = ep.size();
  p.rank = ep.rank();
  p.E = rows.E;
  p.C = rows.C;
  CHECK_MSG(p.E % p.ep == 0, "%lld experts do not split over %d ranks", static_cast<long long>(p.E), p.ep);
  p.El = p.E / p.ep;
  p.M = rows.M;
  std::vector<int64_t> mine(p.E);
  for (int64_t e = 0; e < p.E; ++e) mine[e] = rows.offset[e + 1] - rows.offset[e];
  p.counts.resize(static_cast<size_t>(p.ep) * p.E);
  ep.AllGather(mine.data(), p.counts.data(), p.E, comm::DType::kI64);
  p.send_counts.resize(p.ep); p.send_displs.resize(p.ep);
  p.recv_counts.resize(p.ep); p.recv_displs.resize(p.ep);
  int64_t rdispl = 0;
  for (int q = 0; q < p.ep; ++q) {
    const int64_t b = rows.offset[q * p.El], e = rows.offset[(q + 1) * p.El];
    p.send_displs[q] = b * p.C;
    p.send_counts[q] = (e - b) * p.C;
    int64_t n = 0;
    for (int64_t le = 0; le < p.El; ++le) n += p.counts[q * p.E + p.rank * p.El + le];
    p.recv_displs[q] = rdispl * p.C;
    p.recv_counts[q] = n * p.C;
    rdispl += n;
  }
  p.R = rdispl;
  // Regroup: receive buffer is [src][local expert][rows]; grouped is
  // [local expert][src][rows].
  p.local_offset.assign(p.El + 1, 0);
  std::vector<int64_t> src_start(static_cast<size_t>(p.ep) * p.El);
  for (int q = 0, row = 0; q < p.ep; ++q)
    for (int64_t le = 0; le < p.El; ++le) {
      src_start[q * p.El + le] = row;
      row += static_cast<int>(p.counts[q * p.E + p.rank * p.El + le]);
    }
  p.grouped_from.resize(p.R);
  int64_t g = 0;
  for (int64_t le = 0; le < p.El; ++le) {
    p.local_offset[le] = g;
    for (int q = 0; q < p.ep; ++q) {
      const int64_t n = p.counts[q * p.E + p.rank * p.El + le];
      for (int64_t i = 0; i < n; ++i) p.grouped_from[g++] = static_cast<int32_t>(src_start[q * p.El + le] + i);
    }
  }
  p.local_offset[p.El] = g;
  std::vector<int32_t> inv(p.R);
  for (int64_t i = 0; i < p.R; ++i) inv[p.grouped_from[i]] = static_cast<int32_t>(i);
  FromHost(&p.gather_idx, p.grouped_from);
  FromHost(&p.scatter_idx, inv);
  return p;
}

void DispatchRows(comm::Comm& ep, const DispatchPlan& p, const float* rows, float* local, Buf<float>* tmp) {
  tmp->resize(static_cast<size_t>(p.R) * p.C);
  ep.AllToAllV(rows, p.send_counts.data(), p.send_displs.data(), tmp->data(), p.recv_counts.data(),
               p.recv_displs.data(), comm::DType::kF32);
  if (p.R > 0) ops::MoeGather(tmp->data(), p.gather_idx.data(), p.R, p.C, local);
}

void CombineRows(comm::Comm& ep, const DispatchPlan& p, const float* local, float* rows, Buf<float>* tmp) {
  tmp->resize(static_cast<size_t>(p.R) * p.C);
  // Back to receive order: receive row j is grouped row scatter_idx[j].
  if (p.R > 0) ops::MoeGather(local, p.scatter_idx.data(), p.R, p.C, tmp->data());
  // The reverse exchange: what came from q goes back to q, into the rows q sent.
  ep.AllToAllV(tmp->data(), p.recv_counts.data(), p.recv_displs.data(), rows, p.send_counts.data(),
               p.send_displs.data(), comm::DType::kF32);
}

ExpertParallel::ExpertParallel(comm::Comm* ep, Model* model) : ep_(ep), model_(model) {
  const ModelConfig& c = model->config();
  for (int64_t l = 0; l < c.n_layers; ++l)
    if (c.is_moe_layer(l)) block_of_moe_.push_back(static_cast<int>(l));
  for (int64_t j = 0; j < c.mtp_depth; ++j)
    if (c.mtp_block_is_moe()) block_of_moe_.push_back(static_cast<int>(c.n_layers + j));
  state_.resize(1);
  state_[0].resize(block_of_moe_.size());
}

void ExpertParallel::set_slot(int slot) {
  while (slot >= static_cast<int>(state_.size())) {  // (State holds device buffers: move-only)
    state_.emplace_back();
    state_.back().resize(block_of_moe_.size());
  }
  slot_ = slot;
}

namespace {
template <typename P>
const BlockWeights<P>& BlockOf(const ModelWeights<P>& w, int block, int64_t L) {
  return block < L ? w.layers[block] : w.mtp[block - L].block;
}
}  // namespace

void ExpertParallel::Forward(int moe_block, const ExpertRows& rows, float* y) {
  State& s = state_[slot_][moe_block];
  const int64_t C = rows.C;
  const LocalDims& d = model_->layout().dims();
  const int64_t F = d.Fe;
  s.plan = PlanDispatch(*ep_, rows);
  const DispatchPlan& p = s.plan;
  s.x.resize(p.R * C); s.gu.resize(p.R * 2 * F); s.h.resize(p.R * F);
  DispatchRows(*ep_, p, rows.x, s.x.data(), &tmp_);
  ModelWeights<float*> W = model_->layout().Bind(model_->params());
  const auto& w = BlockOf(W, block_of_moe_[moe_block], model_->config().n_layers);
  ybuf_.resize(p.R * C);
  for (int64_t le = 0; le < p.El; ++le) {
    const int64_t o = p.local_offset[le], n = p.local_offset[le + 1] - o;
    if (n == 0) continue;
    ops::Linear(s.x.data() + o * C, w.e_gate[le], n, C, 2 * F, s.gu.data() + o * 2 * F);
    ops::SwiGlu(s.gu.data() + o * 2 * F, n, F, s.h.data() + o * F);
    ops::Linear(s.h.data() + o * F, w.e_down[le], n, F, C, ybuf_.data() + o * C);
  }
  CombineRows(*ep_, p, ybuf_.data(), y, &tmp_);
}

void ExpertParallel::Backward(int moe_block, const float* dy, float* dx) {
  State& s = state_[slot_][moe_block];
  const DispatchPlan& p = s.plan;
  const int64_t C = p.C, F = model_->layout().dims().Fe;
  dyl_.resize(p.R * C); dh_.resize(p.R * F); dgu_.resize(p.R * 2 * F); dxl_.resize(p.R * C);
  DispatchRows(*ep_, p, dy, dyl_.data(), &tmp_);
  ModelWeights<float*> W = model_->layout().Bind(model_->params());
  ModelWeights<float*> G = model_->layout().Bind(model_->grads());
  const int64_t L = model_->config().n_layers;
  const auto& w = BlockOf(W, block_of_moe_[moe_block], L);
  const auto& g = BlockOf(G, block_of_moe_[moe_block], L);
  for (int64_t le = 0; le < p.El; ++le) {
    const int64_t o = p.local_offset[le], n = p.local_offset[le + 1] - o;
    if (n == 0) continue;
    ops::LinearBackward(dyl_.data() + o * C, s.h.data() + o * F, w.e_down[le], n, F, C, dh_.data() + o * F,
                        false, g.e_down[le]);
    ops::SwiGluBackward(dh_.data() + o * F, s.gu.data() + o * 2 * F, n, F, dgu_.data() + o * 2 * F);
    ops::LinearBackward(dgu_.data() + o * 2 * F, s.x.data() + o * C, w.e_gate[le], n, C, 2 * F,
                        dxl_.data() + o * C, false, g.e_gate[le]);
  }
  CombineRows(*ep_, p, dxl_.data(), dx, &tmp_);
}

}  // namespace myriad
