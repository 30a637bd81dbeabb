// HfWeights on folders built here: one file or shards with an index, F32,
// BF16 and F16 tensors of known bit patterns (the fp32 values are exact
// closed forms), and every bad folder the import must name. WriteHfWeights
// read back by HfWeights and by the hand-written Python reader
// (tests/golden/safetensors_io.py).
#include "model/hf/hf_weights.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

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

// Tensors of every written dtype with values exact in it: [0] F32 [2, 3]
// (not BF16 values), [1] BF16 [4], [2] F16 [3] (-0, the smallest subnormal,
// the largest finite), [3] F32 [5].
struct WriteCase {
  std::vector<float> f32a = {0.1f, -2.f, 1e-30f, 3.25f, -0.3f, 7.f};
  std::vector<float> bf = {1.5f, -2.f, 0.5f + std::ldexp(1.f, -8), std::ldexp(1.f, -126)};
  std::vector<float> hf = {-0.f, std::ldexp(1.f, -24), 65504.f};
  std::vector<float> f32b = {1, 2, 3, 4, 5};
  std::vector<HfTensorToWrite> tensors() const {
    return {{"model.a.weight", {2, 3}, f32a.data(), "F32"},
            {"model.b.weight", {4}, bf.data(), "BF16"},
            {"model.c.weight", {3}, hf.data(), "F16"},
            {"lm_head.weight", {5}, f32b.data(), "F32"}};
  }
};

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_F(HfWeightsTest, WriterShardsBySizeAndReadsBackBitwise) {
  WriteCase wc;
  // 24 + 8 bytes fit in 32, 6 + 20 in the next: two shards.
  HfWriteOptions opt;
  opt.max_shard_bytes = 32;
  auto wr = WriteHfWeights(Env::Default(), dir_, wc.tensors(), opt);
  ASSERT_TRUE(wr.ok()) << wr.status().message();
  EXPECT_EQ(wr->files, (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                 "model-00002-of-00002.safetensors", kIndexFile}));
  EXPECT_EQ(wr->total_size, 58u);
  const auto index = nlohmann::json::parse(ReadText(dir_ + "/" + kIndexFile));
  EXPECT_EQ(index["metadata"]["total_size"], 58);
  EXPECT_EQ(index["weight_map"]["model.b.weight"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["model.c.weight"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 4u);
  EXPECT_FALSE(fs::exists(dir_ + "/" + kSingleFile));
  for (const auto& e : fs::directory_iterator(dir_)) EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  auto w = HfWeights::Open(dir_);
  ASSERT_TRUE(w.ok()) << w.status().message();
  for (const HfTensorToWrite& t : wc.tensors()) {
    EXPECT_EQ(w->Find(t.name)->dtype, t.dtype) << t.name;
    auto v = w->ReadF32(t.name, t.shape);
    ASSERT_TRUE(v.ok()) << v.status().message();
    ASSERT_EQ(v->size(), static_cast<size_t>(NumElements(t.shape)));
    EXPECT_EQ(std::memcmp(v->data(), t.data, v->size() * 4), 0) << t.name;  // bitwise (-0 included)
  }
  SafetensorsFile f = std::move(SafetensorsFile::Open(dir_ + "/model-00002-of-00002.safetensors")).value();
  EXPECT_EQ(f.metadata().at("format"), "pt");

  // No limit, or one the whole fits in: one file, no index.
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  opt.max_shard_bytes = 58;
  wr = WriteHfWeights(Env::Default(), dir_, wc.tensors(), opt);
  ASSERT_TRUE(wr.ok()) << wr.status().message();
  EXPECT_EQ(wr->files, (std::vector<std::string>{kSingleFile}));
  EXPECT_FALSE(fs::exists(dir_ + "/" + kIndexFile));
  ASSERT_TRUE(HfWeights::Open(dir_).ok());
}

TEST_F(HfWeightsTest, WriterRefusesRoundingBeforeWritingAnything) {
  WriteCase wc;
  auto t = wc.tensors();
  t[0].dtype = "BF16";  // 0.1f is not a bfloat16 value
  auto wr = WriteHfWeights(Env::Default(), dir_, t);
  ASSERT_FALSE(wr.ok());
  EXPECT_EQ(wr.status().message(), dir_ + ": tensor model.a.weight element 0 = 0.100000001 is not exactly "
                                          "representable in BF16 (hint: write F32, the default; BF16 is for "
                                          "weights that are BF16 values already)");
  t = wc.tensors();
  t[1].dtype = "F16";  // 2^-126 is below F16's smallest subnormal
  wr = WriteHfWeights(Env::Default(), dir_, t);
  ASSERT_FALSE(wr.ok());
  EXPECT_NE(wr.status().message().find("tensor model.b.weight element 3 = 1.17549435e-38 is not exactly "
                                       "representable in F16"),
            std::string::npos)
      << wr.status().message();
  t = wc.tensors();
  t[3].name = t[0].name;
  wr = WriteHfWeights(Env::Default(), dir_, t);
  ASSERT_FALSE(wr.ok());
  EXPECT_NE(wr.status().message().find("tensor model.a.weight is given twice"), std::string::npos);
  EXPECT_TRUE(fs::is_empty(dir_));
}

// The independent reader: tests/golden/safetensors_io.py (numpy/torch, by
// hand) reads each shard the index names and prints every tensor's dtype,
// shape and values as float64 JSON.
TEST_F(HfWeightsTest, WriterOutputReadByTheIndependentPythonReader) {
  const char* src = std::getenv("MYRIAD_SOURCE_DIR");
  if (!src || std::system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "needs MYRIAD_SOURCE_DIR (ctest sets it) and /usr/bin/python3 with torch and numpy";
  WriteCase wc;
  HfWriteOptions opt;
  opt.max_shard_bytes = 32;
  ASSERT_TRUE(WriteHfWeights(Env::Default(), dir_, wc.tensors(), opt).ok());
  WriteText("read.py", std::string(R"PY(
import json, sys
sys.path.insert(0, sys.argv[1] + "/tests/golden")
from safetensors_io import read_safetensors
import torch
folder = sys.argv[2]
index = json.load(open(folder + "/model.safetensors.index.json"))
out = {}
for shard in sorted(set(index["weight_map"].values())):
    tensors, meta = read_safetensors(folder + "/" + shard)
    assert meta.get("format") == "pt", meta
    for name, t in tensors.items():
        assert index["weight_map"][name] == shard, name
        out[name] = {"dtype": str(t.dtype), "shape": list(t.shape),
                     "values": [float(v) for v in t.to(torch.float64).flatten()],
                     "signs": [bool(v) for v in torch.signbit(t.to(torch.float32)).flatten()]}
assert set(out) == set(index["weight_map"]), (sorted(out), sorted(index["weight_map"]))
json.dump(out, open(folder + "/read.json", "w"))
)PY"));
  ASSERT_EQ(std::system(("/usr/bin/python3 " + dir_ + "/read.py " + src + " " + dir_).c_str()), 0);
  const auto got = nlohmann::json::parse(ReadText(dir_ + "/read.json"));
  const std::map<std::string, std::string> torch_dtype = {
      {"F32", "torch.float32"}, {"BF16", "torch.bfloat16"}, {"F16", "torch.float16"}};
  ASSERT_EQ(got.size(), 4u);
  for (const HfTensorToWrite& t : wc.tensors()) {
    const auto& g = got.at(t.name);
    EXPECT_EQ(g["dtype"], torch_dtype.at(t.dtype)) << t.name;
    EXPECT_EQ(g["shape"].get<std::vector<int64_t>>(), t.shape) << t.name;
    const auto values = g["values"].get<std::vector<double>>();
    const auto signs = g["signs"].get<std::vector<bool>>();
    ASSERT_EQ(values.size(), static_cast<size_t>(NumElements(t.shape)));
    for (size_t e = 0; e < values.size(); ++e) {
      EXPECT_EQ(values[e], static_cast<double>(t.data[e])) << t.name << "[" << e << "]";
      EXPECT_EQ(signs[e], std::signbit(t.data[e])) << t.name << "[" << e << "]";
    }
  }
}

}  // namespace
}  // namespace myriad::hf
