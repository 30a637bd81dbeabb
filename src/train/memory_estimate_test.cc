// The memory estimate shared by `myriad train` and pre-flight, and the check
// of it against the memory a machine has.
#include "train/memory_estimate.h"

#include <gtest/gtest.h>

#include "model/model.h"
#include "model/params.h"
#include "train/comm/local_comm.h"
#include "train/parallel/zero.h"

namespace myriad {
namespace {

ModelConfig BlockHeavyModel() {  // blocks dominate the embedding and head
  return ModelConfig{.vocab_size = 256, .d_model = 256, .n_layers = 4, .n_heads = 8, .n_kv_heads = 4, .d_ff = 1024,
                     .n_dense_layers = 1, .n_routed_experts = 8, .n_shared_experts = 1, .top_k = 2, .d_expert = 512};
}

TrainConfig Layout(int dp, int tp, int pp, int ep, int zero) {
  TrainConfig t;
  t.seq_len = 64;
  t.batch_size = 8;
  t.grad_accum = 1;
  t.parallel.dp = dp; t.parallel.tp = tp; t.parallel.pp = pp; t.parallel.ep = ep; t.parallel.zero = zero;
  return t;
}

TEST(MemoryEstimate, ZeroShardsOverDataParallelRanks) {
  const ModelConfig m = BlockHeavyModel();
  ASSERT_TRUE(m.Validate().ok());
  const MemoryEstimate one = EstimateRankMemory(m, Layout(1, 1, 1, 1, 1), 1);
  const MemoryEstimate z1 = EstimateRankMemory(m, Layout(4, 1, 1, 1, 1), 4);
  EXPECT_NEAR(static_cast<double>(z1.optimizer), one.optimizer / 4.0, 8.0);
  EXPECT_EQ(z1.params, one.params);  // ZeRO-1 keeps whole parameters and gradients
  EXPECT_EQ(z1.grads, one.grads);
  const MemoryEstimate z0 = EstimateRankMemory(m, Layout(4, 1, 1, 1, 0), 4);
  EXPECT_EQ(one.optimizer, 2 * one.params);  // AdamW: two moments per parameter
  EXPECT_EQ(z0.optimizer, one.optimizer);
  // ZeRO-2 keeps the model's whole gradient (micro-batches accumulate into
  // it), adds the owned shard and the reduce-scatter's send copy: it saves
  // communication, not gradient memory (ZeroSyncHoldsWhatTheEstimateCounts).
  const MemoryEstimate z2 = EstimateRankMemory(m, Layout(4, 1, 1, 1, 2), 4);
  EXPECT_NEAR(static_cast<double>(z2.grads), one.grads * 2.25, 8.0);
  EXPECT_EQ(z2.params, one.params);
  EXPECT_EQ(z2.optimizer, z1.optimizer);
  const MemoryEstimate z3 = EstimateRankMemory(m, Layout(4, 1, 1, 1, 3), 4);
  EXPECT_LT(z3.params, one.params * 0.7);  // a quarter, plus one gathered block (an MoE layer: ~30%)
  EXPECT_GT(z3.params, one.params / 4);
  // A trivial [parallel] with several ranks counts them as data parallelism.
  EXPECT_EQ(EstimateRankMemory(m, Layout(1, 1, 1, 1, 1), 4).optimizer, z1.optimizer);
  // Data parallelism splits the batch: fewer activations per rank.
  EXPECT_LT(z1.activations, one.activations);
  EXPECT_EQ(one.total, one.params + one.grads + one.optimizer + one.activations + one.checkpoint + one.buffers);
}

// The oracle is the engine itself: two in-process ranks run ZeroSync's
// reduction and parameter all-gather over a real model at each stage, and
// what it then holds besides the model's own parameters and gradients must
// be what the estimate adds for ZeRO, up to its upper bounds (the staging
// buffer counted as the largest block, segments padded to the group).
TEST(MemoryEstimate, ZeroSyncHoldsWhatTheEstimateCounts) {
  const ModelConfig m = BlockHeavyModel();
  for (int zero : {1, 2}) {
    const MemoryEstimate est = EstimateRankMemory(m, Layout(2, 1, 1, 1, zero), 2);
    const MemoryEstimate z0 = EstimateRankMemory(m, Layout(2, 1, 1, 1, 0), 2);
    int64_t held = -1, model_floats = 0;
    comm::RunLocalRanks(2, [&](comm::Comm& c) {
      Model model(m);
      model.InitWeights(7);
      ZeroSync z(&model, &c, &c, &c, zero);
      z.BeforeStep();
      for (int b = m.n_layers - 1; b >= 0; --b) z.AfterBlockBackward(b);
      z.AfterBackward();
      z.Finish();
      z.PublishParams();
      if (c.rank() == 0) held = z.HeldFloats(), model_floats = model.layout().total();
    });
    ASSERT_GE(held, 0);
    // What ZeRO adds to the parameters, gradients and buffers (z0: the
    // model's two whole buffers, nothing else).
    const int64_t added = (est.params + est.grads + est.buffers) - (z0.params + z0.grads + z0.buffers);
    EXPECT_EQ(z0.params + z0.grads, 2 * 4 * model_floats);
    EXPECT_GE(added + 4 * 2 * 64, 4 * held) << "zero " << zero << ": the engine holds more than estimated";
    const double largest_block = 0.35 * static_cast<double>(model_floats);  // an MoE layer of this model
    EXPECT_LE(static_cast<double>(added - 4 * held), 4 * largest_block) << "zero " << zero;
  }
}

TEST(MemoryEstimate, TensorExpertAndPipelineParallelismSplitParameters) {
  const ModelConfig m = BlockHeavyModel();
  const MemoryEstimate one = EstimateRankMemory(m, Layout(1, 1, 1, 1, 1), 1);
  const MemoryEstimate tp2 = EstimateRankMemory(m, Layout(1, 2, 1, 1, 1), 2);
  const double ratio = static_cast<double>(tp2.params) / static_cast<double>(one.params);
  EXPECT_GT(ratio, 0.45);
  EXPECT_LT(ratio, 0.6);  // roughly half: norms, router, embedding and head stay whole
  EXPECT_LT(tp2.activations, one.activations);
  const MemoryEstimate ep2 = EstimateRankMemory(m, Layout(1, 1, 1, 2, 1), 2);
  EXPECT_LT(ep2.params, one.params * 0.7);  // experts are most of this model
  EXPECT_GT(ep2.params, one.params * 0.4);
  const MemoryEstimate pp2 = EstimateRankMemory(m, Layout(1, 1, 2, 1, 1), 2);
  EXPECT_LT(pp2.params, one.params * 0.7);
  // tp that does not divide the model (a layout error) still gives an estimate.
  const MemoryEstimate tp3 = EstimateRankMemory(m, Layout(1, 3, 1, 1, 1), 3);
  EXPECT_LT(tp3.params, one.params / 2);
  EXPECT_GT(tp3.params, 0);
}

TEST(MemoryEstimate, Formatting) {
  const MemoryEstimate one = EstimateRankMemory(BlockHeavyModel(), Layout(1, 1, 1, 1, 1), 1);
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.0 GiB");
  const std::string s = one.ToString();
  EXPECT_EQ(s.find("params "), 0u) << s;
  EXPECT_NE(s.find(" = total " + FormatBytes(one.total)), std::string::npos) << s;
}

TEST(MemoryEstimate, CheckpointCopiesAreCountedOnRankZero) {
  const ModelConfig m = BlockHeavyModel();
  const double P = static_cast<double>(ParamLayout(m).total());
  TrainConfig t = Layout(1, 1, 1, 1, 1);
  // One rank with the shared-memory copy: the host copies (12 P), two
  // snapshots (24 P) and three tmpfs copies (36 P).
  const MemoryEstimate shm = EstimateRankMemory(m, t, 1);
  EXPECT_NEAR(static_cast<double>(shm.checkpoint), 72 * P, 16);
  EXPECT_NEAR(static_cast<double>(shm.root_only), 60 * P, 16);
  t.snapshot_dir = "none";
  const MemoryEstimate disk = EstimateRankMemory(m, t, 1);
  EXPECT_NEAR(static_cast<double>(disk.checkpoint), 36 * P, 16);
  // Two ranks on a host: rank 0's copies once, the rest twice.
  EXPECT_EQ(disk.HostBytes(1), disk.total);
  EXPECT_EQ(disk.HostBytes(2), 2 * disk.total - disk.root_only);
  // The runtime's share is in every estimate, however small the model.
  EXPECT_GE(disk.buffers, int64_t{64} << 20);
}

TEST(MemoryEstimate, AbsurdSizesSaturateInsteadOfWrapping) {
  // Within every key's range, far beyond any machine: no part is negative.
  ModelConfig m;
  m.vocab_size = (int64_t{1} << 31) - 1;
  m.d_model = int64_t{1} << 20;
  m.n_layers = 2;
  m.n_heads = 8;
  m.n_kv_heads = 8;
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().message();
  TrainConfig t = Layout(1, 1, 1, 1, 1);
  t.batch_size = 1 << 20;
  t.seq_len = 1 << 14;
  m.max_seq_len = t.seq_len;
  const MemoryEstimate e = EstimateRankMemory(m, t, 1);
  for (int64_t part : {e.params, e.grads, e.optimizer, e.activations, e.checkpoint, e.buffers, e.total})
    EXPECT_GT(part, 0) << e.ToString();
  EXPECT_EQ(e.ToString().find('-'), std::string::npos) << e.ToString();
  EXPECT_GT(e.HostBytes(1 << 20), 0);
}

TEST(MemoryEstimate, ATooLargeConfigNamesItsLargestPartsAndTheirKeys) {
  ModelConfig m = BlockHeavyModel();
  TrainConfig t = Layout(1, 1, 1, 1, 1);
  const int64_t gib = int64_t{1} << 30;
  EXPECT_TRUE(CheckMemoryFits(EstimateRankMemory(m, t, 1), 1, 8 * gib).ok());
  EXPECT_TRUE(CheckMemoryFits(EstimateRankMemory(m, t, 1), 1, -1).ok());  // unknown: not compared

  // A vocabulary of 2e9: the embedding and head dominate the weights.
  ModelConfig big_vocab = m;
  big_vocab.vocab_size = 2000000000;
  Status s = CheckMemoryFits(EstimateRankMemory(big_vocab, t, 1), 1, 8 * gib);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("8.0 GiB available"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("largest: "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("lower model.vocab_size"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s.message();

  // A batch of 2^20 sequences: the activations.
  TrainConfig big_batch = t;
  big_batch.batch_size = 1 << 20;
  s = CheckMemoryFits(EstimateRankMemory(m, big_batch, 1), 1, 8 * gib);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("activations (hint: lower train.batch_size"), std::string::npos) << s.message();

  // 32 layers of width 65536: the blocks.
  ModelConfig wide = m;
  wide.d_model = 65536;
  wide.n_layers = 32;
  wide.n_routed_experts = 0;
  wide.n_dense_layers = 32;
  s = CheckMemoryFits(EstimateRankMemory(wide, t, 1), 1, 8 * gib);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("lower model.n_layers, model.d_model or model.d_ff"), std::string::npos) << s.message();
}

TEST(MemoryEstimate, TrainChecksThisMachine) {
  // The tiny model fits any machine that runs the tests; 2e9 tokens of
  // vocabulary fit none (tebibytes).
  ModelConfig m = BlockHeavyModel();
  TrainConfig t = Layout(1, 1, 1, 1, 1);
  EXPECT_TRUE(CheckRunMemory(m, t, nullptr).ok()) << CheckRunMemory(m, t, nullptr).message();
  m.vocab_size = 2000000000;
  const Status s = CheckRunMemory(m, t, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().find("memory: needs "), 0u) << s.message();
  EXPECT_GT(MemAvailableBytes(), 0);
}

}  // namespace
}  // namespace myriad
