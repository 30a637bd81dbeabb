#include "data/shards.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/checksum.h"
#include "core/rng.h"
#include "data/test_util.h"

namespace myriad {
namespace {

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

template <typename T>
T At(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

std::vector<std::vector<int32_t>> RandomDocs(uint64_t seed, int n, uint32_t vocab) {
  Rng rng(seed);
  std::vector<std::vector<int32_t>> docs(n);
  for (auto& d : docs) {
    d.resize(rng.Below(50));  // includes empty documents
    for (auto& t : d) t = static_cast<int32_t>(rng.Below(vocab));
  }
  return docs;
}

std::string WriteShard(const std::string& path, uint32_t vocab,
                       const std::vector<std::vector<int32_t>>& docs) {
  ShardWriter w(path, vocab);
  for (const auto& d : docs) EXPECT_TRUE(w.AppendDocument(d).ok());
  Status st = w.Finish();
  EXPECT_TRUE(st.ok()) << st.message();
  return path;
}

TEST(Shards, RoundTripU16MatchesHandParsedLayout) {
  TempDir dir("shards");
  auto docs = RandomDocs(1, 37, 4096);
  std::string path = dir.path() + "/" + ShardFileName("train", 0);
  EXPECT_EQ(ShardFileName("train", 0), "train_000.bin");
  ShardWriter w(path, 4096);
  for (const auto& d : docs) ASSERT_TRUE(w.AppendDocument(d).ok());
  EXPECT_FALSE(std::filesystem::exists(path)) << "written before Finish";
  ASSERT_TRUE(w.Finish().ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  // Oracle: parse the bytes by hand from the documented layout.
  std::vector<int32_t> flat;
  for (const auto& d : docs) flat.insert(flat.end(), d.begin(), d.end());
  std::string bytes = ReadBytes(path);
  ASSERT_EQ(bytes.substr(0, 8), "MYRTOK01");
  EXPECT_EQ(At<uint32_t>(bytes, 8), 1u);
  EXPECT_EQ(At<uint16_t>(bytes, 12), 2u);
  EXPECT_EQ(At<uint32_t>(bytes, 16), 4096u);
  EXPECT_EQ(At<uint64_t>(bytes, 24), flat.size());
  EXPECT_EQ(At<uint64_t>(bytes, 32), docs.size());
  size_t padded = (flat.size() * 2 + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 48 + padded + (docs.size() + 1) * 8);
  EXPECT_EQ(At<uint64_t>(bytes, 40), Checksum64(bytes.data() + 48, bytes.size() - 48));
  std::string header = bytes.substr(0, 48);
  std::memset(header.data() + 20, 0, 4);
  EXPECT_EQ(At<uint32_t>(bytes, 20), static_cast<uint32_t>(Checksum64(header)));
  for (size_t i = 0; i < flat.size(); ++i) ASSERT_EQ(At<uint16_t>(bytes, 48 + 2 * i), flat[i]);
  uint64_t off = 0;
  for (size_t d = 0; d <= docs.size(); ++d) {
    ASSERT_EQ(At<uint64_t>(bytes, 48 + padded + 8 * d), off);
    if (d < docs.size()) off += docs[d].size();
  }

  auto r = ShardReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_tokens(), flat.size());
  EXPECT_EQ(r->num_documents(), docs.size());
  EXPECT_EQ(r->vocab_size(), 4096u);
  EXPECT_EQ(r->token_bytes(), 2);
  for (size_t d = 0; d < docs.size(); ++d) EXPECT_EQ(r->ReadDocument(d), docs[d]);
  std::vector<int32_t> all(flat.size());
  r->Read(0, flat.size(), all.data());
  EXPECT_EQ(all, flat);
  EXPECT_EQ(r->token(flat.size() - 1), flat.back());
}

TEST(Shards, RoundTripU32ForLargeVocab) {
  TempDir dir("shards32");
  auto docs = RandomDocs(2, 9, 70000);
  docs[0].push_back(69999);
  std::string path = WriteShard(dir.path() + "/val_000.bin", 70000, docs);
  std::string bytes = ReadBytes(path);
  EXPECT_EQ(At<uint16_t>(bytes, 12), 4u);
  auto r = ShardReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->token_bytes(), 4);
  for (size_t d = 0; d < docs.size(); ++d) EXPECT_EQ(r->ReadDocument(d), docs[d]);
}

TEST(Shards, VocabOf65536StillFitsU16) {
  TempDir dir("shards16");
  std::string path = WriteShard(dir.path() + "/a.bin", 65536, {{0, 65535}});
  auto r = ShardReader::Open(path);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->token_bytes(), 2);
  EXPECT_EQ(r->ReadDocument(0), (std::vector<int32_t>{0, 65535}));
}

TEST(Shards, EmptyShardIsValid) {
  TempDir dir("shards0");
  std::string path = WriteShard(dir.path() + "/e.bin", 100, {});
  auto r = ShardReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_tokens(), 0u);
  EXPECT_EQ(r->num_documents(), 0u);
}

