// The single-device model: parameters in one flat buffer (ParamLayout), a
// forward that computes every loss of docs/model.md, and a hand-written
// backward that accumulates gradients into a buffer of the same layout.
// Not thread-safe: one Model serves one training loop.
#pragma once

#include <cstdint>
#include <vector>

#include "model/block.h"
#include "model/config.h"
#include "model/params.h"

namespace myriad {

// The loss terms of a step, the one record every path fills and every
// report reads (the trainer's metrics, sums over ranks and stages).
struct LossParts {
  double total = 0;   // main + mtp + aux: what the gradient is of
  double main = 0;    // next-token cross-entropy (nats/token)
  double mtp = 0;     // lambda/D * sum_k L_k
  double aux = 0;     // sum over MoE blocks of the balance loss
  double indexer = 0; // DSA: mean over indexer layers of their KL (not in total; backward only)

  // Every field with its metrics name ("loss", "loss_main", ...), in one
  // fixed order: f(name, member pointer).
  static constexpr int kCount = 5;
  template <class F>
  static void ForEachField(F&& f) {
    f("loss", &LossParts::total);
    f("loss_main", &LossParts::main);
    f("loss_mtp", &LossParts::mtp);
    f("loss_aux", &LossParts::aux);
    f("loss_indexer", &LossParts::indexer);
  }
  // this += w * o, field by field.
  void AddScaled(const LossParts& o, double w) {
    ForEachField([&](const char*, double LossParts::*m) { this->*m += w * (o.*m); });
  }
  // The fields as an array of kCount (to sum over ranks) and back.
  void ToArray(double* v) const {
    int i = 0;
    ForEachField([&](const char*, double LossParts::*m) { v[i++] = this->*m; });
  }
  void FromArray(const double* v) {
    int i = 0;
    ForEachField([&](const char*, double LossParts::*m) { this->*m = v[i++]; });
  }
};

// A per-token objective on the main head, in place of next-token
// cross-entropy (post-training: src/rl/objective.h). The model hands it the
// host copy of its head's logits for the rows this rank computes, with each
// row's sequence (global index: the sequence base given with it, plus the
// micro-batch row), position and next token; it returns the sum of its terms
// over those rows, already weighted for the whole batch, and d(that sum) /
// d(logits). A step with an objective runs no MTP module.
class HeadObjective {
 public:
  virtual ~HeadObjective() = default;
  struct Rows {
    int64_t n = 0, vocab = 0;
    const int64_t* seq = nullptr;    // [n] global sequence index
    const int32_t* pos = nullptr;    // [n] input position t (the row predicts token t+1)
    const int32_t* target = nullptr; // [n] token t+1
  };
  // logits [n, vocab] (host); dlogits [n, vocab] (host, zeroed) to add the
  // gradient into, or null without backward. Called from the model's thread, one call per forward.
  virtual double Apply(const Rows& rows, const float* logits, float* dlogits) = 0;
};

class Model {
 public:
  // `plan` cuts the model for tensor/expert parallelism (ShardPlan{}: whole).
  explicit Model(const ModelConfig& cfg, const ShardPlan& plan = {});
  // Parallel transforms plug in here (null: single device). Not owned.
  void set_hooks(ParallelHooks* h) { hooks_ = h; }
  // DSA: attend densely (and train the indexers on the dense distribution),
  // the warm-up stage; otherwise each query attends to its top-k keys.
  void set_dsa_dense(bool dense) { dsa_dense_ = dense; }

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  // Parameters and gradients: one flat fp32 buffer each (layout() places
  // every tensor), in device memory. The host reads and writes them only
  // through the copies below.
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  float* grads() { return grads_.data(); }
  const float* grads() const { return grads_.data(); }
  int64_t num_params() const { return static_cast<int64_t>(params_.size()); }
  std::vector<float> ParamsToHost() const;
  void ParamsToHost(std::vector<float>* out) const;  // into *out, resized
  std::vector<float> GradsToHost() const;
  // params[offset, offset + n) = host[0, n).
  void ParamsFromHost(const float* host, int64_t offset, int64_t n);
  // Selection bias of each MoE block (main layers in order, then MTP blocks):
  // host data, the master copy; each forward copies it to the device.
  std::vector<std::vector<float>>& biases() { return biases_; }
  const std::vector<std::vector<float>>& biases() const { return biases_; }
  int num_moe_blocks() const { return static_cast<int>(biases_.size()); }

  // Normal(0, init_std) matrices, ones for norms, zero biases; deterministic:
  // each tensor draws from its own stream (seed, name), so a shard of it gets
  // the same values as the whole model would.
  void InitWeights(uint64_t seed);
  void ZeroGrads();

