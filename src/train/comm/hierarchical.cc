#include "train/comm/hierarchical.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "core/check.h"

namespace myriad::comm {

std::unique_ptr<Comm> SplitNodes(Comm& c, int ranks_per_node) {
  if (ranks_per_node <= 0) return c.SplitShared();
  if (c.size() % ranks_per_node != 0) {
    throw std::invalid_argument(
        "[comm] ranks_per_node " + std::to_string(ranks_per_node) + " does not divide the " +
        std::to_string(c.size()) + " ranks of " + c.name() +
        "; hint: use a divisor of the rank count, or 0 for the ranks that share a machine");
  }
  return c.Split(c.rank() / ranks_per_node, c.rank());
}

HierarchicalComm::HierarchicalComm(Comm& flat, const HierOptions& opt) {
  world_ = flat.Split(0, flat.rank());
  rank_ = world_->rank();
  size_ = world_->size();
  intra_ = SplitNodes(*world_, opt.ranks_per_node);
  local_rank_ = intra_->rank();
  local_size_ = intra_->size();
  // Equal node sizes, checked before anything depends on them.
  int32_t sizes[2] = {local_size_, -local_size_};
  world_->AllReduce(sizes, 2, DType::kI32, ReduceOp::kMax);
  if (sizes[0] != -sizes[1]) {
    throw std::invalid_argument("[comm] nodes of " + flat.name() + " have between " +
                                std::to_string(-sizes[1]) + " and " + std::to_string(sizes[0]) +
                                " ranks; hierarchical collectives need equal nodes (hint: set "
                                "ranks_per_node, or start the same number of ranks per machine)");
  }
  // Nodes are numbered in the order of their lowest world rank, so every
  // local index sees the same node order.
  int32_t leader = rank_;
  intra_->AllReduce(&leader, 1, DType::kI32, ReduceOp::kMin);
  inter_raw_ = world_->Split(local_rank_, leader);
  node_ = inter_raw_->rank();
  num_nodes_ = inter_raw_->size();
  inter_ = std::make_unique<CompressedComm>(*inter_raw_, opt.inter);

  int32_t mine[2] = {node_, local_rank_};
  std::vector<int32_t> all(2 * static_cast<size_t>(size_));
  world_->AllGather(mine, all.data(), 2, DType::kI32);
  node_of_rank_.resize(size_);
  local_of_rank_.resize(size_);
  node_major_ = true;
  for (int r = 0; r < size_; ++r) {
    node_of_rank_[r] = all[2 * r];
    local_of_rank_[r] = all[2 * r + 1];
    node_major_ = node_major_ && r == node_of_rank_[r] * local_size_ + local_of_rank_[r];
  }
}

HierarchicalComm::~HierarchicalComm() { queue_.Stop(); }

std::string HierarchicalComm::name() const {
  std::string s = "hier " + std::to_string(num_nodes_) + "x" + std::to_string(local_size_);
  if (inter_->options().mode != Compression::kNone) {
    s += std::string(" inter ") + CompressionName(inter_->options().mode);
  }
  return s + " over " + world_->name();
}

// ---- Stats and queue discipline.

void HierarchicalComm::Run(const std::function<void()>& fn, HierStats direct) {
  const int64_t intra0 = intra_->stats().bytes_sent, inter0 = inter_raw_->stats().bytes_sent;
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  direct.intra_bytes += intra_->stats().bytes_sent - intra0;
  direct.inter_bytes += inter_raw_->stats().bytes_sent - inter0;
  Record(direct, dt);
}

void HierarchicalComm::Record(HierStats op, double seconds) {
  op.ops = 1;
  std::lock_guard<std::mutex> lock(stats_mu_);
  last_ = op;
  step_ += op;
  total_ += op;
  stats_.bytes_sent += op.intra_bytes + op.inter_bytes;
  stats_.ops += 1;
  stats_.seconds += seconds;
}

void HierarchicalComm::Sync(const std::function<void()>& fn, HierStats direct) {
  queue_.Drain();
  Run(fn, direct);
}

Request HierarchicalComm::Async(std::function<void()> fn, HierStats direct) {
  if (DecoratorAsyncInline()) {
    Sync(fn, direct);
    return Request();
  }
  auto state = std::make_shared<RequestState>();
  queue_.Enqueue([this, fn = std::move(fn), direct] { Run(fn, direct); }, state);
  return Request(std::move(state));
}

HierStats HierarchicalComm::last_op_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return last_;
}
HierStats HierarchicalComm::step_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return step_;
}
HierStats HierarchicalComm::total_stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return total_;
}
void HierarchicalComm::ResetStepStats() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  step_.Reset();
}

