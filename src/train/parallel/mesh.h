// The Mesh of sub-communicators a parallel layout (ParallelDims, dp, tp,
// pp, ep, cp: model/parallel_dims.h) builds from the world communicator.
//
// World = dp * ep * cp * tp * pp ranks. Rank coordinates, innermost first:
//   rank = tp_r + tp * (cp_r + cp * (ep_r + ep * (dp_r + dp * pp_r)))
// so tensor-parallel partners are neighbours (same node first), and the
// pipeline is the outermost dimension. Expert parallelism is its own
// dimension: the ep ranks of a group see different data (like dp) and split
// the routed experts between them; dense parameters are replicated across
// dp * ep * cp, routed-expert parameters across dp * cp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/parallel_dims.h"
#include "train/comm/comm.h"

namespace myriad {

enum class Dim : unsigned { kTp = 1, kCp = 2, kEp = 4, kDp = 8, kPp = 16 };
inline unsigned operator|(Dim a, Dim b) { return static_cast<unsigned>(a) | static_cast<unsigned>(b); }
inline unsigned operator|(unsigned a, Dim b) { return a | static_cast<unsigned>(b); }

struct Coords {
  int tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;
};

class Mesh {
 public:
  // Collective over `world`: builds the sub-communicators it needs lazily
  // but in the same order on every rank (Group() is collective).
  Mesh(comm::Comm* world, const ParallelDims& dims);
  const ParallelDims& dims() const { return dims_; }
  const Coords& coords() const { return coords_; }
  comm::Comm& world() { return *world_; }
  int rank() const { return world_->rank(); }

  // The communicator of the ranks that differ only in the dims of `mask`
  // (e.g. Dim::kTp, or Dim::kDp | Dim::kEp | Dim::kCp), ordered by their
  // coordinates innermost first. Collective over the world on first use;
  // call it in the same order on every rank.
  comm::Comm& Group(unsigned mask);
  comm::Comm& tp() { return Group(static_cast<unsigned>(Dim::kTp)); }
  comm::Comm& cp() { return Group(static_cast<unsigned>(Dim::kCp)); }
  comm::Comm& ep() { return Group(static_cast<unsigned>(Dim::kEp)); }
  comm::Comm& pp() { return Group(static_cast<unsigned>(Dim::kPp)); }
  // Ranks that hold replicas of dense (non-expert) parameters.
  comm::Comm& dense_data() { return Group(Dim::kDp | Dim::kEp | Dim::kCp); }
  // Ranks that hold replicas of routed-expert parameters.
  comm::Comm& expert_data() { return Group(Dim::kDp | Dim::kCp); }
  // Ranks that see different sequences (the data-parallel degree for the loader).
  int data_rank() const { return coords_.ep + dims_.ep * coords_.dp; }
  int data_size() const { return dims_.ep * dims_.dp; }
  // World rank of the rank with these coordinates.
  int RankOf(const Coords& c) const;

 private:
  comm::Comm* world_;
  ParallelDims dims_;
  Coords coords_;
  std::map<unsigned, std::unique_ptr<comm::Comm>> groups_;
};

}  // namespace myriad