TEST(Shards, WriterRejectsIdOutsideVocab) {
  TempDir dir("shardsbad");
  ShardWriter w(dir.path() + "/x.bin", 100);
  Status st = w.AppendDocument(std::vector<int32_t>{1, 2, 100});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("id 100 at position 2"), std::string::npos) << st.message();
  EXPECT_EQ(w.num_tokens(), 0u);
  EXPECT_FALSE(w.AppendDocument(std::vector<int32_t>{-1}).ok());
}

class CorruptShard : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TempDir>("shardcorrupt");
    path_ = WriteShard(dir_->path() + "/train_000.bin", 4096, RandomDocs(3, 200, 4096));
    bytes_ = ReadBytes(path_);
  }
  std::string OpenError() {
    auto r = ShardReader::Open(path_);
    EXPECT_FALSE(r.ok());
    if (r.ok()) return "";
    std::string m = r.status().message();
    EXPECT_EQ(m.rfind(path_ + ": ", 0), 0u) << "message must start with the path: " << m;
    EXPECT_NE(m.find("hint: re-run `myriad prepare`"), std::string::npos) << m;
    return m;
  }
  std::unique_ptr<TempDir> dir_;
  std::string path_, bytes_;
};

TEST_F(CorruptShard, TruncatedFileSaysHowManyTokens) {
  WriteBytes(path_, bytes_.substr(0, 48 + 2 * 100));
  std::string m = OpenError();
  uint64_t tokens = At<uint64_t>(bytes_, 24);
  EXPECT_NE(m.find("truncated: header says " + std::to_string(tokens) + " tokens"), std::string::npos) << m;
}

TEST_F(CorruptShard, TruncatedToHalf) {
  WriteBytes(path_, bytes_.substr(0, bytes_.size() / 2));
  std::string m = OpenError();
  EXPECT_NE(m.find("truncated: header says"), std::string::npos) << m;
}

TEST_F(CorruptShard, TruncatedByOneByte) {
  WriteBytes(path_, bytes_.substr(0, bytes_.size() - 1));
  EXPECT_NE(OpenError().find("truncated"), std::string::npos);
}

TEST_F(CorruptShard, ShorterThanHeader) {
  WriteBytes(path_, bytes_.substr(0, 20));
  EXPECT_NE(OpenError().find("shorter than the 48-byte shard header"), std::string::npos);
}

TEST_F(CorruptShard, FlippedPayloadByteFailsChecksum) {
  for (size_t at : {size_t{48}, bytes_.size() / 2, bytes_.size() - 1}) {
    std::string b = bytes_;
    b[at] ^= 0x10;
    WriteBytes(path_, b);
    std::string m = OpenError();
    EXPECT_NE(m.find("corrupt: payload checksum"), std::string::npos) << "flip at " << at << ": " << m;
  }
}

TEST_F(CorruptShard, FlippedHeaderCountIsCaught) {
  std::string b = bytes_;
  b[24] ^= 0x01;  // token_count off by one
  WriteBytes(path_, b);
  std::string m = OpenError();
  EXPECT_NE(m.find("corrupt header: header checksum"), std::string::npos) << m;
}

TEST_F(CorruptShard, ForeignMagicAndVersion) {
  std::string b = bytes_;
  std::memcpy(b.data(), "PK\x03\x04zip!", 8);
  WriteBytes(path_, b);
  EXPECT_NE(OpenError().find("not a Myriad token shard"), std::string::npos);
  b = bytes_;
  b[8] = 9;
  WriteBytes(path_, b);
  EXPECT_NE(OpenError().find("unsupported shard version 9"), std::string::npos);
}

TEST(Shards, MissingFileNamesPath) {
  auto r = ShardReader::Open("/nonexistent/train_000.bin");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/train_000.bin"), std::string::npos);
}

}  // namespace
}  // namespace myriad
