// ParallelDims::Validate, the one layout validator: every error names the
// keys and values involved (training's keys, or the caller's), DSA's rules
// included.
#include "model/parallel_dims.h"

#include <gtest/gtest.h>

#include <string>

namespace myriad {
namespace {

ModelConfig TinyMoe() {
  ModelConfig c;
  c.vocab_size = 97; c.d_model = 32; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 64;
  c.n_dense_layers = 1; c.n_routed_experts = 4; c.n_shared_experts = 1; c.top_k = 2; c.d_expert = 32;
  c.max_seq_len = 64;
  return c;
}

ParallelDims Dims(int dp, int tp, int pp, int ep, int cp) {
  ParallelDims d;
  d.dp = dp; d.tp = tp; d.pp = pp; d.ep = ep; d.cp = cp;
  return d;
}

// The error of Validate with training's key names, or "" when it passes.
std::string ErrorOf(const ParallelDims& d, int world, const ModelConfig& m, int64_t batch = 8,
                    int64_t seq = 32, int64_t micro = 2) {
  LayoutBatch b;
  b.sequences = batch;
  b.seq_len = seq;
  b.microbatches = micro;
  Status s = d.Validate(world, m, b);
  return s.ok() ? "" : s.message();
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "'" << (msg) << "' lacks '" << (part) << "'"

TEST(ParallelDimsTest, ValidLayoutsPass) {
  const ModelConfig m = TinyMoe();
  EXPECT_EQ(ErrorOf(Dims(1, 1, 1, 1, 1), 1, m), "");
  EXPECT_EQ(ErrorOf(Dims(4, 1, 1, 1, 1), 4, m), "");
  EXPECT_EQ(ErrorOf(Dims(2, 1, 1, 2, 1), 4, m), "");
  EXPECT_EQ(ErrorOf(Dims(2, 1, 1, 4, 1), 8, m), "");
  EXPECT_EQ(ErrorOf(Dims(2, 2, 2, 1, 1), 8, m), "");
  EXPECT_EQ(ErrorOf(Dims(1, 1, 1, 1, 2), 2, m), "");
}

TEST(ParallelDimsTest, WorldMismatchNamesBothCounts) {
  const std::string e = ErrorOf(Dims(3, 1, 1, 1, 1), 4, TinyMoe());
  ASSERT_NE(e, "");
  EXPECT_HAS(e, "parallel");
  EXPECT_HAS(e, "dp3");
  EXPECT_HAS(e, "= 3");
  EXPECT_HAS(e, "4 ranks");
  const std::string e2 = ErrorOf(Dims(2, 1, 1, 2, 1), 8, TinyMoe());
  EXPECT_HAS(e2, "dp2 x ep2");
  EXPECT_HAS(e2, "8 ranks");
}

TEST(ParallelDimsTest, NonPositiveDimNamed) {
  const std::string e = ErrorOf(Dims(1, 0, 1, 1, 1), 0, TinyMoe());
  EXPECT_HAS(e, "tp=0");
  EXPECT_HAS(e, ">= 1");
}

TEST(ParallelDimsTest, HeadsNotDivisibleByTp) {
  const std::string e = ErrorOf(Dims(1, 3, 1, 1, 1), 3, TinyMoe());
  EXPECT_HAS(e, "model.n_heads=4");
  EXPECT_HAS(e, "parallel.tp=3");
  // Query heads split, key/value heads do not.
  ModelConfig m = TinyMoe();
  m.n_heads = 8; m.n_kv_heads = 2;
  m.d_model = 64;
  const std::string e2 = ErrorOf(Dims(1, 4, 1, 1, 1), 4, m);
  EXPECT_HAS(e2, "model.n_kv_heads=2");
  EXPECT_HAS(e2, "parallel.tp=4");
}

TEST(ParallelDimsTest, ExpertsNotDivisibleByEp) {
  const std::string e = ErrorOf(Dims(1, 1, 1, 3, 1), 3, TinyMoe(), 6);
  EXPECT_HAS(e, "model.n_routed_experts=4");
  EXPECT_HAS(e, "parallel.ep=3");
  ModelConfig dense = TinyMoe();
  dense.n_routed_experts = 0; dense.n_dense_layers = dense.n_layers;
  const std::string e2 = ErrorOf(Dims(1, 1, 1, 2, 1), 2, dense);
  EXPECT_HAS(e2, "parallel.ep=2");
  EXPECT_HAS(e2, "no routed experts");
}

TEST(ParallelDimsTest, SeqLenNotDivisibleByTwoCp) {
  const std::string e = ErrorOf(Dims(1, 1, 1, 1, 3), 3, TinyMoe(), 8, 32);
  EXPECT_HAS(e, "train.seq_len=32");
  EXPECT_HAS(e, "2*parallel.cp=6");
  EXPECT_EQ(ErrorOf(Dims(1, 1, 1, 1, 4), 4, TinyMoe(), 8, 32), "");
}

TEST(ParallelDimsTest, BatchNotDivisibleByDataRanks) {
  const std::string e = ErrorOf(Dims(3, 1, 1, 1, 1), 3, TinyMoe(), 8);
  EXPECT_HAS(e, "global batch");
  EXPECT_HAS(e, "=8");
  EXPECT_HAS(e, "dp*ep=3");
  const std::string e2 = ErrorOf(Dims(1, 1, 1, 4, 1), 4, TinyMoe(), 6);
  EXPECT_HAS(e2, "=6");
  EXPECT_HAS(e2, "dp*ep=4");
}

TEST(ParallelDimsTest, PipelineTooDeepAndMicrobatches) {
  const std::string e = ErrorOf(Dims(1, 1, 4, 1, 1), 4, TinyMoe());
  EXPECT_HAS(e, "parallel.pp=4");
  EXPECT_HAS(e, "model.n_layers=2");
  const std::string e2 = ErrorOf(Dims(2, 1, 2, 1, 1), 4, TinyMoe(), 8, 32, 3);
  EXPECT_HAS(e2, "parallel.microbatches=3");
}

TEST(ParallelDimsTest, ToStringAndJson) {
  EXPECT_EQ(Dims(1, 1, 1, 1, 1).ToString(), "single rank");
  EXPECT_EQ(Dims(2, 1, 1, 2, 1).ToString(), "dp2 x ep2");
  const ParallelDims d = Dims(2, 2, 2, 1, 1);
  auto back = ParallelDims::FromJson(d.ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dp, 2); EXPECT_EQ(back->tp, 2); EXPECT_EQ(back->pp, 2);
  EXPECT_EQ(back->ep, 1); EXPECT_EQ(back->cp, 1);
}

TEST(ParallelDimsTest, HintListsTheDegreesThatDivide) {
  const std::string e = ErrorOf(Dims(1, 3, 1, 1, 1), 3, TinyMoe());
  EXPECT_HAS(e, "values that divide 4: 1, 2, 4");
  const std::string e2 = ErrorOf(Dims(1, 1, 1, 3, 1), 3, TinyMoe(), 6);
  EXPECT_HAS(e2, "values that divide 4: 1, 2, 4");
}

TEST(ParallelDimsTest, WorldZeroIsNotChecked) {
  EXPECT_EQ(ErrorOf(Dims(2, 2, 1, 1, 1), 0, TinyMoe()), "");
  EXPECT_HAS(ErrorOf(Dims(2, 2, 1, 1, 1), 5, TinyMoe()), "5 ranks");
}

TEST(ParallelDimsTest, InterleaveNeedsPipelineAndLayers) {
  ModelConfig m = TinyMoe();
  m.n_layers = 4;
  LayoutBatch b;
  b.sequences = 8, b.seq_len = 32, b.microbatches = 4, b.interleave = 2;
  EXPECT_TRUE(Dims(1, 1, 2, 1, 1).Validate(2, m, b).ok());
  const Status no_pp = Dims(2, 1, 1, 1, 1).Validate(2, m, b);
  EXPECT_HAS(no_pp.message(), "interleave=2 needs parallel.pp > 1");
  b.interleave = 3;
  const Status deep = Dims(1, 1, 2, 1, 1).Validate(2, m, b);
  EXPECT_HAS(deep.message(), "parallel.pp=2 x interleave=3 exceeds model.n_layers=4");
}

// DSA trains under dp and ep only (dist_train.cc used to refuse the rest on
// its own, after pre-flight and the planner had accepted them).
TEST(ParallelDimsTest, DsaTrainsUnderDataAndExpertParallelismOnly) {
  ModelConfig m = TinyMoe();
  m.attention = "dsa";
  m.dsa_topk = 8; m.dsa_index_heads = 2; m.dsa_index_dim = 16;
  ASSERT_TRUE(m.Validate().ok());
  EXPECT_EQ(ErrorOf(Dims(2, 1, 1, 2, 1), 4, m), "");
  EXPECT_EQ(ErrorOf(Dims(4, 1, 1, 1, 1), 4, m), "");
  const std::string tp = ErrorOf(Dims(2, 2, 1, 1, 1), 4, m);
  EXPECT_HAS(tp, "parallel.tp=2");
  EXPECT_HAS(tp, "model.attention=\"dsa\"");
  EXPECT_HAS(tp, "all heads");
  EXPECT_HAS(tp, "hint: set parallel.tp, parallel.pp and parallel.cp to 1");
  const std::string pp = ErrorOf(Dims(2, 1, 2, 1, 1), 4, m);
  EXPECT_HAS(pp, "parallel.pp=2");
  EXPECT_HAS(pp, "pipeline");
  const std::string cp = ErrorOf(Dims(2, 1, 1, 1, 2), 4, m);
  EXPECT_HAS(cp, "parallel.cp=2");
  EXPECT_HAS(cp, "ring");
  // Every degree named at once, and the same layouts pass with dense attention.
  EXPECT_HAS(ErrorOf(Dims(1, 2, 2, 1, 2), 8, m), "parallel.tp=2, parallel.pp=2, parallel.cp=2");
  // Another engine's limits (the planner's [job] descriptions): the shapes' rules only.
  LayoutBatch any;
  any.sequences = 8, any.seq_len = 32, any.microbatches = 2, any.myriad_limits = false;
  EXPECT_TRUE(Dims(1, 2, 2, 1, 2).Validate(8, m, any).ok());
  m.attention = "dense";
  EXPECT_EQ(ErrorOf(Dims(1, 2, 2, 1, 2), 8, m), "");
}

TEST(ParallelDimsTest, MlaTrainsWithoutTensorAndContextParallelism) {
  ModelConfig m = TinyMoe();
  m.kv_lora_rank = 16; m.q_lora_rank = 12; m.qk_nope_head_dim = 8; m.qk_rope_head_dim = 4; m.v_head_dim = 8;
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().message();
  EXPECT_EQ(ErrorOf(Dims(2, 1, 2, 1, 1), 4, m), "");
  EXPECT_EQ(ErrorOf(Dims(2, 1, 1, 2, 1), 4, m), "");
  const std::string tp = ErrorOf(Dims(2, 2, 1, 1, 1), 4, m);
  EXPECT_HAS(tp, "parallel.tp=2: multi-head latent attention (model.kv_lora_rank > 0)");
  EXPECT_HAS(tp, "hint: set parallel.tp and parallel.cp to 1");
  EXPECT_HAS(ErrorOf(Dims(2, 1, 1, 1, 2), 4, m), "parallel.cp=2: multi-head latent attention");
  LayoutBatch any;  // the planner for another engine
  any.sequences = 8, any.seq_len = 32, any.microbatches = 2, any.myriad_limits = false;
  EXPECT_TRUE(Dims(1, 2, 1, 1, 2).Validate(4, m, any).ok());
}

TEST(ParallelDimsTest, PrefixAndKeysFollowTheCaller) {
  LayoutBatch b;
  b.sequences = 6, b.seq_len = 32;
  b.sequences_key = "sequences per step";
  b.dims_prefix = "";
  const Status s = Dims(4, 1, 1, 1, 1).Validate(0, TinyMoe(), b);
  EXPECT_HAS(s.message(), "sequences per step=6 is not divisible by dp*ep=4");
  const Status t = Dims(1, 3, 1, 1, 1).Validate(0, TinyMoe(), b);
  EXPECT_HAS(t.message(), "model.n_heads=4 is not divisible by tp=3");
}

}  // namespace
}  // namespace myriad
