// DSA inside the model: with top-k covering every key the model is the dense
// model (same losses and gradients for the shared weights); the indexers'
// gradient is the derivative of their KL loss (central differences); sharing
// puts indexer weights in the first layer of each group only; the sparse path
// trains (loss and KL finite, the KL falls).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "model/model.h"

namespace myriad {
namespace {

ModelConfig TinyDsa(int64_t topk, int64_t share, int64_t rope_dim = 0) {
  ModelConfig c;
  c.vocab_size = 97; c.d_model = 32; c.n_layers = 4; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48;
  c.n_dense_layers = 1; c.n_routed_experts = 6; c.n_shared_experts = 1; c.top_k = 2; c.d_expert = 24;
  c.max_seq_len = 64; c.init_std = 0.2;
  c.attention = "dsa"; c.dsa_topk = topk; c.dsa_index_heads = 2; c.dsa_index_dim = 8; c.dsa_index_share = share;
  c.dsa_index_rope_dim = rope_dim;
  return c;
}

std::vector<int32_t> Tokens(int B, int T, int V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(B) * (T + 1));
  for (auto& x : t) x = static_cast<int32_t>(rng.Below(V));
  return t;
}

const ParamInfo* Find(const Model& m, const std::string& name) {
  for (const auto& p : m.layout().params())
    if (p.name == name) return &p;
  return nullptr;
}

TEST(DsaModel, TopKCoveringEveryKeyIsTheDenseModel) {
  const int B = 2, T = 24;
  ModelConfig dense_cfg = TinyDsa(64, 2);
  dense_cfg.attention = "dense";
  Model dense(dense_cfg), dsa(TinyDsa(/*topk=*/T, 2));
  dense.InitWeights(5);
  dsa.InitWeights(5);  // weights are seeded by name: the shared ones are equal
  const auto tok = Tokens(B, T, 97, 9);
  dense.ZeroGrads();
  dsa.ZeroGrads();
  const LossParts a = dense.Step(tok.data(), B, T, true);
  const LossParts b = dsa.Step(tok.data(), B, T, true);
  EXPECT_NEAR(a.total, b.total, 1e-6 * std::fabs(a.total));
  EXPECT_GT(b.indexer, 0.0);  // an untrained indexer is not the attention
  const std::vector<float> ga = dense.GradsToHost(), gb = dsa.GradsToHost();
  for (const auto& p : dense.layout().params()) {
    const ParamInfo* q = Find(dsa, p.name);
    ASSERT_NE(q, nullptr) << p.name;
    double num = 0, den = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      num = std::max(num, std::fabs(static_cast<double>(ga[p.offset + i]) - gb[q->offset + i]));
      den = std::max(den, std::fabs(static_cast<double>(ga[p.offset + i])));
    }
    EXPECT_LE(num, 1e-5 * std::max(den, 1e-6)) << p.name;
  }
}

TEST(DsaModel, SharingPutsIndexersInTheFirstLayerOfEachGroup) {
  Model m(TinyDsa(8, 2));
  for (int l = 0; l < 4; ++l) {
    const std::string name = "model.layers." + std::to_string(l) + ".self_attn.indexer.wq.weight";
    EXPECT_EQ(Find(m, name) != nullptr, l % 2 == 0) << name;
  }
  Model all(TinyDsa(8, 1));
  EXPECT_NE(Find(all, "model.layers.3.self_attn.indexer.weights_proj.weight"), nullptr);
}

// Also with RoPE on half the indexer's dims: its backward (the inverse
// rotation of dqi, dki) is part of what the finite differences check, on
// the key weights (wk) and the query weights (wq).
TEST(DsaModel, IndexerGradientIsTheDerivativeOfItsKl) {
  const int B = 1, T = 20;
  for (auto [topk, rope, pname] : {std::tuple{int64_t{6}, int64_t{0}, "wk"}, {int64_t{64}, int64_t{0}, "wk"},
                                   {int64_t{6}, int64_t{4}, "wk"}, {int64_t{6}, int64_t{4}, "wq"}}) {
    SCOPED_TRACE(testing::Message() << "topk " << topk << " rope " << rope << " " << pname);
    Model m(TinyDsa(topk, 2, rope));
    m.InitWeights(7);
    const auto tok = Tokens(B, T, 97, 3);
    m.ZeroGrads();
    m.Step(tok.data(), B, T, true);
    const ParamInfo* p = Find(m, std::string("model.layers.2.self_attn.indexer.") + pname + ".weight");
    ASSERT_NE(p, nullptr);
    const std::vector<float> grads = m.GradsToHost();
    const std::vector<float> g(grads.begin() + p->offset, grads.begin() + p->offset + p->numel);
    auto kl = [&] {
      m.ZeroGrads();
      double total = 0;
      // Step reports the mean KL over indexer layers (2 here): times 2 = the
      // sum, whose derivative wrt this layer's weights is its own KL's.
      total = m.Step(tok.data(), B, T, true).indexer * 2;
      return total;
    };
    const double f0 = kl();
    int checked = 0;
    for (int64_t i = 0; i < p->numel; i += p->numel / 11 + 1) {
      // One weight at a time through the host (parameters are device memory).
      auto set = [&](float v) { m.ParamsFromHost(&v, p->offset + i, 1); };
      const float w0 = m.ParamsToHost()[p->offset + i], h = 2e-3f;
      set(w0 + h);
      const double up = kl();
      set(w0 - h);
      const double down = kl();
      set(w0);
      // A ReLU kink (or a selection change) between w-h and w+h makes the
      // one-sided slopes differ: no derivative to compare there.
      if (std::fabs((up - f0) - (f0 - down)) / h > 1e-3) continue;
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(g[i], fd, 2e-3 * std::max(1.0, std::fabs(fd))) << "topk " << topk << " element " << i;
      ++checked;
    }
    EXPECT_GE(checked, 6) << "too many elements at a kink";
  }
}

TEST(DsaModel, SparsePathTrainsItsIndexer) {
  const int B = 2, T = 32;
  Model m(TinyDsa(/*topk=*/8, 2));
  m.InitWeights(11);
  const auto tok = Tokens(B, T, 97, 4);
  double first = 0, last = 0;
  for (int it = 0; it < 30; ++it) {
    m.ZeroGrads();
    const LossParts lp = m.Step(tok.data(), B, T, true);
    ASSERT_TRUE(std::isfinite(lp.total) && std::isfinite(lp.indexer));
    if (it == 0) first = lp.indexer;
    last = lp.indexer;
    // Plain SGD on the indexer weights only: their KL must fall.
    std::vector<float> w = m.ParamsToHost();
    const std::vector<float> g = m.GradsToHost();
    for (const auto& p : m.layout().params())
      if (p.name.find(".indexer.") != std::string::npos) {
        for (int64_t i = 0; i < p.numel; ++i) w[p.offset + i] -= 0.5f * g[p.offset + i];
        m.ParamsFromHost(w.data() + p.offset, p.offset, p.numel);
      }
  }
  EXPECT_LT(last, 0.8 * first) << "indexer KL " << first << " -> " << last;
}

}  // namespace
}  // namespace myriad
