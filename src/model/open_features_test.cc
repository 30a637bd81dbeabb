// The open-model features of the block (docs/open-models.md): q/k/v biases,
// per-head q/k norms, a head width apart from d_model / n_heads, RoPE
// scaling, and the routing rules (unnormalised, scaled, group-limited).
// Oracles: central finite differences of the loss for the new parameters'
// gradients, the closed forms of the RoPE scalings, and the KV-cached
// inference path against the training forward. (Parity with an independent
// PyTorch implementation of each family is tests/hf/.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/block.h"
#include "model/inference.h"
#include "model/model.h"

namespace myriad {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.vocab_size = 61; c.d_model = 32; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 40;
  c.n_dense_layers = 2; c.n_routed_experts = 0; c.top_k = 0; c.d_expert = 0;
  c.max_seq_len = 64; c.init_std = 0.2; c.norm_eps = 1e-6;
  return c;
}

ModelConfig TinyOpenMoe() {
  ModelConfig c = Tiny();
  c.qk_norm = true; c.d_head = 12;  // 4 heads of 12 on a width of 32
  c.n_dense_layers = 1; c.n_routed_experts = 8; c.top_k = 2; c.d_expert = 16; c.n_shared_experts = 1;
  c.score_func = "sigmoid"; c.n_group = 4; c.topk_group = 2; c.routed_scaling_factor = 2.5;
  return c;
}

std::vector<int32_t> Tokens(int n, int V, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.Below(V));
  return t;
}

const ParamInfo* Find(const Model& m, const std::string& name) {
  for (const auto& p : m.layout().params())
    if (p.name == name) return &p;
  return nullptr;
}

// Random values in the 1-D parameters too (biases start at 0, norms at 1),
// so that every one of them matters.
void Perturb(Model* m, uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : m->layout().params()) {
    if (p.shape.size() != 1) continue;
    std::vector<float> v(p.numel);
    const bool bias = p.name.ends_with(".bias");
    for (auto& x : v) x = (bias ? 0.f : 1.f) + 0.3f * rng.Normal();
    m->ParamsFromHost(v.data(), p.offset, p.numel);
  }
}

