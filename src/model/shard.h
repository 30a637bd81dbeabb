// How this rank's copy of the model is cut (docs/parallel.md). The model
// itself stays single-device: it runs with local sizes (heads, FFN width,
// experts) taken from LocalDims, and calls ParallelHooks where a parallel
// transform needs to act. With the defaults (ShardPlan{}, no hooks) it is
// exactly the single-device model.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "model/config.h"

namespace myriad {

struct ShardPlan {
  int tp = 1, tp_rank = 0;  // attention heads, FFN and expert widths split tp ways
  int ep = 1, ep_rank = 0;  // routed experts split ep ways (contiguous ranges)
  // Pipeline stage: main layers [layer_begin, layer_end) (-1: to the last).
  // The first stage embeds; the last holds the final norm, head and MTP
  // modules (and a copy of the embedding when those use it).
  int layer_begin = 0, layer_end = -1;
  bool first_stage = true, last_stage = true;
};

// Sizes of this rank's shard of each block.
struct LocalDims {
  int64_t H = 0, Hkv = 0;          // attention heads (query, key/value)
  int64_t F = 0;                   // dense FFN width
  int64_t Fe = 0;                  // routed expert width
  int64_t SF = 0;                  // shared experts' width (all shared experts together)
  int64_t E_begin = 0, E_local = 0;  // routed experts held here: [E_begin, E_begin + E_local)
  static LocalDims Of(const ModelConfig& c, const ShardPlan& p);
};

// Rows [begin, end) of a [rows, C] tensor owned by this rank.
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Permuted MoE rows handed to expert parallelism: x [M, C] grouped by global
// expert (expert e's rows are [offset[e], offset[e+1])).
struct ExpertRows {
  const float* x = nullptr;
  const int64_t* offset = nullptr;  // [E+1]
  int64_t M = 0, C = 0, E = 0;
};

// Where the model calls out to parallel transforms. Every method has the
// single-device behaviour as its default.
class ParallelHooks {
 public:
  virtual ~ParallelHooks() = default;

  // ---- Expert parallelism. When true, MoE blocks hand their permuted rows
  // to ExpertsForward/Backward instead of running the experts themselves.
  virtual bool ExpertsRemote() const { return false; }
  // y [M, C] (rows as in `rows`): each row through its expert, wherever that
  // expert lives. `moe_block` names the MoE block (for saved state).
  virtual void ExpertsForward(int moe_block, const ExpertRows& rows, float* y) {}
  // dy [M, C] -> dx [M, C] (writes), accumulating the local experts' grads.
  virtual void ExpertsBackward(int moe_block, const float* dy, float* dx) {}

  // ---- Tensor parallelism with sequence parallelism. The residual stream
  // is split by rows (tokens) over the tp ranks: norms, embedding, head and
  // loss run on this rank's rows; attention and FFN see all rows (gathered)
  // with this rank's heads/width and produce partial sums (reduce-scattered).
  virtual bool SeqParallel() const { return false; }
  // This rank's rows out of `rows` (contiguous; sizes may differ by one).
  virtual RowRange OwnRows(int64_t rows) const { return {0, rows}; }
  // own [OwnRows(rows), C] -> full [rows, C] (all-gather).
  virtual void GatherRows(const float* own, float* full, int64_t rows, int64_t C) {}
  // full [rows, C] partial sums -> own rows of the sum over ranks (reduce-scatter).
  virtual void ReduceScatterRows(const float* full, float* own, int64_t rows, int64_t C) {}
  // Loss terms computed on own rows only: summed over the tp and cp ranks in place.
  virtual void SumLosses(double* v, int n) {}
  // Gradient scale of terms every tp rank computes identically from gathered
  // values (the balance loss): 1/tp, so their sum over ranks counts once.
  virtual float ReplicatedGradScale() const { return 1.f; }

  // ---- Context parallelism: every rank of a cp group holds the same
  // sequences but only some of their positions (T / cp rows per sequence).
  // Main blocks' attention runs over the whole sequence through the hooks
  // (ring attention); MTP modules run on whole sequences gathered here.
  virtual int SeqShards() const { return 1; }
  // Global positions of this rank's T/cp rows of a sequence of length T.
  virtual void LocalPositions(int T, int32_t* pos) {}
  // Attention of block `block` (main layers only are sharded): true when
  // handled here, false to run the local kernel.
  virtual bool AttentionForward(int block, const AttentionParams& p) { return false; }
  virtual bool AttentionBackward(int block, const AttentionBackwardParams& p) { return false; }
  // Per-sequence statistics of a main MoE block's balance loss, summed over
  // the ranks holding parts of the same sequences.
  virtual void SumSeqStats(int block, double* v, int64_t n) {}
  // local [B, T/cp, C] -> whole sequences [B, T, C]; and whole-sequence
  // gradients summed over the cp ranks, keeping this rank's rows.
  virtual void GatherSeq(const float* local, float* full, int B, int T, int64_t C) {}
  virtual void ReduceScatterSeq(float* full, float* local, int B, int T, int64_t C) {}

  // ---- Pipeline parallelism: micro-batches in flight at once keep their
  // activations in separate slots; expert parallelism keeps its state per slot.
  virtual void SetSlot(int slot) {}

  // ---- Layer events, in execution order (block = layer index, or
  // n_layers + j for MTP module j). ZeRO-3 gathers parameters here;
  // data parallelism starts reducing a block's gradients once its backward
  // is done.
  virtual void BeforeBlockForward(int block) {}
  virtual void AfterBlockForward(int block) {}
  virtual void BeforeBlockBackward(int block) {}
  virtual void AfterBlockBackward(int block) {}
  // Before a Step's forward, and after its backward (the parameters outside
  // blocks -- embedding, final norm, head, MTP glue -- are used throughout).
  virtual void BeforeStep(bool backward) {}
  virtual void AfterBackward() {}
};

}  // namespace myriad
