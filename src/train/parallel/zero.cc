#include "train/parallel/zero.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "ops/ops.h"

namespace myriad {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ZeroSync::ZeroSync(Model* model, comm::Comm* dense, comm::Comm* expert, comm::Comm* dense_rep, int stage,
                   comm::Comm* dense_grad_comm)
    : model_(model), stage_(stage), dense_(dense), dense_grad_comm_(dense_grad_comm) {
  CHECK_MSG(stage >= 0 && stage <= 3, "ZeRO stage %d (expected 0-3)", stage);
  const auto& ps = model->layout().params();
  const bool tied = model->config().tie_embeddings;
  const int nblocks = static_cast<int>(model->config().n_layers + model->config().mtp_depth);
  by_block_.resize(nblocks);
  for (size_t i = 0; i < ps.size(); ++i) {
    const ParamInfo& p = ps[i];
    if (tied && p.name == "lm_head.weight") continue;  // aliases the embedding
    const bool ex = p.expert, split = p.tp_dim >= 0;
    if (!segs_.empty() && segs_.back().block == p.block && segs_.back().expert == ex &&
        segs_.back().tp_split == split &&
        segs_.back().offset + segs_.back().count == p.offset) {
      segs_.back().count += p.numel;
      continue;
    }
    Segment s;
    s.offset = p.offset;
    s.count = p.numel;
    s.block = p.block;
    s.expert = ex;
    s.tp_split = split;
    s.group = ex ? expert : (split ? dense : dense_rep);
    segs_.push_back(s);
  }
  for (size_t i = 0; i < segs_.size(); ++i) {
    Segment& s = segs_[i];
    const int g = s.group->size(), r = s.group->rank();
    s.shard = (s.count + g - 1) / g;
    s.own_begin = std::min<int64_t>(s.count, s.shard * r);
    s.own_count = std::min<int64_t>(s.count, s.own_begin + s.shard) - s.own_begin;
    s.packed = packed_;
    packed_ += s.shard;
    if (s.block >= 0) by_block_[s.block].push_back(static_cast<int>(i));
    else outer_.push_back(static_cast<int>(i));
  }
  pad_.resize(segs_.size());
  resident_.assign(segs_.size(), true);
  resident_floats_ = model->layout().total();
  if (stage_ >= 2) grad_shard_.zero(packed_);
  if (stage_ == 3) {
    // Keep only the owned slices as the master copy; release the rest.
    param_shard_.zero(packed_);
    for (size_t i = 0; i < segs_.size(); ++i) {
      Segment& s = segs_[i];
      ops::Copy(model->params() + s.offset + s.own_begin, s.own_count, param_shard_.data() + s.packed);
      Release(s);
      resident_[i] = false;
    }
    resident_floats_ = 0;
  }
}

void ZeroSync::Gather(Segment& s) {
  const int g = s.group->size();
  gather_.resize(static_cast<size_t>(s.shard) * g);
  // Each rank contributes its owned slice (padded to `shard`).
  Buf<float> mine;
  mine.zero(s.shard);
  ops::Copy(param_shard_.data() + s.packed, s.own_count, mine.data());
  s.group->AllGather(mine.data(), gather_.data(), s.shard, comm::DType::kF32);
  ops::Copy(gather_.data(), s.count, model_->params() + s.offset);
  const size_t i = &s - segs_.data();
  if (!resident_[i]) {
    resident_[i] = true;
    resident_floats_ += s.count;
    stats_.gathered_peak = std::max(stats_.gathered_peak, resident_floats_);
  }
}

void ZeroSync::Release(Segment& s) {
  const size_t i = &s - segs_.data();
  ops::Discard(model_->params() + s.offset, static_cast<size_t>(s.count) * sizeof(float));
  if (resident_[i]) {
    resident_[i] = false;
    resident_floats_ -= s.count;
  }
}

void ZeroSync::BeforeStep() {
  if (stage_ != 3) return;
  for (int i : outer_) if (!resident_[i]) Gather(segs_[i]);
}

void ZeroSync::BeforeBlock(int block) {
  if (stage_ != 3) return;
  for (int i : by_block_[block]) if (!resident_[i]) Gather(segs_[i]);
}

void ZeroSync::AfterBlockForward(int block) {
  if (stage_ != 3) return;
  for (int i : by_block_[block]) Release(segs_[i]);
}

void ZeroSync::Launch(Segment& s) {
  // A group of one has nothing to reduce (stages 0/1 keep the gradient in place).
  if (stage_ <= 1 && s.group->size() == 1) return;
  float* g = model_->grads() + s.offset;
  // The wrapper (hierarchy, compression) stands for the dense group.
  comm::Comm* c = (dense_grad_comm_ && s.group == dense_) ? dense_grad_comm_ : s.group;
  if (stage_ <= 1) {
    if (sync_) {
      double t0 = Now();
      c->AllReduce(g, s.count, comm::DType::kF32, comm::ReduceOp::kSum);
      stats_.reduce_sync_s += Now() - t0;
    } else {
      pending_.push_back(c->IAllReduce(g, s.count, comm::DType::kF32, comm::ReduceOp::kSum));
    }
    return;
  }
  const int gs = s.group->size();
  auto& pad = pad_[&s - segs_.data()];
  pad.zero(static_cast<size_t>(s.shard) * gs);
  ops::Copy(g, s.count, pad.data());
  float* out = grad_shard_.data() + s.packed;
  if (sync_) {
    double t0 = Now();
    s.group->ReduceScatter(pad.data(), out, s.shard, comm::DType::kF32, comm::ReduceOp::kSum);
    stats_.reduce_sync_s += Now() - t0;
  } else {
    pending_.push_back(s.group->IReduceScatter(pad.data(), out, s.shard, comm::DType::kF32, comm::ReduceOp::kSum));
  }
}

void ZeroSync::AfterBlockBackward(int block) {
  if (reduce_)
    for (int i : by_block_[block]) Launch(segs_[i]);
  if (stage_ == 3)
    for (int i : by_block_[block]) Release(segs_[i]);
}

void ZeroSync::AfterBackward() {
  if (reduce_)
    for (int i : outer_) Launch(segs_[i]);
}

void ZeroSync::Finish() {
  double t0 = Now();
  for (auto& r : pending_) r.Wait();
  pending_.clear();
  stats_.wait_s += Now() - t0;
}

double ZeroSync::OwnedGradSumSquares() const {
  double s = 0;
  for (const Segment& g : segs_) {
    if (g.own_count == 0 || g.mirror) continue;
    const float* p = stage_ >= 2 ? grad_shard_.data() + g.packed
                                 : model_->grads() + g.offset + g.own_begin;
    s += ops::SumSquares(p, g.own_count);
  }
  return s;
}

void ZeroSync::ForEachOwned(const std::function<void(int64_t, int64_t, int64_t, bool)>& fn) const {
  const auto& ps = model_->layout().params();
  for (const Segment& g : segs_) {
    int64_t b = g.offset + (stage_ == 0 ? 0 : g.own_begin);
    int64_t e = stage_ == 0 ? g.offset + g.count : b + g.own_count;
    // Split at tensor boundaries.
    for (const ParamInfo& p : ps) {
      int64_t lo = std::max(b, p.offset), hi = std::min(e, p.offset + p.numel);
      if (lo >= hi) continue;
      if (model_->config().tie_embeddings && p.name == "lm_head.weight") continue;
      fn(lo, hi - lo, g.packed + (lo - g.offset - g.own_begin), p.decay);
    }
  }
}

const float* ZeroSync::OwnedGrad(int64_t off, int64_t packed) const {
  return stage_ >= 2 ? grad_shard_.data() + packed : model_->grads() + off;
}

float* ZeroSync::OwnedParam(int64_t off, int64_t packed) {
  return stage_ == 3 ? param_shard_.data() + packed : model_->params() + off;
}

void ZeroSync::PublishParams() {
  if (stage_ == 3) {  // stale copies: gathered again on use
    for (Segment& s : segs_) Release(s);
    return;
  }
  if (stage_ == 0) return;
  for (Segment& s : segs_) {
    const int g = s.group->size();
    gather_.resize(static_cast<size_t>(s.shard) * g);
    Buf<float> mine;
    mine.zero(s.shard);
    ops::Copy(model_->params() + s.offset + s.own_begin, s.own_count, mine.data());
    s.group->AllGather(mine.data(), gather_.data(), s.shard, comm::DType::kF32);
    ops::Copy(gather_.data(), s.count, model_->params() + s.offset);
  }
}

void ZeroSync::GatherAll() {
  if (stage_ != 3) return;
  for (Segment& s : segs_) if (!resident_[&s - segs_.data()]) Gather(s);
}

void ZeroSync::ReleaseAll() {
  if (stage_ != 3) return;
  for (Segment& s : segs_) Release(s);
}

void ZeroSync::MarkMirror(int64_t offset) {
  for (Segment& s : segs_) if (s.offset == offset) s.mirror = true;
}

void ZeroSync::SumSegmentGrad(int64_t offset, comm::Comm* group) {
  for (Segment& s : segs_) {
    if (s.offset != offset) continue;
    if (stage_ >= 2) {
      group->AllReduce(grad_shard_.data() + s.packed, s.own_count, comm::DType::kF32, comm::ReduceOp::kSum);
    } else {
      group->AllReduce(model_->grads() + s.offset, s.count, comm::DType::kF32, comm::ReduceOp::kSum);
    }
  }
}

void ZeroSync::AdoptParams() {
  if (stage_ != 3) return;
  for (size_t i = 0; i < segs_.size(); ++i) {
    Segment& s = segs_[i];
    ops::Copy(model_->params() + s.offset + s.own_begin, s.own_count, param_shard_.data() + s.packed);
    resident_[i] = true;
    Release(s);
  }
}

int64_t ZeroSync::HeldFloats() const {
  int64_t n = static_cast<int64_t>(grad_shard_.capacity() + param_shard_.capacity() + gather_.capacity());
  for (const auto& p : pad_) n += static_cast<int64_t>(p.capacity());
  return n;
}

void ZeroSync::ZeroGrads() {
  model_->ZeroGrads();
  ops::Zero(grad_shard_.data(), static_cast<int64_t>(grad_shard_.size()));
}

}  // namespace myriad
