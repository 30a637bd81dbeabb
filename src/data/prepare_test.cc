#include "data/prepare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/shards.h"
#include "data/test_util.h"
#include "data/tokenizer.h"

namespace myriad {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Write(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// A folder corpus with three sources; returns every file's text (the oracle).
std::vector<std::string> MakeCorpus(const std::string& dir) {
  std::vector<std::string> texts;
  auto add = [&](const std::string& rel, const std::string& text) {
    Write(dir + "/" + rel, text);
    texts.push_back(text);
  };
  const char* words[] = {"alpha", "beta", "gamma", "delta", "river", "stone", "light", "night"};
  for (int i = 0; i < 40; ++i) {
    std::string t;
    for (int k = 0; k < 30; ++k) t += std::string(words[(i * 7 + k * 3) % 8]) + (k % 9 == 8 ? ".\n" : " ");
    add("en/doc" + std::to_string(i) + ".txt", t);
  }
  const char* poems[] = {"床前明月光，疑是地上霜。", "举头望明月，低头思故乡。", "白日依山尽，黄河入海流。"};
  for (int i = 0; i < 20; ++i) add("zh/p" + std::to_string(i) + ".txt", std::string(poems[i % 3]) + "\n" + poems[(i + 1) % 3] + " 🌙 " + std::to_string(i));
  for (int i = 0; i < 20; ++i) {
    add("code/m" + std::to_string(i) + ".py",
        "def f" + std::to_string(i) + "(x):\n    if x:\n        return x * " + std::to_string(i) +
            "\n\treturn None\n\n\nclass C:\n    pass\n");
  }
  return texts;
}

TEST(Prepare, ShardsDecodeBackToTheCorpus) {
  TempDir dir("prepare");
  std::vector<std::string> texts = MakeCorpus(dir.path() + "/in");
  PrepareOptions o;
  o.input_dir = dir.path() + "/in";
  o.out_dir = dir.path() + "/out";
  o.vocab_size = 400;
  o.val_fraction = 0.1;
  o.num_threads = 2;
  o.shard_max_tokens = 2000;  // force several train shards
  Write(o.out_dir + "/train_007.bin", "stale shard of an earlier run");
  Status st = RunPrepare(o);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_FALSE(std::filesystem::exists(o.out_dir + "/train_007.bin"));

  nlohmann::json data = nlohmann::json::parse(ReadAll(o.out_dir + "/data.json"));
  auto tok = Tokenizer::Load(o.out_dir + "/" + data["tokenizer"].get<std::string>());
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(data["vocab_size"], tok->vocab_size());
  EXPECT_EQ(data["eos_id"], tok->eos_id());
  EXPECT_EQ(data["bos_id"], tok->bos_id());

  // Every document, decoded from the shards, is one of the input files, and
  // every input file comes back exactly once.
  std::vector<std::string> decoded;
  uint64_t total_docs = 0;
  for (const std::string split : {"train", "val"}) {
    const auto& info = data["splits"][split];
    ASSERT_GE(info["shards"].size(), 1u) << split;
    uint64_t tokens = 0, docs = 0;
    for (const auto& name : info["shards"]) {
      auto shard = ShardReader::Open(o.out_dir + "/" + name.get<std::string>());
      ASSERT_TRUE(shard.ok()) << shard.status().message();
      EXPECT_EQ(shard->vocab_size(), static_cast<uint32_t>(tok->vocab_size()));
      for (uint64_t d = 0; d < shard->num_documents(); ++d) {
        std::vector<int32_t> ids = shard->ReadDocument(d);
        ASSERT_FALSE(ids.empty());
        ASSERT_EQ(ids.back(), tok->eos_id()) << "documents end with eos";
        ids.pop_back();
        decoded.push_back(tok->Decode(ids));
      }
      tokens += shard->num_tokens();
      docs += shard->num_documents();
    }
    EXPECT_EQ(info["tokens"].get<uint64_t>(), tokens);
    EXPECT_EQ(info["documents"].get<uint64_t>(), docs);
    total_docs += docs;
  }
  EXPECT_GE(data["splits"]["train"]["shards"].size(), 2u);
  EXPECT_EQ(total_docs, texts.size());
  std::sort(decoded.begin(), decoded.end());
  std::sort(texts.begin(), texts.end());
  EXPECT_EQ(decoded, texts);

  // Each source has documents in both splits.
  for (const char* source : {"en", "zh", "code"}) {
    EXPECT_GE(data["sources"][source]["val"]["documents"].get<int>(), 1) << source;
    EXPECT_GE(data["sources"][source]["train"]["documents"].get<int>(), 1) << source;
  }

  auto loader = DataLoader::Open(o.out_dir, "train", 32, 1);
  ASSERT_TRUE(loader.ok()) << loader.status().message();
  EXPECT_EQ((*loader)->num_tokens(), data["splits"]["train"]["tokens"].get<uint64_t>());

  // Deterministic: a second run writes identical bytes.
  std::string first_shard = ReadAll(o.out_dir + "/train_000.bin");
  std::string first_model = ReadAll(o.out_dir + "/tokenizer.model");
  ASSERT_TRUE(RunPrepare(o).ok());
  EXPECT_EQ(ReadAll(o.out_dir + "/train_000.bin"), first_shard);
  EXPECT_EQ(ReadAll(o.out_dir + "/tokenizer.model"), first_model);
}

TEST(Prepare, MaxBytesCapsEverySource) {
  TempDir dir("preparecap");
  MakeCorpus(dir.path() + "/in");
  PrepareOptions o;
  o.input_dir = dir.path() + "/in";
  o.out_dir = dir.path() + "/out";
  o.vocab_size = 400;
  o.max_bytes = 4000;
  Status st = RunPrepare(o);
  ASSERT_TRUE(st.ok()) << st.message();
  nlohmann::json data = nlohmann::json::parse(ReadAll(o.out_dir + "/data.json"));
  uint64_t bytes = data["splits"]["train"]["bytes"].get<uint64_t>() + data["splits"]["val"]["bytes"].get<uint64_t>();
  EXPECT_LE(bytes, 4000u);
  EXPECT_GT(bytes, 2000u);
  for (const char* source : {"en", "zh", "code"}) {
    EXPECT_GE(data["sources"][source]["train"]["documents"].get<int>() +
                  data["sources"][source]["val"]["documents"].get<int>(),
              1)
        << source;
  }
}

TEST(Prepare, VocabTooSmallForTheCharactersIsAClearError) {
  TempDir dir("preparesmall");
  MakeCorpus(dir.path() + "/in");
  PrepareOptions o;
  o.input_dir = dir.path() + "/in";
  o.out_dir = dir.path() + "/out";
  o.vocab_size = 270;
  Status st = RunPrepare(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocab_size=270 is too small for this text"), std::string::npos)
      << st.message();
}

TEST(Prepare, BadOptionsAndInputAreClearErrors) {
  PrepareOptions o;
  o.val_fraction = 0.9;
  Status st = RunPrepare(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("val_fraction=0.9"), std::string::npos) << st.message();
  o = PrepareOptions();
  o.vocab_size = 10;
  EXPECT_NE(RunPrepare(o).message().find("vocab_size=10"), std::string::npos);
  TempDir dir("preparebad");
  o = PrepareOptions();
  o.input_dir = dir.path() + "/missing";
  o.out_dir = dir.path() + "/out";
  st = RunPrepare(o);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(o.input_dir), std::string::npos) << st.message();
}

}  // namespace
}  // namespace myriad
