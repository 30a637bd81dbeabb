#include "data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "data/shards.h"
#include "data/test_util.h"

namespace myriad {
namespace {

// Shards whose token at stream position p is p itself, so every row tells
// where it came from. Shard sizes are uneven (and one is empty) so rows
// straddle shard boundaries.
class LoaderTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kVocab = 1 << 20;
  void SetUp() override { dir_ = std::make_unique<TempDir>("loader"); }
  void WriteSplit(const std::string& split, const std::vector<uint64_t>& shard_sizes,
                  uint64_t doc_len = 13) {
    uint64_t pos = 0;
    for (size_t s = 0; s < shard_sizes.size(); ++s) {
      ShardWriter w(dir_->path() + "/" + ShardFileName(split, static_cast<int>(s)), kVocab);
      uint64_t end = pos + shard_sizes[s];
      while (pos < end) {
        std::vector<int32_t> doc;
        for (uint64_t k = 0; k < doc_len && pos < end; ++k) doc.push_back(static_cast<int32_t>(pos++));
        ASSERT_TRUE(w.AppendDocument(doc).ok());
      }
      ASSERT_TRUE(w.Finish().ok());
    }
  }
  std::unique_ptr<DataLoader> Open(const std::string& split, int seq_len, uint64_t seed) {
    auto r = DataLoader::Open(dir_->path(), split, seq_len, seed);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? std::move(r.value()) : nullptr;
  }
  std::string OpenError(const std::string& split, int seq_len) {
    auto r = DataLoader::Open(dir_->path(), split, seq_len, 1);
    EXPECT_FALSE(r.ok());
    return r.ok() ? "" : r.status().message();
  }
  std::unique_ptr<TempDir> dir_;
};

// Brute force: every window start a row may have, written out directly.
std::vector<int32_t> ExpectedRowStarts(uint64_t tokens, int seq_len) {
  std::vector<int32_t> starts;
  for (uint64_t s = 0; s + seq_len + 1 <= tokens; s += seq_len) starts.push_back(static_cast<int32_t>(s));
  return starts;
}

TEST_F(LoaderTest, EveryWindowExactlyOncePerEpoch) {
  WriteSplit("train", {1000, 0, 337, 64, 1});  // 1402 tokens
  const int L = 16;
  auto loader = Open("train", L, 42);
  ASSERT_TRUE(loader);
  EXPECT_EQ(loader->num_tokens(), 1402u);
  EXPECT_EQ(loader->num_shards(), 4u);  // the empty shard is skipped
  std::vector<int32_t> expected = ExpectedRowStarts(1402, L);
  ASSERT_EQ(loader->num_rows(), expected.size());

  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int32_t> starts;
    std::vector<int32_t> batch(static_cast<size_t>(7) * (L + 1));
    // Draw exactly one epoch's worth, in batches of 7 and one remainder.
    uint64_t left = loader->num_rows();
    while (left > 0) {
      int b = static_cast<int>(std::min<uint64_t>(7, left));
      loader->NextBatch(b, batch.data());
      for (int r = 0; r < b; ++r) {
        const int32_t* row = batch.data() + r * (L + 1);
        for (int k = 0; k <= L; ++k) ASSERT_EQ(row[k], row[0] + k) << "row not contiguous";
        starts.push_back(row[0]);
      }
      left -= b;
    }
    EXPECT_EQ(loader->cursor().epoch, epoch);
    EXPECT_EQ(loader->cursor().index, loader->num_rows());
    EXPECT_FALSE(std::is_sorted(starts.begin(), starts.end())) << "not shuffled";
    std::sort(starts.begin(), starts.end());
    EXPECT_EQ(starts, expected) << "epoch " << epoch;
  }
}

TEST_F(LoaderTest, ExactFitAndTailDropped) {
  WriteSplit("val", {33});  // 2 rows of 17 tokens overlapping by one: 0..16, 16..32
  auto loader = Open("val", 16, 1);
  ASSERT_TRUE(loader);
  EXPECT_EQ(loader->num_rows(), 2u);
  std::vector<int32_t> row(17);
  loader->ReadRow(1, row.data());
  EXPECT_EQ(row.front(), 16);
  EXPECT_EQ(row.back(), 32);

  WriteSplit("short", {32});  // one token short of a second row
  auto shorter = Open("short", 16, 1);
  ASSERT_TRUE(shorter);
  EXPECT_EQ(shorter->num_rows(), 1u);
}

std::vector<int32_t> Draw(DataLoader* loader, int batches, int batch) {
  std::vector<int32_t> out;
  std::vector<int32_t> buf(static_cast<size_t>(batch) * (loader->seq_len() + 1));
  for (int i = 0; i < batches; ++i) {
    loader->NextBatch(batch, buf.data());
    out.insert(out.end(), buf.begin(), buf.end());
  }
  return out;
}

