// ParallelDims: the parallel layout of a training run -- the five degrees
// dp, tp, pp, ep, cp -- and the one validator of a layout against a model
// and a batch. It is the only layout type: training's [parallel] section
// (train/train_config.h: ParallelConfig) and the planner's candidates
// (plan/cost.h: plan::Layout) extend it with their own knobs, the Mesh
// (train/parallel/mesh.h) is built from it, and training, pre-flight and the
// planner all call Validate, so the planner proposes only layouts that
// training runs (docs/parallel.md, "The layout and its rules").
//
// It lives in model/ because that is the lowest module every user sees:
// plan/ depends on model/ only, train/ on model/ and parallel/. Its rules
// are the model's: what its shapes let each degree split (ShardPlan and
// LocalDims in model/shard.h are the cut it describes).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "model/config.h"

namespace myriad {

// What a layout splits besides the model, and the names errors give to it.
// Training fills it from [train] and [parallel] (TrainConfig::ValidateLayout),
// the planner from [job] and its candidate (plan::CheckLayout).
struct LayoutBatch {
  int64_t seq_len = 1;        // tokens per sequence
  int64_t sequences = 1;      // sequences per optimizer step, all data ranks together
  int64_t microbatches = 1;   // pipeline micro-batches per data rank (read when pp > 1)
  int64_t interleave = 1;     // model chunks per pipeline stage (Myriad's 1F1B: 1; the planner may try more)
  // Names in messages: the config key of each figure, and the prefix of the
  // degrees ("parallel." for training's keys, "" for the planner's layouts).
  std::string seq_len_key = "train.seq_len";
  std::string sequences_key = "global batch (train.batch_size*train.grad_accum)";
  std::string microbatches_key = "parallel.microbatches";
  std::string dims_prefix = "parallel.";
  // Myriad's own training runs the layout, so its implementation's limits
  // apply as well as the shapes' (today: DSA trains with dp and ep only).
  // The planner clears it for a job planned for another engine.
  bool myriad_limits = true;
};

struct ParallelDims {
  int dp = 1, tp = 1, pp = 1, ep = 1, cp = 1;
  int world() const { return dp * tp * pp * ep * cp; }
  bool trivial() const { return world() == 1; }
  // "dp2 x ep2", "single rank" for 1.
  std::string ToString() const;
  nlohmann::json ToJson() const;
  static Result<ParallelDims> FromJson(const nlohmann::json& j);

  // The one validator. Checks, in order, and names the first rule broken
  // with the keys and values involved and a hint:
  //   - every degree >= 1; world() == world_size (world_size 0: not checked);
  //   - tp divides model.n_heads, n_kv_heads, d_ff (when a dense FFN block
  //     exists) and d_expert (when routed experts exist; the shared experts'
  //     width is a multiple of it);
  //   - ep divides model.n_routed_experts, and ep == 1 without experts;
  //   - pp * interleave <= model.n_layers (every stage holds a layer);
  //     interleave > 1 only with pp > 1;
  //   - cp > 1: 2*cp divides seq_len (ring attention's load-balanced chunks);
  //   - dp*ep divides the sequences per step; with pp > 1, microbatches
  //     divides each data rank's sequences;
  //   - b.myriad_limits: model.attention = "dsa" trains under dp and ep
  //     only: tp, pp and cp must be 1. Why (Myriad's code as it is): the indexer's KL target is the
  //     head-averaged attention of all heads, which tp splits across ranks;
  //     sparse attention bypasses the context-parallel ring (each cp rank
  //     would attend to its own chunk only); and the pipeline schedule is
  //     untested with DSA, whose layers read the top-k indices their
  //     index-sharing group's first layer computed (a stage boundary may
  //     separate the two).
  //   - b.myriad_limits: MLA (model.kv_lora_rank > 0) trains without tp and
  //     cp: its projections are not split across tensor-parallel ranks and
  //     its attention does not run over the context-parallel ring.
  Status Validate(int world_size, const ModelConfig& m, const LayoutBatch& b) const;
};

}  // namespace myriad
