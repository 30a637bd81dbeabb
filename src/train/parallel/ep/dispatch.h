// Expert parallelism: routed experts are split over the ep group (rank q
// holds experts [q*El, (q+1)*El)); the rows of a MoE block, permuted so each
// expert's rows are contiguous, travel to the ranks that hold their experts
// with one all-to-all-v, run there, and come back to their places with a
// second. Dropless: every row is sent, whatever the load.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model.h"
#include "model/shard.h"
#include "train/comm/comm.h"

namespace myriad {

// Who sends what to whom for one MoE block's forward (and its backward).
struct DispatchPlan {
  int ep = 1, rank = 0;
  int64_t E = 0, El = 0, C = 0;
  std::vector<int64_t> counts;        // [ep * E]: rows of (source rank, global expert)
  std::vector<int64_t> send_counts, send_displs, recv_counts, recv_displs;  // elements, per rank
  int64_t M = 0;                       // rows sent by this rank (= its permuted rows)
  int64_t R = 0;                       // rows received (for the local experts)
  // Received rows regrouped by local expert: row i of the grouped buffer is
  // row grouped_from[i] of the receive buffer; expert le's rows are
  // [local_offset[le], local_offset[le+1]).
  std::vector<int32_t> grouped_from;
  std::vector<int64_t> local_offset;   // [El + 1]
  // Device copies: grouped_from, and its inverse (receive row -> grouped row).
  Buf<int32_t> gather_idx, scatter_idx;
};

// Collective over `ep`: exchanges the per-expert counts and builds the plan.
DispatchPlan PlanDispatch(comm::Comm& ep, const ExpertRows& rows);
// rows [M, C] (grouped by global expert) -> local [R, C] grouped by local expert.
void DispatchRows(comm::Comm& ep, const DispatchPlan& p, const float* rows, float* local, Buf<float>* tmp);
// local [R, C] (grouped by local expert) -> rows [M, C] back in their places.
void CombineRows(comm::Comm& ep, const DispatchPlan& p, const float* local, float* rows, Buf<float>* tmp);

// ParallelHooks' expert half: runs this rank's experts on rows from every
// rank of the ep group. Keeps the forward's state per MoE block for backward.
class ExpertParallel {
 public:
  ExpertParallel(comm::Comm* ep, Model* model);
  void Forward(int moe_block, const ExpertRows& rows, float* y);
  void Backward(int moe_block, const float* dy, float* dx);
  // Rows this rank's experts processed in the last forward of each block.
  int64_t rows_in(int moe_block) const { return state_[slot_][moe_block].plan.R; }
  // Pipeline micro-batch slot whose state Forward/Backward use.
  void set_slot(int slot);

 private:
  struct State {
    DispatchPlan plan;
    Buf<float> x, gu, h;           // grouped by local expert (device)
  };
  comm::Comm* ep_;
  Model* model_;
  std::vector<int> block_of_moe_;  // moe block -> block index (layer, or L + j)
  std::vector<std::vector<State>> state_;  // [slot][moe block]
  int slot_ = 0;
  Buf<float> tmp_, ybuf_, dyl_, dh_, dgu_, dxl_;  // device
};

}  // namespace myriad
