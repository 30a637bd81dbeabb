// The post-training objectives against tests/golden/rl_reference.py (PyTorch
// autograd on the reference model, written from the equations): the loss and
// the gradient of every parameter for GRPO (clipped ratio, k3 KL) and for
// reverse KL, forward KL and JSD distillation, on the tiny golden model with
// its MTP module present (a post-training step does not run it). Plus the
// closed forms the loop relies on: ratios exactly 1 on the first inner step,
// group advantages, token weights, the top-k teacher.
#include "rl/objective.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/config.h"
#include "core/safetensors.h"
#include "core/rng.h"
#include "data/test_util.h"
#include "model/inference.h"
#include "model/model.h"
#include "train/train_config.h"

namespace myriad::rl {
namespace {

std::string SourceDir() {
  const char* s = std::getenv("MYRIAD_SOURCE_DIR");
  return s ? s : ".";
}

std::vector<float> Vec(const SafetensorsFile& f, const std::string& name) {
  const TensorView* t = f.Find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  const float* p = static_cast<const float*>(t->data);
  return std::vector<float>(p, p + t->nbytes / 4);
}

class RlGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A folder of this process's own: ctest runs each test of the suite as
    // its own process, at once, and one rewriting a dump another has mapped
    // is a bus error.
    static TempDir tmp("rl_golden");
    const std::string dir = tmp.path();
    path_ = dir + "/rl.safetensors";
    const std::string cmd = "/usr/bin/python3 " + SourceDir() + "/tests/golden/rl_reference.py --config " +
                            SourceDir() + "/tests/golden/tiny.toml --out " + path_ + " > " + dir + "/log 2>&1";
    rc_ = std::system(cmd.c_str());
  }
  void SetUp() override {
    ASSERT_EQ(rc_, 0) << "tests/golden/rl_reference.py failed (log beside " << path_ << ")";
    auto f = SafetensorsFile::Open(path_);
    ASSERT_TRUE(f.ok()) << f.status().message();
    file_ = std::make_unique<SafetensorsFile>(std::move(f).value());
    auto doc = ConfigDoc::Load(SourceDir() + "/tests/golden/tiny.toml", {});
    ASSERT_TRUE(doc.ok());
    cfg_ = ModelConfig::Read(doc->get());
    T_ = static_cast<int>(TrainConfig::Read(doc->get()).seq_len);
    model_ = std::make_unique<Model>(cfg_);
    for (const auto& p : model_->layout().params()) {
      auto v = Vec(*file_, "param/" + p.name);
      ASSERT_EQ(static_cast<int64_t>(v.size()), p.numel) << p.name;
      model_->ParamsFromHost(v.data(), p.offset, p.numel);
    }
    const auto& names = model_->layout().bias_names();
    for (size_t i = 0; i < names.size(); ++i) model_->biases()[i] = Vec(*file_, "buffer/" + names[i]);
    const TensorView* t = file_->Find("tokens");
    ASSERT_NE(t, nullptr);
    const int32_t* tok = static_cast<const int32_t*>(t->data);
    tokens_.assign(tok, tok + t->nbytes / 4);
    B_ = static_cast<int>(tokens_.size() / (T_ + 1));
    coef_ = Vec(*file_, "coef");
  }

  // Runs the model's step with `obj` and checks the loss and every gradient
  // against the reference's `kind`.
  void Check(const std::string& kind, HeadObjective* obj) {
    model_->ZeroGrads();
    model_->set_head_objective(obj);
    LossParts loss = model_->Step(tokens_.data(), B_, T_, true, 1.f);
    model_->set_head_objective(nullptr);
    const double want = Vec(*file_, kind + "/loss")[0];
    EXPECT_NEAR(loss.total, want, 1e-5 * std::max(1.0, std::fabs(want))) << kind;
    EXPECT_NEAR(loss.aux, Vec(*file_, kind + "/aux")[0], 1e-6) << kind;
    EXPECT_EQ(loss.mtp, 0.0);
    const std::vector<float> g = model_->GradsToHost();
    double worst = 0;
    std::string worst_name;
    for (const auto& p : model_->layout().params()) {
      const auto ref = Vec(*file_, kind + "/grad/" + p.name);
      ASSERT_EQ(static_cast<int64_t>(ref.size()), p.numel) << p.name;
      double num = 0, den = 0;
      for (int64_t i = 0; i < p.numel; ++i) {
        num = std::max(num, std::fabs(static_cast<double>(g[p.offset + i]) - ref[i]));
        den = std::max(den, std::fabs(static_cast<double>(ref[i])));
      }
      // MTP parameters get no gradient on either side.
      const double err = den > 0 ? num / den : num;
      if (err > worst) worst = err, worst_name = p.name;
    }
    EXPECT_LE(worst, 1e-5) << kind << ": worst relative gradient error in " << worst_name;
  }

