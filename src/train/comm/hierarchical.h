// HierarchicalComm: a Comm decorator that runs collectives in two levels,
// inside a node (fast links) and across nodes (slow links), and counts the
// bytes each level sends (docs/comm.md, "Hierarchical and compressed
// collectives").
//
// Layout: the flat comm's ranks are grouped into nodes (SplitNodes). The
// intra comm holds this rank's node; the inter comm holds the ranks with
// this rank's local index, one per node, ordered by node. Nodes must all have
// the same number of ranks.
//
// AllReduce (L ranks per node, N nodes, count elements):
//   1. intra reduce-scatter: local rank l gets shard l (ceil(count/L)
//      elements; the buffer is padded when L does not divide count),
//   2. inter all-reduce of the valid part of shard l among the N ranks with
//      local index l (compressed when HierOptions::inter.mode says so),
//   3. intra all-gather of the shards.
// Only 1/L of the buffer crosses nodes from each rank, and each rank's
// inter-node traffic runs in parallel with the other local ranks'.
// ReduceScatter and AllGather are two-level when ranks are numbered node by
// node (rank = node * L + local; always so with ranks_per_node > 0), with the
// inter stage on the 1/L-sized part; Broadcast is two-level always (across
// nodes among the root's local index, then inside each node). AllToAllV,
// point-to-point, Barrier and Split go to a private duplicate of the flat
// comm, their bytes attributed to intra or inter by destination.
//
// Threads: one caller thread, as for every Comm. Async collectives run in
// issue order on this object's progress thread; sync collectives wait for
// them first (at issue on the caller's thread under an MPI without
// MPI_THREAD_MULTIPLE: DecoratorAsyncInline in compressed.h). The flat comm is not used after construction (a private
// duplicate is), so the caller may keep using it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "train/comm/comm.h"
#include "train/comm/compressed.h"

namespace myriad::comm {

// Bytes this rank sent to ranks of its own node (intra) and of other nodes
// (inter), in the model of comm.h (CommStats) applied to each level's comm;
// for the compressed inter stage, the compressed payload.
struct HierStats {
  int64_t intra_bytes = 0;
  int64_t inter_bytes = 0;
  int64_t ops = 0;
  void Reset() { *this = HierStats{}; }
  HierStats& operator+=(const HierStats& o) {
    intra_bytes += o.intra_bytes;
    inter_bytes += o.inter_bytes;
    ops += o.ops;
    return *this;
  }
};

struct HierOptions {
  // > 0: node = rank / ranks_per_node (emulated nodes; must divide size).
  // 0: the ranks that share a machine (Comm::SplitShared).
  int ranks_per_node = 0;
  // Compression of the inter-node stage of float sum all-reduces; off
  // (Compression::kNone) by default.
  CompressionOptions inter;
};

// The communicator of this rank's node (see HierOptions::ranks_per_node).
// Collective over c. Throws std::invalid_argument when ranks_per_node does
// not divide c.size() (every rank throws; nothing was communicated).
std::unique_ptr<Comm> SplitNodes(Comm& c, int ranks_per_node);

class HierarchicalComm : public Comm {
 public:
  // Collective over flat, which is used only here (the object talks over
  // splits of it afterwards). Throws std::invalid_argument on a bad
  // ranks_per_node or nodes of different sizes.
  HierarchicalComm(Comm& flat, const HierOptions& opt);
  ~HierarchicalComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override;

  void AllReduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  // Float sum all-reduce whose compression residuals are named by `key`
  // rather than buf's address (see compressed.h, "Error feedback").
  void AllReduceKeyed(uint64_t key, float* buf, int64_t count);
  Request IAllReduceKeyed(uint64_t key, float* buf, int64_t count);
  void ReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) override;
  void AllGather(const void* send, void* recv, int64_t count, DType t) override;
  void AllToAllV(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                 void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                 DType t) override;
  void Broadcast(void* buf, int64_t count, DType t, int root) override;
  void Send(const void* buf, int64_t count, DType t, int dst, int tag) override;
  void Recv(void* buf, int64_t count, DType t, int src, int tag) override;
  void Barrier() override;

  Request IAllReduce(void* buf, int64_t count, DType t, ReduceOp op) override;
  Request IReduceScatter(const void* send, void* recv, int64_t count, DType t,
                         ReduceOp op) override;
  Request IAllGather(const void* send, void* recv, int64_t count, DType t) override;
  Request ISend(const void* buf, int64_t count, DType t, int dst, int tag) override;
  Request IRecv(void* buf, int64_t count, DType t, int src, int tag) override;

  // Splits of the (duplicated) flat comm; not hierarchical.
  std::unique_ptr<Comm> Split(int color, int key) override;
  std::unique_ptr<Comm> SplitShared() override;

  int node() const { return node_; }
  int num_nodes() const { return num_nodes_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  // True when rank == node * local_size + local_rank on every rank.
  bool node_major() const { return node_major_; }
  // Bytes of the op that completed last, since ResetStepStats, and since
  // construction. Safe to call while async ops run (they add on completion).
  HierStats last_op_stats() const;
  HierStats step_stats() const;
  HierStats total_stats() const;
  void ResetStepStats();
  // The inter-node stage's compressor (options, ForgetResiduals).
  CompressedComm& inter_compressor() { return *inter_; }
  Comm& intra() { return *intra_; }

 private:
  // Runs fn on this thread; its HierStats are what intra_ and inter_raw_
  // counted meanwhile plus `direct` (bytes sent over world_).
  void Run(const std::function<void()>& fn, HierStats direct = {});
  void Sync(const std::function<void()>& fn, HierStats direct = {});
  Request Async(std::function<void()> fn, HierStats direct = {});
  void Record(HierStats op, double seconds);
  HierStats FlatBlocks(int64_t count, DType t) const;
  void DoAllReduce(void* buf, int64_t count, DType t, ReduceOp op,
                   const CompressedComm::ResidualKey& key);
  void DoReduceScatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op);
  void DoAllGather(const void* send, void* recv, int64_t count, DType t);
  // Bytes of a message of `bytes` to world rank dst, by level.
  HierStats ToRank(int dst, int64_t bytes) const;

  std::unique_ptr<Comm> world_;      // private duplicate of the flat comm
  std::unique_ptr<Comm> intra_;      // this node
  std::unique_ptr<Comm> inter_raw_;  // same local rank, one per node
  std::unique_ptr<CompressedComm> inter_;
  int rank_ = 0, size_ = 1, node_ = 0, num_nodes_ = 1, local_rank_ = 0, local_size_ = 1;
  bool node_major_ = true;
  std::vector<int32_t> node_of_rank_, local_of_rank_;
  std::vector<uint8_t> pad_, shard_, gathered_;  // scratch, used by one op at a time

  mutable std::mutex stats_mu_;
  HierStats last_, step_, total_;
  ProgressQueue queue_;  // last member: stopped first
};

}  // namespace myriad::comm
