// Golden test: the PyTorch reference (tests/golden/reference.py, an
// independent implementation of docs/model.md) dumps inputs, logits, losses,
// every gradient and 10 training steps; Myriad must match them. The steps
// run through DistTrainer on a world of one rank: the step `myriad train` runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/config.h"
#include "core/safetensors.h"
#include "model/model.h"
#include "ops/ops.h"
#include "train/comm/local_comm.h"
#include "train/dist_train.h"
#include "train/train_config.h"

namespace myriad {
namespace {

std::string SourceDir() {
  const char* s = std::getenv("MYRIAD_SOURCE_DIR");
  return s ? s : ".";
}

// max|a-b| / max|b|: the error relative to the tensor's scale.
double RelErr(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

struct Golden {
  std::unique_ptr<SafetensorsFile> file;
  ModelConfig model;
  TrainConfig train;
};

Golden MakeGolden(const std::string& name, const std::vector<std::string>& sets) {
  Golden g;
  const std::string dir = ::testing::TempDir() + "/golden_" + name;
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/golden.safetensors";
  std::string cmd = "/usr/bin/python3 " + SourceDir() + "/tests/golden/reference.py --config " +
                    SourceDir() + "/tests/golden/tiny.toml --out " + out;
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  cmd += " > " + dir + "/reference.log 2>&1";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "reference failed: " << cmd << " (see " << dir << "/reference.log)";
  if (rc != 0) return g;
  auto f = SafetensorsFile::Open(out);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return g;
  g.file = std::make_unique<SafetensorsFile>(std::move(f).value());
  auto doc = ConfigDoc::Load(SourceDir() + "/tests/golden/tiny.toml", sets);
  EXPECT_TRUE(doc.ok());
  g.model = ModelConfig::Read(doc->get());
  g.train = TrainConfig::Read(doc->get());
  EXPECT_TRUE((*doc)->Finish().ok()) << (*doc)->Finish().message();
  EXPECT_TRUE(g.model.Validate().ok()) << g.model.Validate().message();
  return g;
}

const float* F32(const SafetensorsFile& f, const std::string& name, int64_t numel) {
  const TensorView* t = f.Find(name);
  EXPECT_NE(t, nullptr) << "golden file lacks " << name;
  if (!t) return nullptr;
  EXPECT_EQ(t->dtype, "F32") << name;
  EXPECT_EQ(static_cast<int64_t>(t->nbytes / 4), numel) << name;
  return static_cast<const float*>(t->data);
}

void LoadInit(const Golden& g, Model* m, const std::string& prefix) {
  for (const auto& p : m->layout().params()) {
    const float* src = F32(*g.file, prefix + "param/" + p.name, p.numel);
    ASSERT_NE(src, nullptr);
    m->ParamsFromHost(src, p.offset, p.numel);
  }
  const auto& names = m->layout().bias_names();
  for (size_t i = 0; i < names.size(); ++i) {
    const float* src = F32(*g.file, prefix + "buffer/" + names[i], m->config().n_routed_experts);
    ASSERT_NE(src, nullptr);
    std::copy(src, src + m->config().n_routed_experts, m->biases()[i].data());
  }
}

// The trainer users run, on a world of one rank, from the reference's init.
struct OneRank {
  std::unique_ptr<comm::Comm> world = comm::MakeSelfComm();
  std::unique_ptr<DistTrainer> trainer;
};
void MakeTrainer(const Golden& g, OneRank* r) {
  auto t = DistTrainer::Create(r->world.get(), g.model, g.train);
  ASSERT_TRUE(t.ok()) << t.status().message();
  r->trainer = std::move(t).value();
  ASSERT_TRUE(r->trainer->solo());
  LoadInit(g, &r->trainer->model(), "");
}

// Tokens of training step s (0-based): A*B sequences of T+1.
const int32_t* StepTokens(const TensorView* tt, const Golden& g, int s) {
  const int64_t per_step = g.train.grad_accum * g.train.batch_size * (g.train.seq_len + 1);
  return static_cast<const int32_t*>(tt->data) + s * per_step;
}

void CheckGolden(const std::string& name, const std::vector<std::string>& sets) {
  Golden g = MakeGolden(name, sets);
  ASSERT_TRUE(g.file);
  const SafetensorsFile& f = *g.file;
  const ModelConfig& cfg = g.model;
  const int B = g.train.batch_size, T = g.train.seq_len;
  Model model(cfg);
  LoadInit(g, &model, "");

  const TensorView* tok = f.Find("tokens");
  ASSERT_NE(tok, nullptr);
  ASSERT_EQ(tok->nbytes, sizeof(int32_t) * B * (T + 1));
  const int32_t* tokens = static_cast<const int32_t*>(tok->data);

  // Forward: logits and losses.
  LossParts lp = model.Step(tokens, B, T, /*backward=*/false);
  const float* ref_logits = F32(f, "logits", static_cast<int64_t>(B) * T * cfg.vocab_size);
  ASSERT_NE(ref_logits, nullptr);
  double e = RelErr(model.logits().data(), ref_logits, static_cast<int64_t>(B) * T * cfg.vocab_size);
  EXPECT_LE(e, 1e-4) << "logits";
  auto scalar = [&](const char* n) { return static_cast<double>(*F32(f, n, 1)); };
  EXPECT_NEAR(lp.total, scalar("loss"), 1e-5 * std::fabs(scalar("loss"))) << "total loss";
  EXPECT_NEAR(lp.main, scalar("loss_main"), 1e-5 * std::fabs(scalar("loss_main")));
  EXPECT_NEAR(lp.mtp, scalar("loss_mtp"), 1e-5 * std::fabs(scalar("loss_mtp")) + 1e-9);
  EXPECT_NEAR(lp.aux, scalar("loss_aux"), 1e-5 * std::fabs(scalar("loss_aux")) + 1e-9);

  // Backward: every gradient.
  model.ZeroGrads();
  model.Step(tokens, B, T, /*backward=*/true, 1.f);
  int checked = 0;
  const std::vector<float> grads = model.GradsToHost();
  for (const auto& p : model.layout().params()) {
    const float* ref = F32(f, "grad/" + p.name, p.numel);
    ASSERT_NE(ref, nullptr);
    double err = RelErr(grads.data() + p.offset, ref, p.numel);
    EXPECT_LE(err, 1e-4) << "grad of " << p.name;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(model.layout().params().size()));

  // Ten training steps from the same init.
  OneRank run;
  MakeTrainer(g, &run);
  ASSERT_TRUE(run.trainer);
  Model& tm = run.trainer->model();
  const TensorView* tt = f.Find("train_tokens");
  ASSERT_NE(tt, nullptr);
  const int A = g.train.grad_accum;
  const int steps = g.train.steps;
  ASSERT_EQ(tt->nbytes, sizeof(int32_t) * steps * A * B * (T + 1));
  const float* ref_losses = F32(f, "step_losses", steps);
  const float* ref_norms = F32(f, "step_grad_norm", steps);
  const float* ref_lr = F32(f, "step_lr", steps);
  for (int s = 0; s < steps; ++s) {
    StepStats st = run.trainer->Step(StepTokens(tt, g, s), A, B, T, s + 1);
    EXPECT_NEAR(st.loss.total, ref_losses[s], 1e-5 * std::fabs(ref_losses[s])) << "step " << s + 1;
    EXPECT_NEAR(st.grad_norm, ref_norms[s], 1e-4 * std::fabs(ref_norms[s])) << "step " << s + 1;
    EXPECT_NEAR(st.lr, ref_lr[s], 1e-6 * std::fabs(ref_lr[s])) << "step " << s + 1;
  }
  const std::vector<float> final_params = tm.ParamsToHost();
  for (const auto& p : tm.layout().params()) {
    const float* ref = F32(f, "final/param/" + p.name, p.numel);
    ASSERT_NE(ref, nullptr);
    // Looser than the gradients: Adam divides by sqrt(v), which amplifies
    // last-bit differences in tiny gradients over ten steps.
    EXPECT_LE(RelErr(final_params.data() + p.offset, ref, p.numel), 5e-4) << "final " << p.name;
  }
  const auto& names = tm.layout().bias_names();
  for (size_t i = 0; i < names.size(); ++i) {
    const float* ref = F32(f, "final/buffer/" + names[i], cfg.n_routed_experts);
    ASSERT_NE(ref, nullptr);
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e)
      EXPECT_NEAR(tm.biases()[i][e], ref[e], 1e-6) << names[i] << "[" << e << "]";
  }
}

// The bf16 GEMM path (bf16 inputs, fp32 accumulation) must track the fp32
// reference closely over the same ten steps: it changes rounding, not math.
TEST(GoldenTest, Bf16GemmTracksReference) {
  if (!ops::HasBf16Gemm()) GTEST_SKIP() << "no bf16 GEMM on " << ops::Active()->name();
  Golden g = MakeGolden("bf16", {});
  ASSERT_TRUE(g.file);
  const SafetensorsFile& f = *g.file;
  const int B = g.train.batch_size, T = g.train.seq_len, A = g.train.grad_accum, steps = g.train.steps;
  OneRank run;
  MakeTrainer(g, &run);
  ASSERT_TRUE(run.trainer);
  const TensorView* tt = f.Find("train_tokens");
  ASSERT_NE(tt, nullptr);
  const float* ref_losses = F32(f, "step_losses", steps);
  ops::SetGemmPrecision(ops::GemmPrecision::kBf16);
  for (int s = 0; s < steps; ++s) {
    StepStats st = run.trainer->Step(StepTokens(tt, g, s), A, B, T, s + 1);
    EXPECT_NEAR(st.loss.total, ref_losses[s], 1e-2 * std::fabs(ref_losses[s])) << "step " << s + 1;
  }
  ops::SetGemmPrecision(ops::GemmPrecision::kFp32);
}

TEST(GoldenTest, SigmoidRoutingAuxLossMtpUntied) { CheckGolden("sigmoid", {}); }

TEST(GoldenTest, DenseOnlyNoMtp) { CheckGolden("dense", {"model.mtp_depth=0", "model.n_dense_layers=3"}); }

TEST(GoldenTest, SoftmaxRoutingTiedMtp2) {
  CheckGolden("softmax", {"model.score_func=\"softmax\"", "model.tie_embeddings=true", "model.mtp_depth=2",
                          "model.aux_loss_weight=0.0"});
}

}  // namespace
}  // namespace myriad
