// Config validation at load (LoadRunConfig): every value that would crash,
// hang, wrap or fail late is refused with one line naming the key.
#include "train/train_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/test_util.h"
#include "train/trainer.h"

namespace myriad {
namespace {

class LoadRunConfigTest : public ::testing::Test {
 protected:
  // configs/tiny.toml, copied (the messages start with the config's path).
  void SetUp() override {
    const char* src = std::getenv("MYRIAD_SOURCE_DIR");
    ASSERT_NE(src, nullptr) << "MYRIAD_SOURCE_DIR must be set (ctest sets it)";
    tmp_ = std::make_unique<TempDir>("train_config");
    path_ = tmp_->path() + "/tiny.toml";
    std::filesystem::copy_file(std::string(src) + "/configs/tiny.toml", path_);
  }
  Status Load(const std::vector<std::string>& overrides) {
    ModelConfig m;
    TrainConfig t;
    return LoadRunConfig(path_, overrides, &m, &t);
  }
  // The config with `overrides` is refused with one line that names `key`
  // (and contains `want`).
  void ExpectRefused(const std::vector<std::string>& overrides, const std::string& key, const std::string& want) {
    std::string what;
    for (const auto& o : overrides) what += " --set " + o;
    const Status s = Load(overrides);
    ASSERT_FALSE(s.ok()) << what << " was accepted";
    EXPECT_NE(s.message().find(key), std::string::npos) << what << ": " << s.message();
    EXPECT_NE(s.message().find(want), std::string::npos) << what << ": " << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos) << what << ": " << s.message();
    EXPECT_EQ(s.message().find(path_), 0u) << what << ": " << s.message();
  }
  std::unique_ptr<TempDir> tmp_;
  std::string path_;
};

TEST_F(LoadRunConfigTest, TheTinyConfigAndTheRangesEndsLoad) {
  EXPECT_TRUE(Load({}).ok()) << Load({}).message();
  const Status ends = Load({"train.threads=1024", "train.eval_batches=0", "train.keep_last=0", "parallel.dp=65536",
                            "train.seed=0", "model.n_layers=1024", "model.n_dense_layers=1"});
  EXPECT_TRUE(ends.ok()) << ends.message();
}

// Defect 4: sizes built from several keys that do not fit 64 bits.
TEST_F(LoadRunConfigTest, SizesThatOverflowAreRefusedNamingTheKeys) {
  // Every key in range; the experts' parameters (2^10 layers x 2^8 experts
  // x 2^20 x 2^22) do not fit in 64-bit byte counts.
  ExpectRefused({"model.n_layers=1024", "model.n_dense_layers=1", "model.n_routed_experts=256", "model.d_model=1048576",
                 "model.n_heads=4096", "model.n_kv_heads=4096", "model.d_expert=4194304"},
                "model.n_layers, model.n_routed_experts, model.d_model, model.d_expert",
                "the parameters' size overflows 64-bit integers");
  // One step's logits: 2^20 sequences x 2^16 micro-batches x 64 tokens x 2^31 vocabulary.
  ExpectRefused({"train.batch_size=1048576", "train.grad_accum=65536", "model.vocab_size=2147483647"},
                "train.batch_size, train.grad_accum, train.seq_len, model.vocab_size", "one step's activations' size overflows");
  // The RoPE-table case of the report: a huge d_model is out of range.
  ExpectRefused({"model.vocab_size=2147483647", "model.d_model=8589934592"}, "model.d_model=8589934592",
                "out of range [1, 1048576]");
  // Degrees whose product would wrap an int.
  ExpectRefused({"parallel.dp=65536", "parallel.tp=65536"}, "parallel.dp, parallel.tp", "exceeds 1048576");
}

// Defect 6: counts that make a run hang. Each: the --set, named back in the
// error, and what the error says.
TEST_F(LoadRunConfigTest, AbsurdCountsAreRefusedWithTheirRange) {
  for (auto [set, want] : {std::pair{"train.threads=100000", "out of range [0, 1024]"},
                           {"train.eval_batches=1000000000000", "out of range [0, 100000]"},
                           {"model.n_layers=100000000", "out of range [1, 1024]"},
                           {"train.batch_size=1000000000", "out of range [1, 1048576]"},
                           {"train.steps=0", "out of range [1, 1000000000]"},
                           {"train.steps=99999999999999999999", "does not fit in a 64-bit integer"}})
    ExpectRefused({set}, set, want);
}

// Defect 8: values refused late (or never) before.
TEST_F(LoadRunConfigTest, NonFiniteAndOutOfRangeValuesAreRefusedAtLoad) {
  for (auto [set, want] : {std::pair{"train.lr=inf", "must be a finite number"},
                           {"model.init_std=nan", "must be a finite number"},
                           {"train.min_lr=-inf", "must be a finite number"},
                           {"train.keep_last=-1", "out of range [0, 10000]"},
                           {"parallel.dp=4294967297", "out of range [1, 65536]"},
                           {"train.seed=-1", "out of range [0, 9223372036854775807]"},
                           {"model.aux_loss_weight=-1", "must be >= 0"}})
    ExpectRefused({set}, set, want);
}

TEST(TrainConfigValidate, NanIsRefusedInConfigsBuiltInCode) {
  TrainConfig t;
  EXPECT_TRUE(t.Validate().ok()) << t.Validate().message();
  t.optim.min_lr = std::nan("");
  EXPECT_NE(t.Validate().message().find("train.min_lr=nan must be a finite number"), std::string::npos)
      << t.Validate().message();
  t = TrainConfig();
  t.optim.beta2 = std::nan("");
  EXPECT_FALSE(t.Validate().ok());
  t = TrainConfig();
  t.keep_last = -1;
  EXPECT_NE(t.Validate().message().find("train.keep_last=-1"), std::string::npos) << t.Validate().message();
}

}  // namespace
}  // namespace myriad