HierStats HierarchicalComm::ToRank(int dst, int64_t bytes) const {
  HierStats s;
  if (dst == rank_) return s;
  (node_of_rank_[dst] == node_ ? s.intra_bytes : s.inter_bytes) += bytes;
  return s;
}

// ---- The two-level collectives.

void HierarchicalComm::DoAllReduce(void* buf, int64_t count, DType t, ReduceOp op,
                                   const CompressedComm::ResidualKey& key) {
  if (count == 0) return;
  const int64_t es = static_cast<int64_t>(DTypeSize(t));
  const int64_t L = local_size_, l = local_rank_;
  auto inter_all_reduce = [&](void* p, int64_t n) {
    if (n == 0 || num_nodes_ == 1) return;
    if (t == DType::kF32 && op == ReduceOp::kSum) {
      inter_->AllReduceWithState(key, static_cast<float*>(p), n);
    } else {
      inter_->AllReduce(p, n, t, op);
    }
  };
  if (L == 1) {
    inter_all_reduce(buf, count);
    return;
  }
  const int64_t shard = (count + L - 1) / L;
  const int64_t valid = std::clamp<int64_t>(count - l * shard, 0, shard);
  uint8_t* full = static_cast<uint8_t*>(buf);
  if (count != L * shard) {  // pad to L equal shards (the tail is never read back)
    pad_.assign(static_cast<size_t>(L * shard * es), 0);
    std::memcpy(pad_.data(), buf, static_cast<size_t>(count * es));
    full = pad_.data();
  }
  shard_.resize(static_cast<size_t>(shard * es));
  intra_->ReduceScatter(full, shard_.data(), shard, t, op);
  // Every rank of the inter comm has this local index, hence this `valid`.
  inter_all_reduce(shard_.data(), valid);
  intra_->AllGather(shard_.data(), full, shard, t);
  if (full != buf) std::memcpy(buf, full, static_cast<size_t>(count * es));
}

// Blocks are numbered by world rank, b = node * L + local. Inside the node
// they are regrouped by local index first ([local][node]), so the intra
// stage leaves each rank the N blocks of its local index summed over its
// node, and only one block per node crosses nodes.
void HierarchicalComm::DoReduceScatter(const void* send, void* recv, int64_t count, DType t,
                                       ReduceOp op) {
  const size_t bb = static_cast<size_t>(count) * DTypeSize(t);
  const int L = local_size_, N = num_nodes_;
  pad_.resize(bb * L * N);
  const uint8_t* src = static_cast<const uint8_t*>(send);
  for (int k = 0; k < N; ++k) {
    for (int j = 0; j < L; ++j) {
      std::memcpy(pad_.data() + bb * (static_cast<size_t>(j) * N + k),
                  src + bb * (static_cast<size_t>(k) * L + j), bb);
    }
  }
  shard_.resize(bb * N);
  intra_->ReduceScatter(pad_.data(), shard_.data(), count * N, t, op);
  inter_raw_->ReduceScatter(shard_.data(), recv, count, t, op);
}

// The inverse: across nodes first (one block per node), then inside the
// node, then from [local][node] back to world-rank order. send is read only
// by the first stage and recv written only by the last, so they may alias.
void HierarchicalComm::DoAllGather(const void* send, void* recv, int64_t count, DType t) {
  const size_t bb = static_cast<size_t>(count) * DTypeSize(t);
  const int L = local_size_, N = num_nodes_;
  shard_.resize(bb * N);
  inter_raw_->AllGather(send, shard_.data(), count, t);
  gathered_.resize(bb * L * N);
  intra_->AllGather(shard_.data(), gathered_.data(), count * N, t);
  uint8_t* dst = static_cast<uint8_t*>(recv);
  for (int k = 0; k < N; ++k) {
    for (int j = 0; j < L; ++j) {
      std::memcpy(dst + bb * (static_cast<size_t>(k) * L + j),
                  gathered_.data() + bb * (static_cast<size_t>(j) * N + k), bb);
    }
  }
}

// ---- Public ops.

void HierarchicalComm::AllReduce(void* buf, int64_t count, DType t, ReduceOp op) {
  const auto key = CompressedComm::ResidualKey::Address(buf, count);
  Sync([&] { DoAllReduce(buf, count, t, op, key); });
}

Request HierarchicalComm::IAllReduce(void* buf, int64_t count, DType t, ReduceOp op) {
  const auto key = CompressedComm::ResidualKey::Address(buf, count);
  return Async([=, this] { DoAllReduce(buf, count, t, op, key); });
}

void HierarchicalComm::AllReduceKeyed(uint64_t key, float* buf, int64_t count) {
  const auto k = CompressedComm::ResidualKey::Named(key, count);
  Sync([&] { DoAllReduce(buf, count, DType::kF32, ReduceOp::kSum, k); });
}