  // Forward on tokens [B, T+1] (inputs are [:, :T], targets [:, 1:]). With
  // backward, accumulates the gradient of loss_scale * total into grads().
  // Expert loads are added to expert_load() either way.
  LossParts Step(const int32_t* tokens, int B, int T, bool backward, float loss_scale = 1.f);
  // The head objective of the following forwards (null: cross-entropy, and
  // the MTP modules), and the global index of their first sequence. With
  // one, LossParts::main is the objective's sum / loss_scale, so that the
  // gradient is still of loss_scale * total. Not owned.
  void set_head_objective(HeadObjective* objective, int64_t seq_base = 0) {
    objective_ = objective;
    objective_seq_base_ = seq_base;
  }

  // Main-head logits [B*T, V] of the last Step without backward (a host copy).
  std::vector<float> logits() const;
  // MTP module j's logits [B*(T-1-j), V] of the last Step without backward.
  std::vector<float> mtp_logits(int j) const;

  // ---- Pipeline stages. Step = StageForward + StageBackward on slot 0 of a
  // model that is one whole stage. A pipeline runs several micro-batches at
  // once, each in its own slot (set_slots). StageForward takes the previous
  // stage's activations (x_in; null on the first stage, which embeds) and
  // returns this stage's (null on the last stage, which computes the losses
  // into *loss). StageBackward takes d(output) (null on the last stage) and
  // returns d(input) (null on the first). Returned buffers stay valid until
  // the next call on the same slot.
  void set_slots(int n);
  // Floats of one boundary activation for B sequences of T tokens.
  int64_t BoundaryFloats(int B, int T) const;
  const float* StageForward(int slot, const int32_t* tokens, int B, int T, const float* x_in, bool backward,
                            float loss_scale, LossParts* loss);
  const float* StageBackward(int slot, const float* d_out, float loss_scale);

  // Assignments per expert of each MoE block since the last ClearExpertLoad.
  const std::vector<std::vector<int64_t>>& expert_load() const { return load_; }
  // Data parallelism sums the loads of every rank here before the update.
  std::vector<std::vector<int64_t>>& mutable_expert_load() { return load_; }
  void ClearExpertLoad();
  // Auxiliary-loss-free balancing: bias_i += rate * sign(mean - load_i) from
  // expert_load(), then clears it.
  void ApplyBiasUpdate();

  // RoPE tables up to max_seq_len (shared with inference sessions).
  const RopeTables& rope() const { return rope_; }
  const RopeTables& index_rope() const { return index_rope_; }  // DSA indexer (dsa_index_rope_dim)

  // DSA: this stage's share of the indexers' mean KL after StageBackward on
  // `slot` (the sum of its indexer layers' KL over the model's indexer
  // layer count: summed over the stages, the mean); 0 without DSA.
  double IndexerLoss(int slot) const;

 private:
  struct MtpActs {
    Buf<float> h_full;  // sequence parallelism: the previous level's output, all rows
    Buf<float> h_seq;   // context parallelism: the main output, whole sequences
    Buf<float> d_hin;   // d(h_in) of the own rows
    Buf<float> h_in, hn, rstd_h, e, en, rstd_e, cat, hp, out, nrm, rstd_n, logits, losses;
    Buf<float> d_out, d_hp, d_cat, d_hn, d_en, d_e;  // backward scratch
    BlockActs block;
  };
  // Activations of one micro-batch.
  struct Slot {
    int B = 0, T = 0;
    const int32_t* tokens = nullptr;
    Buf<int32_t> inputs, targets, pos;  // device copies of this rank's token ids and positions
    std::vector<Buf<float>> resid;      // L+1 buffers [N, C] (this stage's range)
    std::vector<BlockActs> acts;
    Buf<float> final_norm, final_rstd, logits, losses;
    std::vector<MtpActs> mtp;
    std::vector<Buf<int32_t>> mtp_etok, mtp_tgt;  // embedded tokens and targets of each MTP module
    std::vector<Buf<int32_t>> mtp_pos;            // RoPE positions of each MTP module's rows
    int mtp_run = 0;                              // MTP modules this forward ran (0 with an objective)
  };
  BlockContext Context(int block_index, const int32_t* pos);
  BlockContext MainContext(int layer, Slot& slot);  // + the DSA group of a main layer
  bool dsa_dense_ = false;
  HeadObjective* objective_ = nullptr;
  int64_t objective_seq_base_ = 0;

  ModelConfig cfg_;
  ParamLayout layout_;
  ParallelHooks* hooks_ = nullptr;
  Buf<float> params_, grads_;  // device
  std::vector<std::vector<float>> biases_;
  std::vector<Buf<float>> bias_dev_;  // their device copies (refreshed by each forward)
  std::vector<int> bias_index_;  // per block (layers, then MTP): index into biases_ or -1
  std::vector<std::vector<int64_t>> load_;
  RopeTables rope_, index_rope_;

  std::vector<Slot> slots_;
  int l0_ = 0, l1_ = 0;  // this stage's main layers
  BlockScratch scratch_;
  Buf<float> d_resid_a_, d_resid_b_, d_chain_;
  Buf<float> d_tmp_;  // sized for the main head and each MTP module in turn
  Buf<float> d_seq_;  // context parallelism: the MTP chain's gradient at this rank's positions
};

}  // namespace myriad
