// Context parallelism: causal attention over a sequence split between the cp
// ranks of a communicator, by ring attention with a load-balanced layout
// (docs/parallel-cp.md).
//
// Layout. A sequence of T positions is cut into 2*cp chunks of
// C = T / (2*cp) positions; rank r holds chunks r and 2*cp-1-r, concatenated
// in that order, as its Tl = T / cp local rows. Pairing an early chunk with a
// late one gives every rank the same amount of causal work. Tensors are
// token-major, [B, T, X] full and [B, Tl, X] local, with the same local row
// order for every sequence of the batch.
//
// cp == 1 is the identity layout (any T) and plain attention.
// T % (2*cp) != 0 with cp > 1 is a caller bug (ParallelDims::Validate rejects
// such a train.seq_len): the functions here CHECK-fail with a message.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "train/comm/comm.h"

namespace myriad {

// pos[Tl] = the global positions (within a sequence) of `rank`'s local rows.
void CpPositions(int T, int cp, int rank, int32_t* pos);

// Byte-level row copies behind CpScatter / CpGather (row_bytes per position).
void CpScatterBytes(const void* full, void* local, int B, int T, int64_t row_bytes, int cp, int rank);
void CpGatherBytes(const void* local, void* full, int B, int T, int64_t row_bytes, int cp, int rank);

// local [B, Tl, X] = `rank`'s rows of full [B, T, X] (e.g. the trainer's
// input tokens and targets, X = 1).
template <typename E>
void CpScatter(const E* full, E* local, int B, int T, int64_t X, int cp, int rank) {
  CpScatterBytes(full, local, B, T, X * static_cast<int64_t>(sizeof(E)), cp, rank);
}
// Writes `rank`'s rows of full [B, T, X] from local [B, Tl, X]; the other
// rows are left untouched, so cp calls (one per rank) assemble the whole.
template <typename E>
void CpGather(const E* local, E* full, int B, int T, int64_t X, int cp, int rank) {
  CpGatherBytes(local, full, B, T, X * static_cast<int64_t>(sizeof(E)), cp, rank);
}
// Collective over `cp`: every rank gets the full [B, T, X] from all ranks'
// local [B, Tl, X].
void CpAllGather(comm::Comm& cp, const float* local, int B, int T, int64_t X, float* full);

// One attention call of the ring schedule: query rows [q_row0, q_row0+q_rows)
// of the local block against key rows [k_row0, k_row0+k_rows) of the visiting
// K/V block, causal (diagonal chunk pairs, same positions on both sides) or
// full (every key earlier than every query).
struct RingBlock {
  int q_row0 = 0, q_rows = 0, k_row0 = 0, k_rows = 0;
  bool causal = false;
  // (query, key) pairs this block scores: q*k when full, q(q+1)/2 when causal.
  int64_t pairs() const;
};

// The calls `rank` makes while holding the K/V of rank `src` (local rows of
// length Tl = T/cp each), following the chunk rule: key chunk later than the
// query chunk -> nothing; same chunk -> causal; earlier -> full. src == rank
// is one causal call over all Tl rows (local causal attention over the
// concatenation [r, 2cp-1-r] is exactly that rule); src < rank is the two
// query chunks against the visitor's first chunk; src > rank is the second
// query chunk against both visiting chunks. Every step scores 2*C*C pairs
// (2*C*C + C on the diagonal step), whatever the rank.
std::vector<RingBlock> RingStepBlocks(int T, int cp, int rank, int src);

// Forward. `local` describes this rank's rows: B, Tq == Tk == Tl = T / cp,
// H, Hkv, D, scale, causal == true, q [B,Tl,H,D], k, v [B,Tl,Hkv,D] (batch
// strides honoured), out and lse non-null. Writes out [B,Tl,H,D] and lse
// [B,H,Tl] equal (up to fp32 rounding) to rows CpPositions(...) of causal
// attention over the full sequence. Collective over `cp` (every rank calls it
// with the same shapes); blocking. K/V travel around the ring, cp-1 hops, the
// next transfer overlapping the current block's compute.
void RingAttentionForward(comm::Comm& cp, const AttentionParams& local);

// Backward. `local.fwd` as for the forward, with out and lse the forward's
// results (the global, merged ones); `local.dout` [B,Tl,H,D]. Writes dq,
// dk, dv for the local rows. K/V circulate again with dK/dV accumulators,
// which arrive back at their owners after cp hops. Requires a backend whose
// attention_bwd uses fwd.out and fwd.lse as given (the CPU flash kernels do;
// the scalar oracle in cpu/ref recomputes them and must not be active).
// Collective over `cp`; blocking.
void RingAttentionBackward(comm::Comm& cp, const AttentionBackwardParams& local);

}  // namespace myriad