Request HierarchicalComm::IAllReduceKeyed(uint64_t key, float* buf, int64_t count) {
  const auto k = CompressedComm::ResidualKey::Named(key, count);
  return Async([=, this] { DoAllReduce(buf, count, DType::kF32, ReduceOp::kSum, k); });
}

// Without node-major numbering ReduceScatter and AllGather run flat; each
// rank then sends one block to every other rank (comm.h's model), L-1 of
// them inside its node.
HierStats HierarchicalComm::FlatBlocks(int64_t count, DType t) const {
  const int64_t bb = count * static_cast<int64_t>(DTypeSize(t));
  return HierStats{(local_size_ - 1) * bb, (size_ - local_size_) * bb, 0};
}

void HierarchicalComm::ReduceScatter(const void* send, void* recv, int64_t count, DType t,
                                     ReduceOp op) {
  if (!node_major_) {
    Sync([&] { world_->ReduceScatter(send, recv, count, t, op); }, FlatBlocks(count, t));
    return;
  }
  Sync([&] { DoReduceScatter(send, recv, count, t, op); });
}

void HierarchicalComm::AllGather(const void* send, void* recv, int64_t count, DType t) {
  if (!node_major_) {
    Sync([&] { world_->AllGather(send, recv, count, t); }, FlatBlocks(count, t));
    return;
  }
  Sync([&] { DoAllGather(send, recv, count, t); });
}

Request HierarchicalComm::IReduceScatter(const void* send, void* recv, int64_t count, DType t,
                                         ReduceOp op) {
  if (!node_major_) {
    return Async([=, this] { world_->ReduceScatter(send, recv, count, t, op); },
                 FlatBlocks(count, t));
  }
  return Async([=, this] { DoReduceScatter(send, recv, count, t, op); });
}

Request HierarchicalComm::IAllGather(const void* send, void* recv, int64_t count, DType t) {
  if (!node_major_) {
    return Async([=, this] { world_->AllGather(send, recv, count, t); }, FlatBlocks(count, t));
  }
  return Async([=, this] { DoAllGather(send, recv, count, t); });
}

void HierarchicalComm::Broadcast(void* buf, int64_t count, DType t, int root) {
  CHECK_MSG(root >= 0 && root < size_, "[comm] Broadcast root %d outside [0, %d)", root, size_);
  const int root_node = node_of_rank_[root], root_local = local_of_rank_[root];
  Sync([&] {
    if (local_rank_ == root_local) inter_raw_->Broadcast(buf, count, t, root_node);
    intra_->Broadcast(buf, count, t, root_local);
  });
}

void HierarchicalComm::AllToAllV(const void* send, const int64_t* send_counts,
                                 const int64_t* send_displs, void* recv,
                                 const int64_t* recv_counts, const int64_t* recv_displs,
                                 DType t) {
  HierStats direct;
  for (int r = 0; r < size_; ++r) {
    direct += ToRank(r, send_counts[r] * static_cast<int64_t>(DTypeSize(t)));
  }
  Sync([&] { world_->AllToAllV(send, send_counts, send_displs, recv, recv_counts, recv_displs, t); },
       direct);
}

// Point-to-point ops neither wait for the queue (comm.h) nor read the level
// comms' counters, which the progress thread may be updating.
void HierarchicalComm::Send(const void* buf, int64_t count, DType t, int dst, int tag) {
  const auto t0 = std::chrono::steady_clock::now();
  world_->Send(buf, count, t, dst, tag);
  Record(ToRank(dst, count * static_cast<int64_t>(DTypeSize(t))),
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void HierarchicalComm::Recv(void* buf, int64_t count, DType t, int src, int tag) {
  const auto t0 = std::chrono::steady_clock::now();
  world_->Recv(buf, count, t, src, tag);
  Record(HierStats{}, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

Request HierarchicalComm::ISend(const void* buf, int64_t count, DType t, int dst, int tag) {
  Record(ToRank(dst, count * static_cast<int64_t>(DTypeSize(t))), 0);
  return world_->ISend(buf, count, t, dst, tag);
}

Request HierarchicalComm::IRecv(void* buf, int64_t count, DType t, int src, int tag) {
  Record(HierStats{}, 0);
  return world_->IRecv(buf, count, t, src, tag);
}

void HierarchicalComm::Barrier() {
  Sync([&] { world_->Barrier(); });
}

std::unique_ptr<Comm> HierarchicalComm::Split(int color, int key) {
  queue_.Drain();
  return world_->Split(color, key);
}

std::unique_ptr<Comm> HierarchicalComm::SplitShared() {
  queue_.Drain();
  return world_->SplitShared();
}

}  // namespace myriad::comm