// d loss / d w for a sample of each named tensor, against central
// differences of the loss (fp32 forward, so h is large and the tolerance
// loose; a wrong or missing term is off by far more).
void CheckGradients(const ModelConfig& cfg, const std::vector<std::string>& names) {
  Model m(cfg);
  m.InitWeights(5);
  Perturb(&m, 9);
  const int B = 2, T = 12;
  const auto tok = Tokens(B * (T + 1), static_cast<int>(cfg.vocab_size), 4);
  m.ZeroGrads();
  m.Step(tok.data(), B, T, true);
  const std::vector<float> grads = m.GradsToHost();
  auto loss = [&] { return m.Step(tok.data(), B, T, false).total; };
  for (const std::string& name : names) {
    const ParamInfo* p = Find(m, name);
    ASSERT_NE(p, nullptr) << name;
    int checked = 0;
    for (int64_t i = 0; i < p->numel; i += p->numel / 7 + 1) {
      auto set = [&](float v) { m.ParamsFromHost(&v, p->offset + i, 1); };
      const float w0 = m.ParamsToHost()[p->offset + i], h = 1e-2f;
      set(w0 + h);
      const double up = loss();
      set(w0 - h);
      const double down = loss();
      set(w0);
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(grads[p->offset + i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << name << " element " << i;
      ++checked;
    }
    EXPECT_GE(checked, 4) << name;
  }
}

// The largest relative error (max |diff| / max |logit| per position) of the
// KV-cached session's logits (a prefill of 5 tokens, then one at a time)
// against the training forward over T tokens.
double SessionVsTrainingForward(Model& model, int T) {
  const int V = static_cast<int>(model.config().vocab_size);
  const auto tokens = Tokens(T + 1, V, 6);
  model.Step(tokens.data(), 1, T, false);
  const std::vector<float> full = model.logits();
  InferenceSession s(model, model.config().max_seq_len, WeightFormat::kF32);
  const float* logits = s.Forward(tokens.data(), 5);
  double worst = 0;
  for (int t = 5; t <= T; ++t) {
    double num = 0, den = 0;
    for (int v = 0; v < V; ++v) {
      num = std::max(num, std::fabs(static_cast<double>(logits[v]) - full[(t - 1) * V + v]));
      den = std::max(den, std::fabs(static_cast<double>(full[(t - 1) * V + v])));
    }
    worst = std::max(worst, num / den);
    if (t < T) logits = s.Forward(&tokens[t], 1);
  }
  return worst;
}

TEST(OpenFeatures, QkvBiasGradientsAreTheDerivative) {
  ModelConfig c = Tiny();
  c.qkv_bias = true;
  CheckGradients(c, {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.bias",
                     "model.layers.1.self_attn.v_proj.bias", "model.layers.0.self_attn.q_proj.weight"});
}

TEST(OpenFeatures, QkNormGradientsAreTheDerivative) {
  ModelConfig c = Tiny();
  c.qk_norm = true;
  c.d_head = 12;
  CheckGradients(c, {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
                     "model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.o_proj.weight"});
}

TEST(OpenFeatures, ScaledGroupLimitedRouterGradientsAreTheDerivative) {
  for (bool normalize : {true, false}) {
    SCOPED_TRACE(normalize ? "normalised" : "unnormalised");
    ModelConfig c = TinyOpenMoe();
    c.norm_topk_prob = normalize;
    CheckGradients(c, {"model.layers.1.mlp.gate.weight", "model.layers.1.mlp.experts.3.up_proj.weight"});
  }
}

// MLA (DeepSeek-V3's attention) on the tiny model: 4 heads, latent rank 12,
// nope 8 + rope 4 for q.k, v of 6 (padded to 12 in training) or of 16 (q
// and k padded instead); q through a rank-10 compression or q_proj.
ModelConfig TinyMla(int64_t q_lora, int64_t v_head) {
  ModelConfig c = Tiny();
  c.kv_lora_rank = 12; c.q_lora_rank = q_lora; c.qk_nope_head_dim = 8; c.qk_rope_head_dim = 4;
  c.v_head_dim = v_head;
  return c;
}

std::vector<std::string> MlaTensors(const ModelConfig& c, int layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
  std::vector<std::string> names = {p + "kv_a_proj_with_mqa.weight", p + "kv_a_layernorm.weight",
                                    p + "kv_b_proj.weight", p + "o_proj.weight"};
  if (c.q_lora_rank > 0) {
    for (const char* n : {"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"}) names.push_back(p + n);
  } else {
    names.push_back(p + "q_proj.weight");
  }
  return names;
}

TEST(OpenFeatures, MlaGradientsAreTheDerivative) {
  for (auto [q_lora, v_head] : {std::pair<int64_t, int64_t>{10, 6}, {0, 16}}) {
    SCOPED_TRACE("q_lora_rank " + std::to_string(q_lora) + ", v_head_dim " + std::to_string(v_head));
    ModelConfig c = TinyMla(q_lora, v_head);
    c.rope_scaling = "yarn"; c.rope_factor = 4; c.rope_original_max_pos = 16; c.rope_mscale_all_dim = 1;
    ASSERT_TRUE(c.Validate().ok()) << c.Validate().message();
    std::vector<std::string> names = MlaTensors(c, 0);
    for (const auto& n : MlaTensors(c, 1)) names.push_back(n);
    names.push_back("model.layers.0.input_layernorm.weight");
    CheckGradients(c, names);
  }
}

// DeepSeek-V3's MTP input: module 1 reads the final norm's output, so the
// final norm's weight gets gradient from the MTP loss through it.
TEST(OpenFeatures, MtpAfterFinalNormGradientsAreTheDerivative) {
  ModelConfig c = TinyMla(10, 6);
  c.mtp_depth = 1; c.mtp_loss_weight = 1; c.mtp_after_final_norm = true;
  CheckGradients(c, {"model.norm.weight", "model.mtp.0.eh_proj.weight", "model.mtp.0.hnorm.weight",
                     "model.layers.1.self_attn.kv_b_proj.weight", "model.embed_tokens.weight"});
}

TEST(OpenFeatures, MlaShapesItsTensors) {
  ModelConfig c = TinyMla(10, 6);
  Model m(c);
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.q_a_proj.weight")->shape, (std::vector<int64_t>{10, 32}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.q_a_layernorm.weight")->shape, (std::vector<int64_t>{10}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.q_b_proj.weight")->shape, (std::vector<int64_t>{48, 10}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight")->shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.kv_a_layernorm.weight")->shape, (std::vector<int64_t>{12}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.kv_b_proj.weight")->shape, (std::vector<int64_t>{56, 12}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.o_proj.weight")->shape, (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.k_proj.weight"), nullptr);
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(c.kv_cache_floats_per_token_layer(), 16);  // c_kv 12 + k_pe 4
  // The softmax scale: 1/sqrt(8 + 4), times mscale(4, 1)^2 under yarn with mscale_all_dim 1.
  EXPECT_FLOAT_EQ(AttentionScale(c), static_cast<float>(1 / std::sqrt(12.0)));
  c.rope_scaling = "yarn"; c.rope_factor = 4; c.rope_mscale_all_dim = 1;
  const double m4 = 0.1 * std::log(4.0) + 1;
  EXPECT_FLOAT_EQ(AttentionScale(c), static_cast<float>(m4 * m4 / std::sqrt(12.0)));
}

TEST(OpenFeatures, HeadWidthApartFromModelWidthShapesTheTensors) {
  ModelConfig c = TinyOpenMoe();
  ASSERT_TRUE(c.Validate().ok()) << c.Validate().message();
  Model m(c);
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.q_proj.weight")->shape, (std::vector<int64_t>{48, 32}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.k_proj.weight")->shape, (std::vector<int64_t>{24, 32}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.o_proj.weight")->shape, (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(Find(m, "model.layers.0.self_attn.q_norm.weight")->shape, (std::vector<int64_t>{12}));
}