TEST_F(LoaderTest, DeterministicForSeedAndDifferentForOtherSeed) {
  WriteSplit("train", {3000});
  auto a = Open("train", 8, 7), b = Open("train", 8, 7), c = Open("train", 8, 8);
  ASSERT_TRUE(a && b && c);
  std::vector<int32_t> da = Draw(a.get(), 10, 4), db = Draw(b.get(), 10, 4), dc = Draw(c.get(), 10, 4);
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  // Two epochs of the same seed are ordered differently.
  EXPECT_NE(a->RowAt(7, 0, 0) * 1000 + a->RowAt(7, 0, 1), a->RowAt(7, 1, 0) * 1000 + a->RowAt(7, 1, 1));
}

TEST_F(LoaderTest, SeekResumesIdenticalBatchesAcrossEpochs) {
  WriteSplit("train", {500, 77});
  const int L = 10;
  auto first = Open("train", L, 3);
  ASSERT_TRUE(first);
  ASSERT_EQ(first->num_rows(), 57u);
  Draw(first.get(), 6, 5);  // 30 rows into epoch 0
  DataCursor saved = first->cursor();
  EXPECT_EQ(saved, (DataCursor{0, 30, 3}));
  std::vector<int32_t> expected = Draw(first.get(), 10, 5);  // runs into epoch 1
  EXPECT_EQ(first->cursor().epoch, 1u);

  // Through JSON, into a loader opened with another seed.
  auto json = saved.ToJson();
  EXPECT_EQ(json.dump(), R"({"epoch":0,"index":30,"seed":3})");
  auto restored = DataCursor::FromJson(nlohmann::json::parse(json.dump()));
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(restored.value(), saved);
  auto second = Open("train", L, 999);
  ASSERT_TRUE(second);
  ASSERT_TRUE(second->Seek(restored.value()).ok());
  EXPECT_EQ(Draw(second.get(), 10, 5), expected);

  // Seek backwards on the same loader, and with a different batch size.
  ASSERT_TRUE(first->Seek(saved).ok());
  EXPECT_EQ(Draw(first.get(), 25, 2), expected);
}

TEST_F(LoaderTest, SeekRejectsCursorBeyondData) {
  WriteSplit("train", {100});
  auto loader = Open("train", 10, 1);
  ASSERT_TRUE(loader);
  Status st = loader->Seek({0, 1000, 1});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("index 1000 is beyond the 9 rows"), std::string::npos) << st.message();
}

TEST_F(LoaderTest, TooSmallSplitIsAClearError) {
  WriteSplit("val", {20});
  std::string m = OpenError("val", 64);
  EXPECT_NE(m.find("val: 20 tokens are too few for one row of seq_len+1=65"), std::string::npos) << m;
  EXPECT_NE(m.find("hint"), std::string::npos);
}

TEST_F(LoaderTest, MissingDataAndGapsAreClearErrors) {
  std::string m = OpenError("train", 8);
  EXPECT_NE(m.find("no train_*.bin shards"), std::string::npos) << m;
  WriteSplit("train", {50, 50, 50});
  std::filesystem::remove(dir_->path() + "/train_001.bin");
  m = OpenError("train", 8);
  EXPECT_NE(m.find("train_001.bin: missing"), std::string::npos) << m;
  auto r = DataLoader::Open(dir_->path() + "/nope", "train", 8, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("myriad prepare"), std::string::npos);
  EXPECT_NE(OpenError("train", 0).find("seq_len=0"), std::string::npos);
}

TEST_F(LoaderTest, CorruptShardErrorSurfaces) {
  WriteSplit("train", {100});
  std::string path = dir_->path() + "/train_000.bin";
  std::filesystem::resize_file(path, 100);
  std::string m = OpenError("train", 8);
  EXPECT_NE(m.find(path + ": truncated"), std::string::npos) << m;
}

TEST(DataCursorJson, RejectsBadFields) {
  auto missing = DataCursor::FromJson(nlohmann::json{{"epoch", 1}, {"seed", 2}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'index' is missing"), std::string::npos);
  auto negative = DataCursor::FromJson(nlohmann::json{{"epoch", -1}, {"index", 0}, {"seed", 2}});
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("'epoch' is -1"), std::string::npos);
  auto text = DataCursor::FromJson(nlohmann::json{{"epoch", 1}, {"index", "3"}, {"seed", 2}});
  EXPECT_FALSE(text.ok());
  EXPECT_FALSE(DataCursor::FromJson(nlohmann::json::array()).ok());
  auto big = DataCursor::FromJson(
      nlohmann::json::parse(R"({"epoch": 2, "index": 5, "seed": 18446744073709551615})"));
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->seed, 18446744073709551615ULL);
}

}  // namespace
}  // namespace myriad
