// The training step, the only one: a run's per-rank state -- the mesh, this
// rank's shard of the model, ZeRO gradient/parameter sync, expert, tensor,
// context and pipeline parallelism and the (sharded) AdamW state -- and the
// step, evaluation and checkpoint operations on them (docs/parallel.md).
// Every method is collective over the world.
//
// Single-device training is a world of one rank (comm::MakeSelfComm()):
// then the model runs without hooks, ZeRO is stage 0 and no collective or
// copy is issued on the step's path -- the same arithmetic as a model, its
// gradients and AdamW with nothing around them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/loader.h"
#include "model/model.h"
#include "train/checkpoint/async_writer.h"
#include "train/checkpoint/checkpoint.h"
#include "train/comm/comm.h"
#include "train/comm/hierarchical.h"
#include "train/parallel/dist_hooks.h"
#include "train/parallel/mesh.h"
#include "train/parallel/pp/pipeline.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace myriad {

// What one optimizer step reports.
struct StepStats {
  LossParts loss;         // means over the global batch (total: what the gradient is of)
  double grad_norm = 0;   // global, before clipping
  double lr = 0;
  std::vector<std::vector<int64_t>> expert_load;  // per MoE block, this step, every rank's tokens
  double max_imbalance = 0;  // max over blocks of max_load / mean_load
};

class DistTrainer {
 public:
  static Result<std::unique_ptr<DistTrainer>> Create(comm::Comm* world, const ModelConfig& mc,
                                                     const TrainConfig& tc);
  ~DistTrainer();

  Mesh& mesh() { return *mesh_; }
  // One rank: no collectives, no hooks (see above).
  bool solo() const { return mesh_->world().size() == 1; }
  Model& model() { return *model_; }
  bool is_root() const { return mesh_->rank() == 0; }
  int64_t micro_per_rank() const { return micro_; }

  // One optimizer step on the global batch `global` [A*B, T+1] (every rank
  // passes the same tokens; each takes its data rank's sequences). A*B is
  // train.grad_accum * train.batch_size of the config it was created with.
  // With `objective`, the head computes it in place of cross-entropy (the
  // model's HeadObjective: post-training), each micro-batch's rows with
  // their global sequence index in `global`; no pipeline (pp = 1).
  StepStats Step(const int32_t* global, int A, int B, int T, int64_t step, HeadObjective* objective = nullptr);
  // A forward only over this data rank's sequences of `global` (as Step
  // takes them) with `objective` on the head: each micro-batch's rows with
  // their global sequence index. No gradients, no optimizer; the expert
  // loads it counts are cleared. Post-training records the behaviour and
  // reference logprobs with it. No pipeline (pp = 1).
  void Forward(const int32_t* global, int A, int B, int T, HeadObjective* objective);
  // Mean main loss over `batches` validation batches (every rank the same
  // batches). Without a pipeline this is trainer.h's Evaluate on the model.
  EvalResult Evaluate(DataLoader& val, int B, int T, int64_t batches);
  // Collective: the state in the single-device checkpoint format (whole
  // tensors, Hugging Face names, whole optimizer moments) gathered into an
  // in-memory snapshot on rank 0, so it loads under any layout; nullptr on
  // the other ranks. Writing it is the caller's (AsyncCheckpointWriter).
  std::unique_ptr<CheckpointSnapshot> Snapshot(int64_t step, const nlohmann::json& meta);
  // Allocates (and faults in) the host buffers of one save now (rank 0: the
  // snapshot's; with more ranks also each rank's staging), so that the first
  // save's pause is a copy only, like every later one.
  void PrepareSnapshotBuffers();
  // Every rank copies its shard (and its optimizer slices) out of the
  // checkpoint's whole tensors: resharding onto this layout.
  Status Restore(const LoadedCheckpoint& ckpt, bool with_optimizer);
  // A whole tensor under our name (parameters and selection biases) with
  // its global shape, as fp32.
  using WholeTensorReader =
      std::function<Result<std::vector<float>>(const std::string& name, const std::vector<int64_t>& shape)>;
  // The same from any source of whole tensors (train.init_from: a Hugging
  // Face folder), with the optimizer's moments at zero.
  Status RestoreWeights(const WholeTensorReader& read_model);

  // Per-step communication figures (bytes sent by this rank, seconds).
  struct CommFigures {
    int64_t grad_bytes = 0, ep_bytes = 0, pp_bytes = 0, inter_node_bytes = 0, intra_node_bytes = 0;
    double exposed_s = 0, sync_s = 0;
    double bubble_theory = 0, bubble_measured = 0;  // pipeline: idle fraction, (P-1)/(M+P-1) and measured
    int64_t resident_peak = 0, local_params = 0;    // ZeRO-3: most parameter floats gathered at once, of all held
  };
  const CommFigures& last_comm() const { return comm_; }

 private:
  DistTrainer() = default;
  ShardPlan PlanFor(const Coords& c) const;
  // Restore's and RestoreWeights' loop; no optimizer reader: moments at zero.
  Status Load(const WholeTensorReader& read_model, const WholeTensorReader* read_optimizer);
  // The snapshot of whole tensors in the single-device layout; takes the
  // host vectors over (no copy: the snapshot holds one copy of the state).
  std::unique_ptr<CheckpointSnapshot> MakeSnapshot(int64_t step, const nlohmann::json& meta,
                                                   std::vector<float>&& params, std::vector<float>&& exp_avg,
                                                   std::vector<float>&& exp_avg_sq) const;
  std::shared_ptr<SnapshotBufferPool> snap_pool_ = std::make_shared<SnapshotBufferPool>();
  std::vector<int> stage_begin_;  // first layer of each pipeline stage (+ n_layers at the end)
  std::unique_ptr<comm::Comm> embed_owner_;
  comm::Comm* embed_group_ = nullptr;  // first and last pipeline stages (embedding copies)
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ZeroSync> zero_;
  std::unique_ptr<ExpertParallel> ep_;
  std::unique_ptr<TpRows> sp_;
  std::unique_ptr<ContextParallel> cp_;
  std::unique_ptr<Pipeline> pipe_;  // pp > 1
  comm::Comm* data_ = nullptr;  // ranks with different sequences (dp x ep)
  std::unique_ptr<DistHooks> hooks_;
  std::unique_ptr<comm::HierarchicalComm> hier_;  // hierarchical/compressed wrapper of dense_data, if any
  comm::Comm* grad_comm_ = nullptr;
  ModelConfig mc_;
  TrainConfig tc_;
  int64_t micro_ = 1;  // micro-batches per rank per step
  Buf<float> m_, v_;  // AdamW moments (device): flat (ZeRO 0) or packed owned slices
  CommFigures comm_;
  int64_t steps_done_ = 0;
};

}  // namespace myriad
