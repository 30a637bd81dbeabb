// The cost and memory models against hand-computed cases, parameter counts
// against the model's real layout, and the planner against brute force.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <numeric>

#include "model/params.h"
#include "plan/planner.h"
#include "core/rng.h"
#include "plan/report.h"

namespace myriad::plan {
namespace {

// 64 devices: nodes of 8 at 100 GB/s and 5 us, 10 GB/s and 20 us between them.
ClusterDesc TwoTier(int64_t devices = 64) {
  ClusterDesc c;
  c.name = "test";
  c.devices = devices;
  c.tiers = {{"node", 8, 100e9, 5e-6}, {"scaleout", devices, 10e9, 20e-6}};
  return c;
}

ModelConfig TinyDense() {
  ModelConfig m;
  m.vocab_size = 1000, m.d_model = 64, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 4, m.d_ff = 256;
  m.n_dense_layers = 2, m.n_routed_experts = 0, m.top_k = 0, m.tie_embeddings = false, m.max_seq_len = 128;
  return m;
}

ModelConfig SmallMoe() {
  ModelConfig m;
  m.vocab_size = 4096, m.d_model = 256, m.n_layers = 4, m.n_heads = 8, m.n_kv_heads = 4, m.d_ff = 1024;
  m.n_dense_layers = 1, m.n_routed_experts = 8, m.n_shared_experts = 1, m.top_k = 2, m.d_expert = 256;
  m.max_seq_len = 1024;
  return m;
}

TEST(PlanParams, CountsMatchTheModelsOwnLayout) {
  // The closed forms against the parameter layout Myriad trains with.
  ModelConfig dsa = SmallMoe();
  dsa.attention = "dsa", dsa.dsa_index_share = 2, dsa.mtp_depth = 1, dsa.tie_embeddings = true;
  ModelConfig dense_mtp = TinyDense();
  dense_mtp.mtp_depth = 2;
  for (const ModelConfig& m : {TinyDense(), SmallMoe(), dsa, dense_mtp}) {
    const ParamLayout layout(m);
    EXPECT_DOUBLE_EQ(CountParams(m).total, static_cast<double>(layout.total()));
  }
  // By hand: embedding 1000*64; per layer norms 2*64, q/k/v/o 4*64*64, FFN
  // 3*64*256; head 1000*64 + final norm 64.
  EXPECT_DOUBLE_EQ(CountParams(TinyDense()).total, 64000 + 2 * (128 + 16384 + 49152) + 64064);
  // Active: the unchosen experts (8 - 2 per MoE layer, 3 layers) are not.
  const ParamCounts p = CountParams(SmallMoe());
  EXPECT_DOUBLE_EQ(p.total - p.active, 3 * 6 * 3.0 * 256 * 256);
}

TEST(PlanCollectives, SpansFollowTheRankOrder) {
  const ClusterDesc c = TwoTier();
  EXPECT_EQ(SpanOf(c, {{1, 8}}).per_level, (std::vector<int64_t>{8, 1}));
  EXPECT_EQ(SpanOf(c, {{8, 8}}).per_level, (std::vector<int64_t>{1, 8}));
  EXPECT_EQ(SpanOf(c, {{2, 8}}).per_level, (std::vector<int64_t>{4, 2}));
  // Nested dims: 2 members 2 apart, then 4 members 16 apart.
  EXPECT_EQ(SpanOf(c, {{2, 2}, {16, 4}}).per_level, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(SpanOf(c, {{1, 1}}).size(), 1);
}

TEST(PlanCollectives, HandComputedTimes) {
  const ClusterDesc c = TwoTier();
  const double n = 1e9;
  // Ring in a node: 2 (7/8) n / 100 GB/s + 14 * 5 us.
  CollCost ar = AllReduce(c, {{8, 1}}, n);
  EXPECT_EQ(ar.algo, Algo::kRing);
  EXPECT_NEAR(ar.seconds, 2 * 7.0 / 8 * n / 100e9 + 14 * 5e-6, 1e-12);
  // 4 per node x 2 nodes: hierarchical = ring of 4 in the node on n, ring of
  // 2 across on n/4; beats a flat ring (0.175 s) and a tree (0.2 s).
  ar = AllReduce(c, {{4, 2}}, n);
  EXPECT_EQ(ar.algo, Algo::kHierarchical);
  EXPECT_NEAR(ar.seconds, (2 * 0.75 * n / 100e9 + 6 * 5e-6) + (2 * 0.5 * n / 4 / 10e9 + 2 * 20e-6), 1e-12);
  // Small messages across nodes: the tree's log latency wins.
  ar = AllReduce(c, {{1, 8}}, 8);
  EXPECT_EQ(ar.algo, Algo::kTree);
  EXPECT_NEAR(ar.seconds, 2 * 8 / 10e9 + 2 * 3 * 20e-6, 1e-15);
  // All-gather (and reduce-scatter): half a ring all-reduce.
  EXPECT_NEAR(AllGather(c, {{8, 1}}, n).seconds, 7.0 / 8 * n / 100e9 + 7 * 5e-6, 1e-12);
  // All-to-all over 4 x 2: 3/8 of the bytes in the node, 4/8 across; the
  // slower of the two plus 7 latencies of the outer tier.
  EXPECT_NEAR(AllToAll(c, {{4, 2}}, n).seconds, 0.5 * n / 10e9 + 7 * 20e-6, 1e-12);
  EXPECT_NEAR(AllToAll(c, {{4, 2}}, n, 1.5).seconds, 1.5 * 0.5 * n / 10e9 + 7 * 20e-6, 1e-12);
  EXPECT_NEAR(SendRecv(c, 4, n), n / 100e9 + 5e-6, 1e-12);
  EXPECT_NEAR(SendRecv(c, 8, n), n / 10e9 + 20e-6, 1e-12);
  EXPECT_EQ(AllReduce(c, {{1, 1}}, n).seconds, 0);
}

JobDesc TinyJob(int64_t seqs = 4) {
  JobDesc j;
  j.model = TinyDense();
  j.seq_len = 128;
  j.global_batch_tokens = seqs * 128;
  j.train_tokens = 1e9;
  return j;
}

// A device whose memory is so fast that only FLOPs take time.
ClusterDesc FlopBound(int64_t devices) {
  ClusterDesc c = TwoTier(devices);
  c.tiers = {{"node", devices, 1e18, 0}};
  c.device.peak_flops = 1e12;
  c.device.gemm_efficiency = c.device.attention_efficiency = 1;
  c.device.memory_bw = 1e18;
  c.device.memory_bytes = 1e12;
  return c;
}

TEST(PlanCost, SingleDeviceStepIsTheFlopsByHand) {
  // Per sequence of 128 tokens, forward: GEMMs per token and layer
  // 2*64*(4+8)*16 (qkv) + 2*64*64 (o) + 2*3*64*256 (FFN) = 131072, two
  // layers, plus the head 2*64*1000; causal attention 4 * (128*129/2) * 64
  // per layer. Backward: 2x the GEMMs, 2.5x the attention core.
  const double gemm = 128.0 * (2 * 131072 + 128000), attn = 2 * 4 * (128.0 * 129 / 2) * 64;
  const double per_seq = (3 * gemm + 3.5 * attn) / 1e12;
  const StepEstimate e = Estimate(TinyJob(4), FlopBound(1), Layout{});
  ASSERT_TRUE(e.feasible) << e.why;
  EXPECT_NEAR(e.step_s, 4 * per_seq, 1e-6 * e.step_s);
  EXPECT_EQ(e.microbatches, 4);
  // Forward FLOPs per token: the same count over 128 tokens, where "2 per
  // active parameter" also counts the five norm weights of 64 (2*2 + 1).
  EXPECT_NEAR(ForwardFlopsPerToken(TinyDense(), 128).total() * 128, gemm + attn + 128.0 * 2 * 5 * 64, 1e-9 * gemm);
}

// MLA priced by hand on the tiny model (q_lora 16, latent 32, nope 16 +
// rope 8, v 16): per layer the matrices q_a 16*64, q_b 96*16, kv_a 40*64,
// kv_b 128*32, o_proj 64*64 and the FFN 3*64*256 (62464 weights, 2 FLOPs
// each); the core 2 * (24 + 16) per head and causal pair.
TEST(PlanCost, MlaByHand) {
  JobDesc j = TinyJob(4);
  j.model.kv_lora_rank = 32, j.model.q_lora_rank = 16, j.model.qk_nope_head_dim = 16;
  j.model.qk_rope_head_dim = 8, j.model.v_head_dim = 16;
  ASSERT_TRUE(j.model.Validate().ok()) << j.model.Validate().message();
  const double gemm = 128.0 * (2 * 2 * 62464 + 128000), attn = 2 * 2 * (128.0 * 129 / 2) * 4 * 40;
  const StepEstimate e = Estimate(j, FlopBound(1), Layout{});
  ASSERT_TRUE(e.feasible) << e.why;
  EXPECT_NEAR(e.step_s, 4 * (3 * gemm + 3.5 * attn) / 1e12, 1e-6 * e.step_s);
  // The same count as the trainer's MFU (model/flops.h), which adds 2 per norm weight.
  const double norms = 2 * (2 * 64 + 16 + 32) + 64;
  EXPECT_NEAR(ForwardFlopsPerToken(j.model, 128).total() * 128, gemm + attn + 128.0 * 2 * norms, 1e-9 * gemm);
  // Serving: a latent row of 32 + 8 per layer, whole on every tp rank: 2
  // layers x 40 x 2 bytes = 160 B; GQA at equal width (4 kv heads of 16):
  // 512 B, and 256 B over tp 2.
  ClusterDesc c = FlopBound(2);
  c.device.memory_bytes = 1e6, c.device.usable_memory = 1;
  ServingMemory s = EstimateServing(j, c, 1);
  EXPECT_DOUBLE_EQ(s.kv_bytes_per_token, 160);
  EXPECT_DOUBLE_EQ(s.gqa_kv_bytes_per_token, 512);
  s = EstimateServing(j, c, 2);
  EXPECT_DOUBLE_EQ(s.kv_bytes_per_token, 160);
  EXPECT_DOUBLE_EQ(s.gqa_kv_bytes_per_token, 256);
}

TEST(PlanCost, PipelineBubbleIsStagesMinusOneStageTimes) {
  // Two identical stages (no head cost to speak of: a 2-token vocabulary),
  // m micro-batches: (m + 1) stage times; interleaving v halves the bubble.
  JobDesc j = TinyJob(8);
  j.model.vocab_size = 2;
  j.model.n_layers = j.model.n_dense_layers = 4;
  j.balance_stages = false;
  const ClusterDesc c = FlopBound(2);
  Layout one{1, 1, 1, 1, 1};
  const double t1 = Estimate(j, FlopBound(1), one).step_s;
  Layout two{1, 1, 2, 1, 1};
  const StepEstimate e = Estimate(j, c, two);
  ASSERT_TRUE(e.feasible) << e.why;
  const double stage = t1 / 8 / 2;
  EXPECT_NEAR(e.compute_s, 8 * stage, 1e-3 * t1);
  EXPECT_NEAR(e.bubble_s, 1 * stage, 1e-3 * t1);
  two.interleave = 2;
  EXPECT_NEAR(Estimate(j, c, two).bubble_s, 0.5 * stage, 1e-3 * t1);
}

// The data-parallel time of each ZeRO stage is the engine's collectives
// (train/parallel/zero.cc): stage 0 all-reduces the gradients, 1 all-reduces
// them and all-gathers the weights, 2 reduce-scatters and all-gathers, 3
// reduce-scatters (weights gathered per micro-batch, counted apart). So the
// all-gather is the same difference twice, and stage 2 never costs more
// time than 1 while holding more memory: it can win a plan only on time.
TEST(PlanMemory, ZeroStagesCostTheEnginesCollectives) {
  ClusterDesc c = TwoTier(2);
  JobDesc j = TinyJob(4);
  j.overlap_grad_reduce = false;  // the whole reduction exposed: dp_s is the collectives
  double dp[4], mem[4], z3[4];
  for (int z = 0; z <= 3; ++z) {
    Layout l{2, 1, 1, 1, 1};
    l.zero = z;
    const StepEstimate e = Estimate(j, c, l);
    ASSERT_TRUE(e.feasible) << e.why;
    dp[z] = e.dp_s, mem[z] = e.mem.total, z3[z] = e.zero3_s;
  }
  EXPECT_GT(dp[0], 0);
  EXPECT_NEAR(dp[1] - dp[0], dp[2] - dp[3], 1e-12 * dp[1]);  // one all-gather of the weights
  EXPECT_GT(dp[1], dp[2]);                                   // reduce-scatter < all-reduce
  EXPECT_GT(dp[0], dp[3]);
  EXPECT_GT(mem[2], mem[1]);  // the shard and the send copy on top of the whole gradient
  EXPECT_EQ(z3[2], 0);
  EXPECT_GT(z3[3], 0);
}

TEST(PlanMemory, HandComputedBreakdown) {
  // 259392 parameters on 2 data-parallel devices: bf16 weights (2 B),
  // fp32 gradients (4 B), Adam state (12 B), sharded by the ZeRO stage as
  // the engine shards them: the whole gradient stays at every stage, and
  // stage 2 adds the owned shard and the reduce-scatter's send copy.
  const double P = 259392;
  ClusterDesc c = FlopBound(2);
  for (int z = 0; z <= 3; ++z) {
    Layout l{2, 1, 1, 1, 1};
    l.zero = z;
    const StepEstimate e = Estimate(TinyJob(4), c, l);
    ASSERT_TRUE(e.feasible) << e.why;
    EXPECT_DOUBLE_EQ(e.mem.weights, P * 2 / (z >= 3 ? 2 : 1)) << z;
    EXPECT_DOUBLE_EQ(e.mem.grads, P * 4 + (z >= 2 ? P * 4 / 2 + P * 4 : 0)) << z;
    EXPECT_DOUBLE_EQ(e.mem.optimizer, P * 12 / (z >= 1 ? 2 : 1)) << z;
  }
  // Activations of one 128-token micro-batch per layer (bf16): attention
  // keeps the input and norm output (2*64), q, k, v and the output
  // (4*64); the FFN its input and norm output (2*64), gate, up and
  // activation (3*256): 128 * (384 + 896) * 2 bytes. Full recomputation
  // keeps each layer's input (128*64*2) and one layer's working set.
  const double layer = 128.0 * (384 + 896) * 2, input = 128.0 * 64 * 2;
  Layout l{2, 1, 1, 1, 1};
  EXPECT_DOUBLE_EQ(Estimate(TinyJob(4), c, l).mem.activations, 2 * layer);
  l.recompute = Recompute::kFull;
  EXPECT_DOUBLE_EQ(Estimate(TinyJob(4), c, l).mem.activations, 2 * input + layer);
  // Selective: the norm outputs and the FFN activation are recomputed.
  l.recompute = Recompute::kSelective;
  EXPECT_DOUBLE_EQ(Estimate(TinyJob(4), c, l).mem.activations, 2 * (layer - 128.0 * (64 + 256 + 64) * 2));
  // Too little memory: infeasible, with the figures.
  c.device.memory_bytes = 1e6;
  const StepEstimate small = Estimate(TinyJob(4), c, l);
  EXPECT_FALSE(small.feasible);
  EXPECT_NE(small.why.find("GB per device"), std::string::npos) << small.why;
}

TEST(PlanMemory, ServingKvByHand) {
  // Tiny dense model, bf16 weights: 259392 parameters; KV per token: 2
  // layers x (k, v) x 4 kv heads x 16 dims x 2 bytes = 512 B on one device;
  // two devices split the heads (tp 2): 256 B and half the weights.
  JobDesc j = TinyJob(4);
  ClusterDesc c = FlopBound(2);
  c.device.memory_bytes = 1e6, c.device.usable_memory = 1;
  ServingMemory s = EstimateServing(j, c, 1);
  EXPECT_EQ(s.tp, 1);
  EXPECT_DOUBLE_EQ(s.weights_per_device, 259392.0 * 2);
  EXPECT_DOUBLE_EQ(s.kv_bytes_per_token, 512);
  EXPECT_DOUBLE_EQ(s.kv_capacity_tokens, (1e6 - 259392.0 * 2) / 512);
  s = EstimateServing(j, c, 2);
  EXPECT_EQ(s.tp, 2);
  EXPECT_DOUBLE_EQ(s.weights_per_device, 259392.0);
  EXPECT_DOUBLE_EQ(s.kv_bytes_per_token, 256);
  // DSA: one indexer key of 32 floats per sharing group (2 layers share): +64 B.
  j.model.attention = "dsa", j.model.dsa_index_dim = 32, j.model.dsa_index_share = 2;
  EXPECT_DOUBLE_EQ(EstimateServing(j, c, 1).kv_bytes_per_token, 512 + 64);
  // Too little memory for the weights: does not fit; the smallest fitting count.
  c.device.memory_bytes = 4e5;
  EXPECT_FALSE(EstimateServing(JobDesc(TinyJob(4)), c, 1).fits);
  EXPECT_EQ(SmallestServing(TinyJob(4), c, 0.2).devices, 2);
}

TEST(PlanCost, PeakFollowsThePrecision) {
  // fp32 on a device that gives only a bf16 peak: no estimate, a clear reason.
  JobDesc j = TinyJob(4);
  ClusterDesc c = FlopBound(1);
  const double bf16 = Estimate(j, c, Layout{}).step_s;
  j.precision = "fp32";
  StepEstimate e = Estimate(j, c, Layout{});
  EXPECT_FALSE(e.feasible);
  EXPECT_NE(e.why.find("peak_tflops_fp32"), std::string::npos) << e.why;
  // With an fp32 peak a quarter of bf16's, the (FLOP-bound) step is 4x.
  c.device.peak_flops_fp32 = c.device.peak_flops / 4;
  e = Estimate(j, c, Layout{});
  ASSERT_TRUE(e.feasible) << e.why;
  EXPECT_NEAR(e.step_s, 4 * bf16, 1e-3 * e.step_s);
}

TEST(PlanCost, RulesOfTheLayout) {
  const JobDesc j = TinyJob(4);
  const ClusterDesc c = FlopBound(8);
  EXPECT_TRUE(CheckLayout(j, c, Layout{2, 4, 1, 1, 1}).ok());
  Status s = CheckLayout(j, c, Layout{1, 8, 1, 1, 1});
  EXPECT_NE(s.message().find("n_heads=4 is not divisible by tp=8"), std::string::npos) << s.message();
  s = CheckLayout(j, c, Layout{8, 1, 1, 1, 1});
  EXPECT_NE(s.message().find("sequences per step=4 is not divisible by dp*ep=8"), std::string::npos) << s.message();
  s = CheckLayout(j, c, Layout{1, 1, 1, 2, 4});
  EXPECT_NE(s.message().find("no routed experts"), std::string::npos) << s.message();
  s = CheckLayout(j, c, Layout{2, 2, 1, 1, 1});
  EXPECT_NE(s.message().find("but the cluster has 8"), std::string::npos) << s.message();
}

// DSA under tp: another engine's job may use it; a job for Myriad
// (job.myriad_limits, every training config) may not, with training's message.
TEST(PlanCost, MyriadLimitsRefuseDsaUnderTensorParallelism) {
  JobDesc j = TinyJob(4);
  j.model.attention = "dsa";
  j.model.dsa_topk = 16, j.model.dsa_index_heads = 2, j.model.dsa_index_dim = 16;
  ASSERT_TRUE(j.model.Validate().ok());
  const ClusterDesc c = FlopBound(8);
  EXPECT_TRUE(CheckLayout(j, c, Layout{2, 4, 1, 1, 1}).ok());
  j.myriad_limits = true;
  const Status s = CheckLayout(j, c, Layout{2, 4, 1, 1, 1});
  EXPECT_NE(s.message().find("tp=4: model.attention=\"dsa\" trains with data and expert parallelism only"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(CheckLayout(j, FlopBound(4), Layout{4, 1, 1, 1, 1}).ok());  // data parallelism is fine
}

// A plan for Myriad's trainer never wins through what the trainer does not
// implement: with memory so tight that only recomputation fits, another
// engine's plan recomputes, Myriad's finds nothing and says why; layouts
// that recompute or interleave are refused by name.
TEST(PlanSearch, MyriadPlansUseOnlyWhatTheTrainerImplements) {
  JobDesc j = TinyJob(8);
  SearchSpace s;
  s.interleave = {1, 2};
  ClusterDesc roomy = FlopBound(2);
  // The smallest memory any layout fits without recomputation, and a budget
  // just under it where recomputation still fits.
  double need_plain = 1e300, need_any = 1e300;
  for (const Layout& l : ParallelLayouts(j, roomy, s))
    for (int z = 0; z <= 3; ++z)
      for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        Layout x = l;
        x.zero = z, x.recompute = rc;
        const StepEstimate e = Estimate(j, roomy, x);
        if (!e.feasible) continue;
        need_any = std::min(need_any, e.mem.total);
        if (rc == Recompute::kNone) need_plain = std::min(need_plain, e.mem.total);
      }
  ASSERT_LT(need_any, need_plain);
  ClusterDesc tight = roomy;
  tight.device.memory_bytes = (need_any + need_plain) / 2 / tight.device.usable_memory;
  const PlanResult other = FindBest(j, tight, s);
  ASSERT_TRUE(other.found) << other.why;
  EXPECT_NE(other.layout.recompute, Recompute::kNone);
  j.myriad_limits = true;
  const PlanResult mine = FindBest(j, tight, s);
  EXPECT_FALSE(mine.found) << mine.layout.ToString();
  const PlanResult fits = FindBest(j, roomy, s);
  ASSERT_TRUE(fits.found) << fits.why;
  EXPECT_EQ(fits.layout.recompute, Recompute::kNone);
  EXPECT_EQ(fits.layout.interleave, 1);
  Layout rc{2, 1, 1, 1, 1};
  rc.recompute = Recompute::kFull;
  EXPECT_NE(CheckLayout(j, roomy, rc).message().find("does not recompute activations"), std::string::npos);
  JobDesc deep = j;
  deep.model.n_layers = 4;
  Layout v2{1, 1, 2, 1, 1};
  v2.interleave = 2;
  EXPECT_NE(CheckLayout(deep, roomy, v2).message().find("plain 1F1B"), std::string::npos)
      << CheckLayout(deep, roomy, v2).message();
}

TEST(PlanLayout, ParsesBothSpellings) {
  auto a = ParseLayout("dp=6,tp=8,pp=64,mb=2,zero=2,rc=full,v=2");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->ToString(), "dp6 tp8 pp64 ep1 cp1 mb2 zero2 rc=full v2");
  auto b = ParseLayout(a->ToString());
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->ToString(), a->ToString());
  for (const char* bad : {"dp=x", "foo=2", "rc=some", "dp"}) {
    auto r = ParseLayout(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("hint"), std::string::npos);
  }
}

TEST(PlanStages, BalanceMatchesExhaustivePartitions) {
  // Every contiguous split of L layers into P non-empty stages, by brute force.
  Rng rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t L = 3 + trial % 6, P = 1 + trial % std::min<int64_t>(L, 4);
    std::vector<double> t(L);
    for (auto& x : t) x = 1 + rng.Uniform() * 3;
    const double first = rng.Uniform() * 2, last = rng.Uniform() * 6;
    auto cost = [&](const std::vector<int64_t>& sizes) {
      double worst = 0;
      int64_t i = 0;
      for (size_t s = 0; s < sizes.size(); ++s) {
        double sum = (s == 0 ? first : 0) + (s + 1 == sizes.size() ? last : 0);
        for (int64_t k = 0; k < sizes[s]; ++k) sum += t[i++];
        worst = std::max(worst, sum);
      }
      return worst;
    };
    double best = 1e30;
    std::function<void(std::vector<int64_t>&, int64_t)> rec = [&](std::vector<int64_t>& sizes, int64_t left) {
      if (static_cast<int64_t>(sizes.size()) == P - 1) {
        sizes.push_back(left);
        best = std::min(best, cost(sizes));
        sizes.pop_back();
        return;
      }
      for (int64_t n = 1; n <= left - (P - 1 - static_cast<int64_t>(sizes.size())); ++n) {
        sizes.push_back(n);
        rec(sizes, left - n);
        sizes.pop_back();
      }
    };
    std::vector<int64_t> scratch;
    rec(scratch, L);
    const std::vector<int64_t> got = BalanceStages(t, first, last, P);
    ASSERT_EQ(static_cast<int64_t>(got.size()), P);
    EXPECT_EQ(std::accumulate(got.begin(), got.end(), int64_t{0}), L);
    for (int64_t n : got) EXPECT_GE(n, 1);
    EXPECT_NEAR(cost(got), best, 1e-6 * best) << "L=" << L << " P=" << P;
  }
}

JobDesc MoeJob() {
  JobDesc j;
  j.model = SmallMoe();
  j.seq_len = 1024;
  j.global_batch_tokens = 64 * 1024;
  j.train_tokens = 1e10;
  return j;
}

ClusterDesc SmallCluster(double memory_gb) {
  ClusterDesc c = ClusterPreset("a100", 16).value();
  c.device.memory_bytes = memory_gb * 1e9;
  return c;
}

void ExpectSameBest(const JobDesc& j, const ClusterDesc& c, const SearchSpace& s) {
  const PlanResult fast = FindBest(j, c, s);
  const PlanResult all = BruteForce(j, c, s);
  ASSERT_EQ(fast.found, all.found);
  if (!all.found) return;
  EXPECT_EQ(fast.layout.ToString(), all.layout.ToString());
  EXPECT_DOUBLE_EQ(fast.est.tokens_per_s, all.est.tokens_per_s);
  EXPECT_LE(fast.evaluated, all.evaluated);
}

TEST(PlanSearch, PrunedSearchFindsWhatBruteForceFinds) {
  SearchSpace s;
  s.micro_batches = {1, 2, 4, 8};
  s.interleave = {1, 2};
  for (double gb : {80.0, 0.05, 0.02, 0.012}) {  // from roomy to tight: pruning has to be right
    SCOPED_TRACE(gb);
    ExpectSameBest(MoeJob(), SmallCluster(gb), s);
  }
  // With idle nodes allowed, and a longer sequence with context parallelism.
  s.min_devices = 8;
  JobDesc j = MoeJob();
  j.seq_len = 4096;
  j.model.max_seq_len = 4096;
  ExpectSameBest(j, SmallCluster(0.03), s);
}

TEST(PlanSearch, MemoryPruningSkipsWork) {
  SearchSpace s;
  const PlanResult fast = FindBest(MoeJob(), SmallCluster(0.03), s);
  const PlanResult all = BruteForce(MoeJob(), SmallCluster(0.03), s);
  ASSERT_TRUE(all.found);
  EXPECT_LT(fast.evaluated, all.evaluated);
  // Nothing fits at all: the closest layout's shortfall is reported.
  const PlanResult none = FindBest(MoeJob(), SmallCluster(0.001), s);
  EXPECT_FALSE(none.found);
  EXPECT_NE(none.why.find("GB per device"), std::string::npos) << none.why;
}

TEST(PlanDynamic, PerBucketNeverLosesToStaticBeforeSwitching) {
  auto buckets = ParseBuckets("1024:0.5,4096:0.3,16384:0.2");
  ASSERT_TRUE(buckets.ok()) << buckets.status().message();
  JobDesc j = MoeJob();
  j.global_batch_tokens = 64 * 16384;
  SearchSpace s;
  s.micro_batches = {1, 2, 4};
  const DynamicPlan p = PlanDynamic(j, SmallCluster(0.2), s, *buckets, 1);
  ASSERT_TRUE(p.found) << p.why;
  ASSERT_EQ(p.buckets.size(), 3u);
  for (const auto& b : p.buckets) {
    EXPECT_TRUE(b.static_est.feasible);
    EXPECT_LE(b.dynamic_hours, b.static_hours * (1 + 1e-12)) << b.bucket.seq_len;
  }
  EXPECT_LE(p.dynamic_hours - p.switch_hours, p.static_hours * (1 + 1e-12));
  EXPECT_NEAR(p.static_hours, p.buckets[0].static_hours + p.buckets[1].static_hours + p.buckets[2].static_hours,
              1e-9 * p.static_hours);
  // The static layout is the best one: brute force over every candidate
  // (every micro-batch of every bucket, no pruning) finds none faster.
  double brute = 1e30;
  std::vector<JobDesc> jobs;
  for (const auto& b : *buckets) {
    JobDesc bj = j;
    bj.seq_len = b.seq_len;
    bj.model.max_seq_len = std::max(bj.model.max_seq_len, b.seq_len);
    bj.global_batch_tokens = j.global_batch_tokens / b.seq_len * b.seq_len;
    jobs.push_back(bj);
  }
  const ClusterDesc c = SmallCluster(0.2);
  for (const Layout& dims : ParallelLayouts(jobs.back(), c, s))
    for (int z : s.zero_stages)
      for (Recompute rc : s.recompute) {
        double hours = 0;
        for (size_t i = 0; i < jobs.size() && hours < 1e29; ++i) {
          double best = 0;
          for (int64_t mb : s.micro_batches) {
            Layout l = dims;
            l.zero = z, l.recompute = rc, l.micro_batch = mb;
            const StepEstimate e = Estimate(jobs[i], c, l);
            if (e.feasible) best = std::max(best, e.tokens_per_s);
          }
          hours += best > 0 ? j.train_tokens * (*buckets)[i].token_fraction / best / 3600 : 1e30;
        }
        brute = std::min(brute, hours);
      }
  EXPECT_NEAR(p.static_hours, brute, 1e-9 * brute);
  for (const char* bad : {"", "4096", "4096:-1", "x:0.5", "1024:0.5,,2048:1", "1024x:1"}) EXPECT_FALSE(ParseBuckets(bad).ok()) << bad;
}

TEST(PlanDesc, PresetsAndOverrides) {
  for (const std::string& name : ClusterPresetNames()) {
    auto c = ClusterPreset(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
  }
  auto doc = ConfigDoc::Parse("[cluster]\npreset = \"h100\"\ndevices = 64\n[cluster.device]\nmemory_gb = 141\n"
                              "[job]\nseq_len = 8192\nglobal_batch_tokens = 1048576\n"
                              "[model]\nd_model = 512\nn_heads = 8\nn_kv_heads = 8\n",
                              "t.toml");
  ASSERT_TRUE(doc.ok());
  auto c = ReadCluster(doc->get());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->device.memory_bytes, 141e9);
  EXPECT_DOUBLE_EQ(c->device.peak_flops, 989e12);
  EXPECT_EQ(c->tiers.back().size, 64);
  auto j = ReadJob(doc->get());
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ(j->seq_len, 8192);
  EXPECT_TRUE((*doc)->Finish().ok());
  // Clear errors.
  auto bad = [](const std::string& text) {
    auto d = ConfigDoc::Parse(text, "bad.toml");
    EXPECT_TRUE(d.ok());
    auto c = ReadCluster(d->get());
    if (!c.ok()) return c.status().message();
    auto j = ReadJob(d->get());
    return j.ok() ? std::string() : j.status().message();
  };
  EXPECT_NE(bad("[cluster]\npreset = \"tpu\"\n").find("unknown cluster preset 'tpu'"), std::string::npos);
  EXPECT_NE(bad("[cluster]\npreset = \"a100\"\ndevices = 12\n").find("is not a multiple of"),
            std::string::npos);
  EXPECT_NE(bad("[cluster]\ndevices = 16\n[cluster.node]\nsize = 8\n").find("add [cluster.scaleout]"),
            std::string::npos);
  EXPECT_NE(bad("[cluster]\npreset = \"a100\"\n[job]\nprecision = \"fp8\"\n").find(""), std::string::npos);
  EXPECT_NE(bad("[cluster]\npreset = \"a100\"\n[job]\nseq_len = 4096\nglobal_batch_tokens = 100\n")
                .find("less than one sequence"),
            std::string::npos);
}

// The published runs (configs/plan/*.toml) at their published layouts: the
// errors docs/planning.md states stay where they are.
TEST(PlanPublished, PredictionsStayNearThePublishedFigures) {
  const char* src = std::getenv("MYRIAD_SOURCE_DIR");
  ASSERT_NE(src, nullptr);
  struct Case {
    const char* file;
    const char* layout;
    double published;  // MFU or TFLOP/s per device
    bool megatron_count;
  };
  for (const Case& k : {Case{"megatron-1t", "dp=6,tp=8,pp=64,mb=1,zero=1,rc=full,v=2", 163e12, true},
                        Case{"megascale-175b", "dp=192,tp=8,pp=8,mb=1,zero=2,rc=none,v=6", 0.552, false},
                        Case{"llama3-405b", "dp=128,tp=8,pp=16,mb=1,zero=1,rc=none,v=4", 0.41, false}}) {
    auto doc = ConfigDoc::Load(std::string(src) + "/configs/plan/" + k.file + ".toml");
    ASSERT_TRUE(doc.ok()) << doc.status().message();
    auto c = ReadCluster(doc->get());
    auto j = ReadJob(doc->get());
    auto s = ReadSearchSpace(doc->get());
    ASSERT_TRUE(c.ok() && j.ok() && s.ok() && (*doc)->Finish().ok()) << k.file;
    const Layout l = ParseLayout(k.layout).value();
    const StepEstimate e = Estimate(*j, *c, l);
    ASSERT_GT(e.step_s, 0) << k.file << ": " << e.why;
    double predicted = e.mfu;
    if (k.megatron_count) {
      const ModelConfig& m = j->model;
      predicted = MegatronFlopsPerIteration(j->sequences(), j->seq_len, m.n_layers, m.d_model, m.vocab_size) /
                  e.step_s / c->devices;
    }
    const double err = predicted / k.published - 1;
    EXPECT_LT(std::abs(err), 0.25) << k.file << ": predicted " << predicted << " vs " << k.published;
  }
}

}  // namespace
}  // namespace myriad::plan
