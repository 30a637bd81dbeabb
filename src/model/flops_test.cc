// FLOPs per token against closed forms worked out by hand for tiny models
// (dense and DSA), and the parameter counts against the real layout.
#include "model/flops.h"

#include <gtest/gtest.h>

#include "model/params.h"

namespace myriad {
namespace {

// V=10, C=8, one layer, 2 heads of 4 (one kv head), dense FFN 16, untied.
ModelConfig Tiny() {
  ModelConfig m;
  m.vocab_size = 10, m.d_model = 8, m.n_layers = 1, m.n_heads = 2, m.n_kv_heads = 1, m.d_ff = 16;
  m.n_dense_layers = 1, m.n_routed_experts = 0, m.top_k = 0, m.mtp_depth = 0, m.tie_embeddings = false;
  m.max_seq_len = 64;
  return m;
}

TEST(Flops, CausalPairs) {
  EXPECT_DOUBLE_EQ(CausalPairs(4, 4), 10);      // 1 + 2 + 3 + 4
  EXPECT_DOUBLE_EQ(CausalPairs(4, 100), 10);    // k beyond the length: dense
  EXPECT_DOUBLE_EQ(CausalPairs(4, 2), 7);       // 1 + 2 + 2 + 2
  EXPECT_DOUBLE_EQ(CausalPairs(5, 1), 5);
}

TEST(Flops, DenseByHand) {
  const ModelConfig m = Tiny();
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().message();
  // Weights of one token, embedding lookup excluded: attention norm and FFN
  // norm 2*8, q 8*8, o 8*8, k 8*4, v 8*4 = 208; FFN 3*8*16 = 384; final
  // norm 8 and head 10*8 = 88. 680 weights, 2 FLOPs each.
  // Attention: 4 * (2 heads * 4) = 32 per pair, 10 causal pairs over 4
  // tokens: 80 per token.
  const TokenFlops f = ForwardFlopsPerToken(m, 4);
  EXPECT_DOUBLE_EQ(f.weights, 1360);
  EXPECT_DOUBLE_EQ(f.attention, 80);
  EXPECT_DOUBLE_EQ(f.indexer, 0);
  EXPECT_DOUBLE_EQ(TrainFlopsPerToken(m, 4), 3 * 1440);
  // Tied: the head's 80 weights are the embedding's, still a GEMM.
  ModelConfig tied = m;
  tied.tie_embeddings = true;
  EXPECT_DOUBLE_EQ(ForwardFlopsPerToken(tied, 4).weights, 1360);
}

TEST(Flops, DsaByHand) {
  // Two layers sharing one indexer (Hi=2 heads of Di=4), top-2 keys, and one
  // MTP module (dense attention, the shared head again).
  ModelConfig m = Tiny();
  m.n_layers = 2, m.n_dense_layers = 2, m.mtp_depth = 1;
  m.attention = "dsa", m.dsa_topk = 2, m.dsa_index_heads = 2, m.dsa_index_dim = 4, m.dsa_index_share = 2;
  m.dsa_index_rope_dim = 2;
  ASSERT_TRUE(m.Validate().ok()) << m.Validate().message();
  // Weights: two layers of 208 + 384 = 1184; the indexer on layer 0,
  // 8 * (2*4 + 4 + 2) = 112; final norm + head 88; the MTP module: norms
  // 3*8, projection 2*8*8 = 128, its block 592 and the head again 80.
  // 1184 + 112 + 88 + 24 + 128 + 592 + 80 = 2208 weights.
  // Attention: main layers 32 per pair, 7 pairs with top-2 over 4 tokens,
  // 2 layers: 32 * 7/4 * 2 = 112; the MTP block dense: 32 * 10/4 = 80.
  // Indexer: 2 * 2 * (4 + 1) = 20 per pair over all 10 causal pairs, one
  // indexer layer: 20 * 10/4 = 50.
  const TokenFlops f = ForwardFlopsPerToken(m, 4);
  EXPECT_DOUBLE_EQ(f.weights, 2 * 2208);
  EXPECT_DOUBLE_EQ(f.attention, 112 + 80);
  EXPECT_DOUBLE_EQ(f.indexer, 50);
  EXPECT_DOUBLE_EQ(TrainFlopsPerToken(m, 4), 3 * (4416 + 192 + 50));
  // With top-k at least the length, the attention is dense again.
  m.dsa_topk = 4;
  EXPECT_DOUBLE_EQ(ForwardFlopsPerToken(m, 4).attention, 32 * 10 / 4.0 * 3);
}

TEST(Flops, ParamCountsMatchTheLayout) {
  ModelConfig moe = Tiny();
  moe.n_layers = 3, moe.n_dense_layers = 1, moe.n_routed_experts = 4, moe.top_k = 2, moe.d_expert = 8;
  moe.n_shared_experts = 1, moe.mtp_depth = 1;
  ModelConfig dsa = moe;
  dsa.attention = "dsa", dsa.dsa_index_heads = 2, dsa.dsa_index_dim = 4, dsa.dsa_index_share = 2;
  ModelConfig open = moe;  // Qwen-style: q/k/v biases, q/k norms, a head width apart from d_model / n_heads
  open.qkv_bias = true, open.qk_norm = true, open.d_head = 6;
  ModelConfig sparse = moe;  // dense layers between MoE ones (Qwen3-MoE's mlp_only_layers)
  sparse.n_layers = 5, sparse.dense_layers = {2, 4};
  for (const ModelConfig& m : {Tiny(), moe, dsa, open, sparse})
    EXPECT_DOUBLE_EQ(CountParams(m).total, static_cast<double>(ParamLayout(m).total()));
}

}  // namespace
}  // namespace myriad
