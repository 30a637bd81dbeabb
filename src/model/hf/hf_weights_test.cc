// HfWeights on folders built here: one file or shards with an index, F32,
// BF16 and F16 tensors of known bit patterns (the fp32 values are exact
// closed forms), and every bad folder the import must name.
#include "model/hf/hf_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/env.h"

namespace myriad::hf {
namespace {

namespace fs = std::filesystem;

class HfWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) /
            ("myriad_hf_" + std::to_string(getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void WriteFile(const std::string& name, const std::vector<TensorView>& t) {
    ASSERT_TRUE(WriteSafetensors(Env::Default(), dir_ + "/" + name, t, {{"format", "pt"}}).ok());
  }
  void WriteText(const std::string& name, const std::string& text) { std::ofstream(dir_ + "/" + name) << text; }
  // Two shards: a.weight (BF16 [2, 2]) and b.weight (F32 [3]) in the first,
  // c.weight (F16 [4]) in the second.
  void WriteSharded() {
    WriteFile("model-00001-of-00002.safetensors",
              {{"a.weight", "BF16", {2, 2}, bf16_, sizeof bf16_}, {"b.weight", "F32", {3}, f32_, sizeof f32_}});
    WriteFile("model-00002-of-00002.safetensors", {{"c.weight", "F16", {4}, f16_, sizeof f16_}});
    WriteText(kIndexFile, R"({"metadata": {"total_size": 28}, "weight_map": {
      "a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00001-of-00002.safetensors",
      "c.weight": "model-00002-of-00002.safetensors"}})");
  }
  std::string Error() {
    auto w = HfWeights::Open(dir_);
    EXPECT_FALSE(w.ok());
    return w.ok() ? "" : w.status().message();
  }
  std::string dir_;
  // 1.5, -2, 0.5 + 2^-8 (exact in bf16: 0x3F01), the smallest normal 2^-126.
  const uint16_t bf16_[4] = {0x3FC0, 0xC000, 0x3F01, 0x0080};
  const float f32_[3] = {0.25f, -7.f, 1e-30f};
  // 1, 65504 (largest), 2^-24 (smallest subnormal), -0.
  const uint16_t f16_[4] = {0x3C00, 0x7BFF, 0x0001, 0x8000};
};

TEST_F(HfWeightsTest, ShardsThroughTheIndexEveryDtypeExact) {
  WriteSharded();
  auto w = HfWeights::Open(dir_);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->names(), (std::vector<std::string>{"a.weight", "b.weight", "c.weight"}));
  auto a = w->ReadF32("a.weight", {2, 2});
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(*a, (std::vector<float>{1.5f, -2.f, 0.5f + std::ldexp(1.f, -8), std::ldexp(1.f, -126)}));
  auto b = w->ReadF32("b.weight", {3});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<float>{0.25f, -7.f, 1e-30f}));
  auto c = w->ReadF32("c.weight", {4});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], 1.f);
  EXPECT_EQ((*c)[1], 65504.f);
  EXPECT_EQ((*c)[2], std::ldexp(1.f, -24));
  EXPECT_EQ((*c)[3], 0.f);
  EXPECT_TRUE(std::signbit((*c)[3]));
  EXPECT_NE(w->FileOf("c.weight").find("model-00002-of-00002.safetensors"), std::string::npos);
}

TEST_F(HfWeightsTest, OneFileWithoutAnIndex) {
  WriteFile(kSingleFile, {{"w", "F32", {3}, f32_, sizeof f32_}});
  auto w = HfWeights::Open(dir_);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->names(), (std::vector<std::string>{"w"}));
}

TEST_F(HfWeightsTest, ReadingNamesTheTensorAndWhatIsWrong) {
  WriteSharded();
  auto w = HfWeights::Open(dir_);
  ASSERT_TRUE(w.ok());
  auto r = w->ReadF32("b.weight", {4});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor b.weight has shape [3] but the config expects [4]"), std::string::npos)
      << r.status().message();
  r = w->ReadF32("lm_head.weight", {2});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(": no tensor lm_head.weight"), std::string::npos);
  const int32_t ints[2] = {1, 2};
  WriteFile(kSingleFile, {{"i", "I32", {2}, ints, sizeof ints}});
  fs::remove(dir_ + "/" + kIndexFile);
  auto wi = HfWeights::Open(dir_);
  ASSERT_TRUE(wi.ok()) << wi.status().message();
  r = wi->ReadF32("i", {2});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor i has dtype I32; weights are read from F32, BF16 or F16"),
            std::string::npos)
      << r.status().message();
}

TEST_F(HfWeightsTest, BadFoldersAreOneLineNamingTheFile) {
  EXPECT_NE(Error().find("neither model.safetensors nor model.safetensors.index.json"), std::string::npos);
  WriteSharded();
  // A missing shard.
  fs::rename(dir_ + "/model-00002-of-00002.safetensors", dir_ + "/elsewhere");
  EXPECT_NE(Error().find("model-00002-of-00002.safetensors: missing (model.safetensors.index.json lists 1 tensors "
                         "in it, e.g. c.weight)"),
            std::string::npos)
      << Error();
  // A truncated shard.
  fs::copy_file(dir_ + "/elsewhere", dir_ + "/model-00002-of-00002.safetensors");
  fs::resize_file(dir_ + "/model-00002-of-00002.safetensors", fs::file_size(dir_ + "/elsewhere") - 3);
  EXPECT_NE(Error().find("model-00002-of-00002.safetensors"), std::string::npos) << Error();
  fs::remove(dir_ + "/model-00002-of-00002.safetensors");
  fs::rename(dir_ + "/elsewhere", dir_ + "/model-00002-of-00002.safetensors");
  ASSERT_TRUE(HfWeights::Open(dir_).ok());
  // A tensor the index puts in a shard that does not hold it.
  WriteText(kIndexFile, R"({"weight_map": {"a.weight": "model-00002-of-00002.safetensors",
    "c.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_NE(Error().find("puts a.weight in model-00002-of-00002.safetensors, which does not hold it"),
            std::string::npos)
      << Error();
  // A shard outside the folder, an index that is not JSON, no weight_map.
  WriteText(kIndexFile, R"({"weight_map": {"a.weight": "../model-00001-of-00002.safetensors"}})");
  EXPECT_NE(Error().find("weight_map[\"a.weight\"] is not a plain file name"), std::string::npos) << Error();
  WriteText(kIndexFile, "{\"weight_map\": ");
  EXPECT_NE(Error().find("model.safetensors.index.json: not a JSON object"), std::string::npos) << Error();
  WriteText(kIndexFile, "{\"metadata\": {}}");
  EXPECT_NE(Error().find("has no \"weight_map\" object"), std::string::npos) << Error();
  // One tensor in two shards.
  WriteFile("model-00002-of-00002.safetensors", {{"b.weight", "F32", {3}, f32_, sizeof f32_}});
  WriteText(kIndexFile, R"({"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
    "b.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_NE(Error().find("tensor b.weight is in both"), std::string::npos) << Error();
}

}  // namespace
}  // namespace myriad::hf
