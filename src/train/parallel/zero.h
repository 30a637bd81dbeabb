// Data parallelism with ZeRO stages 0-3 over the model's flat buffers.
//
// The parameters are cut into segments: runs of consecutive tensors of one
// block (or outside blocks) that share a replica group (dense tensors are
// replicated over dp*ep*cp, routed experts over dp*cp). Every segment is
// split evenly over its group (padded); rank r of the group owns slice r.
//   stage 0: gradients all-reduced; every rank updates everything.
//   stage 1: gradients all-reduced; each rank updates its slices (sharded
//            optimizer state) and the parameters are all-gathered.
//   stage 2: gradients reduce-scattered into the owned slices.
//   stage 3: as 2, and parameters live only as owned slices: each block's
//            are all-gathered before its forward and again before its
//            backward, and released after (pages returned to the OS).
// A block's gradient segments are reduced asynchronously as soon as its
// backward finishes, while earlier blocks' backward continues.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"
#include "train/comm/comm.h"
#include "train/parallel/mesh.h"

namespace myriad {

struct Segment {
  int64_t offset = 0, count = 0;  // in the flat buffer
  int block = -1;                 // -1: outside blocks
  bool expert = false;
  bool tp_split = false;          // a tensor-parallel shard (else replicated over tp)
  bool mirror = false;            // a copy of a tensor another pipeline stage also holds (embedding)
  comm::Comm* group = nullptr;
  int64_t shard = 0;              // ceil(count / group size)
  int64_t own_begin = 0, own_count = 0;  // owned slice, relative to offset
  int64_t packed = 0;             // offset of the owned slice in packed (shard-only) buffers
};

struct SyncStats {
  double wait_s = 0;          // time the step waited for gradient reduction (exposed)
  double reduce_sync_s = 0;   // time of the same reductions run synchronously (calibration step)
  int64_t bytes = 0;          // bytes sent by gradient/parameter collectives this step
  int64_t gathered_peak = 0;  // ZeRO-3: most parameter floats resident at once
};

class ZeroSync {
 public:
  // dense/expert: the replica groups; `grad_comm` may wrap them (hierarchy,
  // compression) for the gradient reduction of dense segments.
  // dense_rep: replicas of dense tensors that tensor parallelism does not
  // split (norms, router, embedding, head): dense plus the tp ranks.
  ZeroSync(Model* model, comm::Comm* dense, comm::Comm* expert, comm::Comm* dense_rep, int stage,
           comm::Comm* dense_grad_comm = nullptr);
  int stage() const { return stage_; }
  const std::vector<Segment>& segments() const { return segs_; }
  int64_t packed_size() const { return packed_; }

  // Reductions start only on the last micro-batch of a step.
  void set_reduce(bool on) { reduce_ = on; }
  // Run reductions synchronously (timing calibration) instead of async.
  void set_sync(bool on) { sync_ = on; }

  // Hooks (called by DistHooks).
  void BeforeStep();
  void BeforeBlock(int block);
  void AfterBlockForward(int block);
  void AfterBlockBackward(int block);
  void AfterBackward();

  // Waits for every reduction of the step. Afterwards stage 0/1 have the
  // summed gradients everywhere; stage 2/3 have them in grad_shard().
  void Finish();
  // Sum of squares of the gradients this rank owns (disjoint across the world).
  double OwnedGradSumSquares() const;
  // Calls fn(flat offset, count, packed offset) for each owned slice, split at
  // tensor boundaries (so each piece has one weight-decay setting); with
  // stage 0 the slices are the whole segments.
  void ForEachOwned(const std::function<void(int64_t off, int64_t n, int64_t packed, bool decay)>& fn) const;
  // Gradient values for an owned slice (flat offset off).
  const float* OwnedGrad(int64_t off, int64_t packed) const;
  // Master parameters for an owned slice (stage 3: the packed shard).
  float* OwnedParam(int64_t off, int64_t packed);
  // After the update: stage 1/2 all-gather the parameters; stage 3 keeps
  // its shards (blocks are gathered on use).
  void PublishParams();
  // Stage 3: gather every segment (for saving or evaluation) / release again.
  void GatherAll();
  void ReleaseAll();
  // Pipeline: the segment starting at `offset` is a copy of one on another
  // stage (the embedding on the last stage): left out of the gradient norm.
  void MarkMirror(int64_t offset);
  // Sums the (reduced) gradient of the segment starting at `offset` over
  // `group` (the first and last pipeline stages' copies of the embedding).
  void SumSegmentGrad(int64_t offset, comm::Comm* group);
  // Stage 3: after the full parameters were written into the model (a
  // restored checkpoint), take the owned slices as masters and release.
  void AdoptParams();
  // Zero the gradient buffers for the next step.
  void ZeroGrads();

  SyncStats& stats() { return stats_; }
  // Floats this object holds in device memory besides the model's own
  // parameters and gradients (shards, send and gather buffers), at most
  // what train/memory_estimate.h counts for them.
  int64_t HeldFloats() const;

 private:
  void Launch(Segment& s);
  void Gather(Segment& s);
  void Release(Segment& s);
  Model* model_;
  int stage_;
  bool reduce_ = true, sync_ = false;
  std::vector<Segment> segs_;
  std::vector<std::vector<int>> by_block_;  // block -> segment indices
  std::vector<int> outer_;                  // segments outside blocks
  int64_t packed_ = 0;
  Buf<float> grad_shard_, param_shard_;  // stage >= 2 / 3: packed (device)
  // Stage >= 2, per segment: the padded send buffer of its asynchronous
  // reduce-scatter (a copy of its gradient, alive until Finish).
  std::vector<Buf<float>> pad_;
  // The synchronous all-gathers (Gather, PublishParams), one segment at a
  // time: the largest padded segment, not a second copy of the parameters.
  Buf<float> gather_;
  std::vector<comm::Request> pending_;
  std::vector<bool> resident_;
  int64_t resident_floats_ = 0;
  comm::Comm* dense_ = nullptr;
  comm::Comm* dense_grad_comm_ = nullptr;
  SyncStats stats_;
};

}  // namespace myriad