// The KV-cached path agrees with the training forward with every feature on.
TEST(OpenFeatures, InferenceMatchesTrainingForward) {
  for (int variant = 0; variant < 3; ++variant) {
    ModelConfig c = TinyOpenMoe();
    c.qkv_bias = variant != 1;
    c.norm_topk_prob = variant != 2;
    c.rope_scaling = variant == 0 ? "yarn" : variant == 1 ? "llama3" : "linear";
    c.rope_factor = 4; c.rope_original_max_pos = 16;
    SCOPED_TRACE(c.rope_scaling);
    Model model(c);
    model.InitWeights(3);
    Perturb(&model, 8);
    Rng rng(2);
    for (auto& b : model.biases())
      for (auto& x : b) x = 0.05f * rng.Normal();
    EXPECT_LE(SessionVsTrainingForward(model, 20), 1e-4);
  }
}

// MLA: the absorbed, latent-cached inference path (prefill of 5, then one
// token at a time) against the unabsorbed training forward, with q
// compressed or not, v narrower or wider than q.k, yarn's mscale_all_dim, and
// the DeepSeek-style router on the MoE layer.
TEST(OpenFeatures, MlaInferenceMatchesTrainingForward) {
  for (auto [q_lora, v_head] : {std::pair<int64_t, int64_t>{10, 6}, {0, 16}}) {
    SCOPED_TRACE("q_lora_rank " + std::to_string(q_lora) + ", v_head_dim " + std::to_string(v_head));
    ModelConfig c = TinyOpenMoe();
    c.qk_norm = false; c.d_head = 0;
    c.kv_lora_rank = 12; c.q_lora_rank = q_lora; c.qk_nope_head_dim = 8; c.qk_rope_head_dim = 4; c.v_head_dim = v_head;
    c.rope_scaling = "yarn"; c.rope_factor = 4; c.rope_original_max_pos = 16; c.rope_mscale_all_dim = 0.7;
    ASSERT_TRUE(c.Validate().ok()) << c.Validate().message();
    Model model(c);
    model.InitWeights(3);
    Perturb(&model, 8);
    const double worst = SessionVsTrainingForward(model, 20);
    EXPECT_LE(worst, 1e-5);
    EXPECT_GT(worst, 0);  // two different computations (absorbed vs not), not one
    RecordProperty("max_rel_err_q_lora_" + std::to_string(q_lora), std::to_string(worst));
  }
}

// The scalings' closed forms, dim by dim (D = 16, theta = 10000, i < 8:
// inv_freq_i = theta^(-i/8)).
TEST(OpenFeatures, RopeScalingsFollowTheirFormulas) {
  ModelConfig c = Tiny();
  c.rope_theta = 10000;
  const auto plain = RopeInvFreq(c, 16);
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(plain[i], std::pow(10000.0, -i / 8.0));
  c.rope_scaling = "linear";
  c.rope_factor = 4;
  auto lin = RopeInvFreq(c, 16);
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(lin[i], plain[i] / 4);
  EXPECT_EQ(RopeAttentionFactor(c), 1.0);
  // llama3 with an original context of 64: wavelengths 2 pi / f below
  // 64 / 4 = 16 are kept, above 64 / 1 = 64 divided by 4, between: blended.
  c.rope_scaling = "llama3";
  c.rope_original_max_pos = 64;
  c.rope_low_freq_factor = 1;
  c.rope_high_freq_factor = 4;
  auto l3 = RopeInvFreq(c, 16);
  int kept = 0, scaled = 0, blended = 0;
  for (int i = 0; i < 8; ++i) {
    const double wl = 2 * M_PI / plain[i];
    if (wl < 16) {
      EXPECT_DOUBLE_EQ(l3[i], plain[i]);
      ++kept;
    } else if (wl > 64) {
      EXPECT_DOUBLE_EQ(l3[i], plain[i] / 4);
      ++scaled;
    } else {
      const double sm = (64 / wl - 1) / 3;
      EXPECT_NEAR(l3[i], (1 - sm) * plain[i] / 4 + sm * plain[i], 1e-15);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(scaled, 0);
  EXPECT_GT(blended, 0);
  // yarn with original context 64, beta 32 / 1: correction dims
  // d(r) = 16 ln(64 / (2 pi r)) / (2 ln 10000), floored / ceiled:
  // d(32) = -0.99 -> 0 (clamped), d(1) = 2.02 -> 3; ramp (i - 0) / 3.
  c.rope_scaling = "yarn";
  auto y = RopeInvFreq(c, 16);
  for (int i = 0; i < 8; ++i) {
    const double ramp = std::clamp(i / 3.0, 0.0, 1.0);
    EXPECT_NEAR(y[i], plain[i] / 4 * ramp + plain[i] * (1 - ramp), 1e-15) << i;
  }
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(c), 0.1 * std::log(4.0) + 1);
}

}  // namespace
}  // namespace myriad