  static inline std::string path_;
  static inline int rc_ = -1;
  std::unique_ptr<SafetensorsFile> file_;
  ModelConfig cfg_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> tokens_;
  std::vector<float> coef_;
  int B_ = 0, T_ = 0;
};

TEST_F(RlGolden, GrpoLossAndGradientMatchPyTorch) {
  const auto hyper = Vec(*file_, "hyper");
  PolicyLossConfig pc{hyper[0], hyper[1], hyper[2]};
  GrpoObjective obj(pc, T_, coef_, Vec(*file_, "old_logp"), Vec(*file_, "ref_logp"), Vec(*file_, "adv"));
  Check("grpo", &obj);
  // The reference's behaviour logprobs were drawn so both clip sides occur.
  EXPECT_GT(obj.stats().clipped, 0);
  EXPECT_LT(obj.stats().clipped, obj.stats().tokens);
}

TEST_F(RlGolden, DistillationLossesAndGradientsMatchPyTorch) {
  auto teacher = std::make_shared<TeacherRows>();
  teacher->vocab = cfg_.vocab_size;
  teacher->logits = Vec(*file_, "teacher_logits");
  for (auto [name, kind] : {std::pair{"rkl", DistillLoss::kReverseKl}, std::pair{"fkl", DistillLoss::kForwardKl},
                            std::pair{"jsd", DistillLoss::kJsd}}) {
    DistillObjective obj(kind, T_, coef_, teacher);
    Check(name, &obj);
  }
}

TEST_F(RlGolden, RatiosAreExactlyOneOnTheFirstInnerStep) {
  // The behaviour logprobs from a forward-only pass of the same weights.
  LogprobRecorder rec(B_, T_);
  model_->set_head_objective(&rec);
  model_->Step(tokens_.data(), B_, T_, false);
  std::vector<float> adv = {1.f, -1.f, 0.5f};
  GrpoObjective obj(PolicyLossConfig{}, T_, coef_, rec.logp(), {}, adv);
  model_->set_head_objective(&obj);
  model_->ZeroGrads();
  model_->Step(tokens_.data(), B_, T_, true);
  model_->set_head_objective(nullptr);
  ASSERT_GT(obj.stats().tokens, 0);
  EXPECT_EQ(obj.stats().ratio_min, 1.0);
  EXPECT_EQ(obj.stats().ratio_max, 1.0);
  EXPECT_EQ(obj.stats().clipped, 0);
}

TEST(RlObjective, GroupAdvantagesAreNormalisedPerGroup) {
  const auto a = GroupAdvantages({1, 0, 0, 1, 2, 2, 2, 2}, 4);
  // Group 1: mean 0.5, sample std sqrt(1/3).
  const double sd = std::sqrt(1.0 / 3.0);
  EXPECT_NEAR(a[0], 0.5 / (sd + 1e-4), 1e-5);
  EXPECT_NEAR(a[1], -0.5 / (sd + 1e-4), 1e-5);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(a[i], 0.f);  // equal rewards: no signal
  const auto b = GroupAdvantages({3, 1}, 2, false);
  EXPECT_FLOAT_EQ(b[0], 1.f);
  EXPECT_FLOAT_EQ(b[1], -1.f);
}

TEST(RlObjective, TokenWeightsNormaliseByTokensOrSequences) {
  // T = 6; sequence 0: prompt 2, response 3; sequence 1: prompt 1, response 1.
  const auto tok = TokenWeights({2, 1}, {3, 1}, 6, LossNorm::kToken);
  EXPECT_FLOAT_EQ(tok[0], 0.f);
  for (int t = 1; t <= 3; ++t) EXPECT_FLOAT_EQ(tok[t], 0.25f);
  EXPECT_FLOAT_EQ(tok[4], 0.f);
  EXPECT_FLOAT_EQ(tok[6 + 0], 0.25f);
  const auto seq = TokenWeights({2, 1}, {3, 1}, 6, LossNorm::kSequence);
  for (int t = 1; t <= 3; ++t) EXPECT_FLOAT_EQ(seq[t], 1.f / 6);
  EXPECT_FLOAT_EQ(seq[6], 0.5f);
  double s = 0;
  for (float c : seq) s += c;
  EXPECT_NEAR(s, 1.0, 1e-6);
}

TEST(RlObjective, TopKTeacherIsTheFullFormulaOnItsSupport) {
  // One row, vocab 5; the teacher's top 3 with logprobs. Reverse KL over the
  // renormalised support, against a hand computation.
  const int V = 5;
  float z[V] = {0.3f, -1.0f, 2.0f, 0.5f, -0.2f};
  auto t = std::make_shared<TeacherRows>();
  t->vocab = V;
  t->top_k = 3;
  t->ids = {2, 0, 3};
  t->logprobs = {-0.5f, -1.5f, -2.0f};
  DistillObjective obj(DistillLoss::kReverseKl, 1, {1.f}, t);
  int64_t seq = 0;
  int32_t pos = 0, tgt = 1;
  HeadObjective::Rows rows{1, V, &seq, &pos, &tgt};
  float d[V] = {};
  const double loss = obj.Apply(rows, z, d);
  double zs[3] = {z[2], z[0], z[3]}, lt[3] = {-0.5, -1.5, -2.0};
  auto lse = [](const double* x) {
    double m = std::max({x[0], x[1], x[2]});
    return m + std::log(std::exp(x[0] - m) + std::exp(x[1] - m) + std::exp(x[2] - m));
  };
  const double ls0 = lse(zs), lt0 = lse(lt);
  double want = 0;
  for (int i = 0; i < 3; ++i) want += std::exp(zs[i] - ls0) * ((zs[i] - ls0) - (lt[i] - lt0));
  EXPECT_NEAR(loss, want, 1e-6);
  EXPECT_EQ(d[1], 0.f);  // outside the support: no gradient
  EXPECT_EQ(d[4], 0.f);
  // Finite differences on a support logit.
  const float h = 1e-3f;
  float zp[V], zm[V];
  std::copy(z, z + V, zp);
  std::copy(z, z + V, zm);
  zp[0] += h;
  zm[0] -= h;
  const double fd = (obj.Apply(rows, zp, nullptr) - obj.Apply(rows, zm, nullptr)) / (2 * h);
  EXPECT_NEAR(d[0], fd, 1e-4);
}

TEST(RlObjective, MismatchedTeacherVocabularyIsAClearError) {
  auto t = std::make_shared<TeacherRows>();
  t->vocab = 7;
  t->logits.assign(7, 0.f);
  DistillObjective obj(DistillLoss::kReverseKl, 1, {1.f}, t);
  float z[5] = {0};
  int64_t seq = 0;
  int32_t pos = 0, tgt = 1;
  HeadObjective::Rows rows{1, 5, &seq, &pos, &tgt};
  EXPECT_DEATH(obj.Apply(rows, z, nullptr), "teacher vocabulary 7 != student's 5");
}

}  // namespace
}  // namespace myriad::rl

namespace myriad::rl {
namespace {

ModelConfig TinyDense() {
  ModelConfig c;
  c.vocab_size = 61; c.d_model = 32; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48;
  c.n_dense_layers = 2; c.n_routed_experts = 0; c.max_seq_len = 32; c.mtp_depth = 0; c.init_std = 0.2;
  return c;
}

// SFT's loss is the model's own next-token cross-entropy when every position
// weighs 1/(B*T): the same loss and the same gradients (the built-in loss is
// checked against PyTorch in the golden tests).
TEST(RlObjective, NllWithUniformWeightsIsTheModelsCrossEntropy) {
  Model model(TinyDense());
  model.InitWeights(3);
  const int B = 3, T = 12;
  Rng rng(7);
  std::vector<int32_t> tokens(B * (T + 1));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.Below(61));
  model.ZeroGrads();
  const LossParts ce = model.Step(tokens.data(), B, T, true);
  const std::vector<float> g_ce = model.GradsToHost();
  NllObjective nll(T, std::vector<float>(B * T, 1.f / (B * T)));
  model.ZeroGrads();
  model.set_head_objective(&nll);
  const LossParts ob = model.Step(tokens.data(), B, T, true);
  model.set_head_objective(nullptr);
  const std::vector<float> g_ob = model.GradsToHost();
  EXPECT_NEAR(ob.total, ce.main, 1e-6 * ce.main);
  EXPECT_EQ(nll.stats().tokens, B * T);
  double num = 0, den = 0;
  for (size_t i = 0; i < g_ce.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(g_ce[i]) - g_ob[i]));
    den = std::max(den, std::fabs(static_cast<double>(g_ce[i])));
  }
  ASSERT_GT(den, 0);
  EXPECT_LE(num / den, 1e-5);
}

// The teacher's table holds, at cell seq * T + pos, the logits an
// InferenceSession computes after tokens 0..pos of that sequence.
TEST(RlObjective, LogitsRecorderFillsTheTeacherTableByCell) {
  Model model(TinyDense());
  model.InitWeights(4);
  const int B = 2, T = 9;
  const int64_t V = 61;
  Rng rng(9);
  std::vector<int32_t> tokens(B * (T + 1));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.Below(V));
  TeacherRows rows;
  rows.vocab = V;
  rows.logits.assign(static_cast<size_t>(B) * T * V, 0.f);
  LogitsRecorder rec(T, &rows);
  model.set_head_objective(&rec);
  (void)model.Step(tokens.data(), B, T, false);
  model.set_head_objective(nullptr);
  double worst = 0;
  for (int s = 0; s < B; ++s) {
    InferenceSession session(model, T + 1);
    for (int t = 0; t < T; ++t) {
      const float* lg = session.Forward(&tokens[s * (T + 1) + t], 1);
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::fabs(static_cast<double>(lg[v]) - rows.logits[(s * T + t) * V + v]));
    }
  }
  EXPECT_LE(worst, 1e-4);
}

}  // namespace
}  // namespace myriad::rl
