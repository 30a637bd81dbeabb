// The lower KV tiers (T1 host, T2 disk, T3 Redis): round trips, LRU order,
// persistence, corruption and fault handling, and a printed read bandwidth.
// Oracles: exact equality for fp32, closed-form error bounds for fp16/int8,
// the test's own bookkeeping of which keys must be present.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/checksum.h"
#include "core/env.h"
#include "serve/kvcache/block_record.h"
#include "serve/kvcache/disk_tier.h"
#include "serve/kvcache/host_tier.h"
#include "serve/kvcache/redis_test_server.h"
#include "serve/kvcache/redis_tier.h"
#include "serve/kvcache/tier_test_util.h"
#include "serve/kvcache/tier.h"

namespace myriad::serve {
namespace {

namespace fs = std::filesystem;

// The demo model's shape (configs/demo-moe.toml): 4 layers, 4 kv heads of 32.
ModelConfig DemoConfig() { return testing::KvShape(4, 256, 8, 4); }

// Small shape for most tests: 2 layers x 2 x 16 tokens x 8 floats = 512.
constexpr int64_t kRow = 8;
constexpr int64_t kSmallFloats = 2 * 2 * kBlockTokens * kRow;

// Block data whose values depend on the key and index, with rows of very
// different magnitudes (so a per-block int8 scale would fail the bound).
KvBlock MakeBlock(BlockKey key, int64_t n = kSmallFloats, int64_t row = kRow) {
  KvBlock b;
  b.key = key;
  b.data.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float mag = std::pow(10.f, static_cast<float>((i / row) % 5) - 2.f);  // 0.01 .. 100
    b.data[i] = mag * std::sin(0.37f * static_cast<float>(i) + 0.011f * static_cast<float>(key % 1000));
  }
  return b;
}

std::string TempDir(const std::string& name) { return testing::FreshTempDir("tiers_" + name); }

ModelFingerprint Fp(uint64_t v) { return ModelFingerprint{v}; }

// ---------------------------------------------------------------- keys, records

TEST(KvTier, BlockFloatsAndChainKeys) {
  EXPECT_EQ(BlockFloats(DemoConfig()), 4 * 2 * 16 * 4 * 32);
  EXPECT_EQ(KvRowFloats(DemoConfig()), 4 * 32);
  // DSA: the indexer keys after the layers' k/v; int8 rows tile the whole block.
  ModelConfig dsa = DemoConfig();
  dsa.attention = "dsa", dsa.dsa_index_dim = 24, dsa.dsa_index_share = 3;  // 2 groups over 4 layers
  EXPECT_EQ(BlockFloats(dsa), 4 * 2 * 16 * 4 * 32 + 2 * 16 * 24);
  EXPECT_EQ(KvRowFloats(dsa), 8);
  EXPECT_EQ(BlockFloats(dsa) % KvRowFloats(dsa), 0);
  std::vector<int32_t> a(kBlockTokens), b(kBlockTokens);
  for (int i = 0; i < kBlockTokens; ++i) a[i] = b[i] = i + 100;
  b[15] = 7;
  const ModelFingerprint f1 = Fp(1), f2 = Fp(2);
  const BlockKey k = ChainKey(0, a.data(), kBlockTokens, f1);
  EXPECT_EQ(k, ChainKey(0, a.data(), kBlockTokens, f1));       // deterministic
  EXPECT_NE(k, ChainKey(0, b.data(), kBlockTokens, f1));       // tokens
  EXPECT_NE(k, ChainKey(0, a.data(), kBlockTokens, f2));       // model
  EXPECT_NE(k, ChainKey(k, a.data(), kBlockTokens, f1));       // parent: position in the chain
  EXPECT_NE(k, ChainKey(0, a.data(), kBlockTokens - 1, f1));   // length
  EXPECT_EQ(Fp(0xabc).hex(), "0000000000000abc");
}

TEST(KvTier, BlockRecordRejectsEveryBadField) {
  const KvBlock b = MakeBlock(42);
  const std::string rec = EncodeBlockRecord(b, Fp(9));
  ASSERT_EQ(rec.size(), kBlockRecordHeaderBytes + b.data.size() * 4);
  KvBlock out;
  ASSERT_TRUE(DecodeBlockRecord(rec, Fp(9), 42, kSmallFloats, &out).ok());
  EXPECT_EQ(out.data, b.data);
  EXPECT_FALSE(DecodeBlockRecord(rec, Fp(8), 42, 0, &out).ok());             // foreign model
  EXPECT_FALSE(DecodeBlockRecord(rec, Fp(9), 43, 0, &out).ok());             // other key
  EXPECT_FALSE(DecodeBlockRecord(rec, Fp(9), 42, kSmallFloats + 1, &out).ok());  // other shape
  EXPECT_FALSE(DecodeBlockRecord(rec.substr(0, rec.size() - 1), Fp(9), 42, 0, &out).ok());
  EXPECT_FALSE(DecodeBlockRecord(rec.substr(0, 10), Fp(9), 42, 0, &out).ok());
  for (size_t pos : {size_t{0}, size_t{5}, size_t{30}, rec.size() / 2, rec.size() - 1}) {
    std::string bad = rec;
    bad[pos] ^= 0x10;
    EXPECT_FALSE(DecodeBlockRecord(bad, Fp(9), 42, 0, &out).ok()) << "flip at " << pos;
  }
}

// ---------------------------------------------------------------- host (T1)

TEST(HostTier, Fp32RoundTripIsExact) {
  HostTier t({4, KvStorageFormat::kFp32, 0});
  const KvBlock b = MakeBlock(7);
  t.Put(b);
  KvBlock out;
  ASSERT_TRUE(t.Get(7, &out));
  EXPECT_EQ(out.key, 7u);
  EXPECT_EQ(out.data, b.data);
  EXPECT_FALSE(t.Get(8, &out));
  const TierStats s = t.stats();
  EXPECT_EQ(s.puts, 1);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.bytes_read, kSmallFloats * 4);
  EXPECT_EQ(t.resident_bytes(), kSmallFloats * 4);
}

TEST(HostTier, Fp16WithinHalfPrecisionBound) {
  HostTier t({4, KvStorageFormat::kFp16, 0});
  KvBlock b = MakeBlock(7);
  b.data[3] = 1e6f;  // beyond half range: clamps, never inf
  t.Put(b);
  EXPECT_EQ(t.resident_bytes(), kSmallFloats * 2);
  KvBlock out;
  ASSERT_TRUE(t.Get(7, &out));
  ASSERT_EQ(out.data.size(), b.data.size());
  EXPECT_EQ(out.data[3], 65504.f);
  for (size_t i = 0; i < b.data.size(); ++i) {
    if (i == 3) continue;
    // Round to nearest with 11 significant bits; subnormal spacing 2^-24.
    const float bound = std::fabs(b.data[i]) * 0x1p-11f + 0x1p-25f;
    EXPECT_LE(std::fabs(out.data[i] - b.data[i]), bound) << i;
  }
}

TEST(HostTier, Int8WithinPerRowScaleBound) {
  HostTier t({4, KvStorageFormat::kInt8, kRow});
  KvBlock b = MakeBlock(7);
  std::fill(b.data.begin() + kRow, b.data.begin() + 2 * kRow, 0.f);  // an all-zero row
  t.Put(b);
  EXPECT_EQ(t.resident_bytes(), (kSmallFloats / kRow) * (4 + kRow));
  KvBlock out;
  ASSERT_TRUE(t.Get(7, &out));
  ASSERT_EQ(out.data.size(), b.data.size());
  for (int64_t r = 0; r < kSmallFloats / kRow; ++r) {
    float amax = 0;
    for (int64_t i = 0; i < kRow; ++i) amax = std::max(amax, std::fabs(b.data[r * kRow + i]));
    for (int64_t i = 0; i < kRow; ++i) {
      const int64_t j = r * kRow + i;
      EXPECT_LE(std::fabs(out.data[j] - b.data[j]), amax / 254.f * 1.0001f + 1e-30f) << j;
    }
  }
  for (int64_t i = kRow; i < 2 * kRow; ++i) EXPECT_EQ(out.data[i], 0.f);
  // A block that is not whole rows is refused and counted.
  KvBlock odd = MakeBlock(8, kSmallFloats + 3);
  t.Put(odd);
  EXPECT_FALSE(t.Contains(8));
  EXPECT_EQ(t.stats().errors, 1);
}

TEST(HostTier, EvictsLeastRecentlyUsed) {
  HostTier t({3, KvStorageFormat::kFp32, 0});
  KvBlock out;
  t.Put(MakeBlock(1));
  t.Put(MakeBlock(2));
  t.Put(MakeBlock(3));
  ASSERT_TRUE(t.Get(1, &out));  // order now (most recent first): 1 3 2
  EXPECT_TRUE(t.Contains(2));   // Contains does not count as a use
  t.Put(MakeBlock(4));          // evicts 2
  EXPECT_FALSE(t.Contains(2));
  EXPECT_TRUE(t.Contains(1) && t.Contains(3) && t.Contains(4));
  EXPECT_EQ(t.ContainsMany({1, 2, 3}), (std::vector<bool>{true, false, true}));
  t.Put(MakeBlock(3));          // overwrite: refreshes 3, no eviction; order 3 4 1
  EXPECT_EQ(t.size_blocks(), 3);
  t.Put(MakeBlock(5));          // evicts 1
  EXPECT_FALSE(t.Contains(1));
  EXPECT_EQ(t.stats().evictions, 2);
  t.Evict(4);                   // explicit: not counted as an LRU eviction
  EXPECT_FALSE(t.Contains(4));
  EXPECT_EQ(t.size_blocks(), 2);
  EXPECT_EQ(t.stats().evictions, 2);
}

TEST(HostTier, SpillsWhatItEvictsForRoomOnly) {
  for (KvStorageFormat f : {KvStorageFormat::kFp32, KvStorageFormat::kFp16}) {
    HostTierOptions o;
    o.capacity_blocks = 2;
    o.format = f;
    HostTier t(o);
    std::vector<KvBlock> spilled;
    t.SetSpill([&](const KvBlock& b) { spilled.push_back(b); });
    t.Put(MakeBlock(1));
    t.Put(MakeBlock(2));
    EXPECT_TRUE(spilled.empty());
    t.Put(MakeBlock(3));  // evicts 1 for room: spilled, decoded to fp32
    ASSERT_EQ(spilled.size(), 1u);
    EXPECT_EQ(spilled[0].key, 1u);
    KvBlock want = MakeBlock(1);
    ASSERT_EQ(spilled[0].data.size(), want.data.size());
    for (size_t i = 0; i < want.data.size(); ++i)
      EXPECT_NEAR(spilled[0].data[i], want.data[i], f == KvStorageFormat::kFp32 ? 0.0 : std::fabs(want.data[i]) * 1e-3);
    t.Evict(2);  // removed on request: not spilled
    EXPECT_EQ(spilled.size(), 1u);
    t.Put(MakeBlock(4));
    t.SpillAll();  // everything held, most recent first; still held afterwards
    ASSERT_EQ(spilled.size(), 3u);
    EXPECT_EQ(spilled[1].key, 4u);
    EXPECT_EQ(spilled[2].key, 3u);
    EXPECT_TRUE(t.Contains(3) && t.Contains(4));
    t.SetSpill(nullptr);
    t.Put(MakeBlock(5));  // evicts without a spill function
    EXPECT_EQ(spilled.size(), 3u);
  }
}

TEST(HostTier, ConcurrentPutsAndGets) {
  HostTier t({16, KvStorageFormat::kFp32, 0});
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      KvBlock out;
      for (int i = 0; i < 300; ++i) {
        const BlockKey k = static_cast<BlockKey>(w * 1000 + i % 24);
        t.Put(MakeBlock(k));
        if (t.Get(k, &out) && out.data != MakeBlock(k).data) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(t.size_blocks(), 16);
}

// ---------------------------------------------------------------- disk (T2)

const int64_t kFileBytes = static_cast<int64_t>(kBlockRecordHeaderBytes) + kSmallFloats * 4;

DiskTierOptions DiskOpts(const std::string& dir, int64_t capacity_blocks, uint64_t fp = 1) {
  DiskTierOptions o;
  o.dir = dir;
  o.capacity_bytes = capacity_blocks * kFileBytes;
  o.fingerprint = Fp(fp);
  o.block_floats = kSmallFloats;
  return o;
}

TEST(DiskTier, RoundTripAndSurvivesReopen) {
  const std::string dir = TempDir("reopen");
  {
    auto t = DiskTier::Open(DiskOpts(dir, 8));
    ASSERT_TRUE(t.ok()) << t.status().message();
    (*t)->Put(MakeBlock(11));
    (*t)->Put(MakeBlock(12));
    EXPECT_TRUE(fs::exists((*t)->PathOf(11)));
    EXPECT_EQ(fs::path((*t)->PathOf(11)).filename().string(), ChecksumHex(11) + ".kvb");
    KvBlock out;
    ASSERT_TRUE((*t)->Get(11, &out));
    EXPECT_EQ(out.data, MakeBlock(11).data);
    EXPECT_EQ((*t)->resident_bytes(), 2 * kFileBytes);
  }
  std::ofstream(dir + "/" + ChecksumHex(13) + ".kvb.tmp") << "torn";  // a crash mid-write
  auto t = DiskTier::Open(DiskOpts(dir, 8));  // a new process, as far as the tier knows
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(fs::exists(dir + "/" + ChecksumHex(13) + ".kvb.tmp"));
  EXPECT_FALSE((*t)->Contains(13));
  EXPECT_EQ((*t)->size_blocks(), 2);
  EXPECT_TRUE((*t)->Contains(12));
  KvBlock out;
  ASSERT_TRUE((*t)->Get(12, &out));
  EXPECT_EQ(out.key, 12u);
  EXPECT_EQ(out.data, MakeBlock(12).data);
  EXPECT_EQ((*t)->stats().errors, 0);
  fs::remove_all(dir);
}

TEST(DiskTier, EvictsLeastRecentlyUsedByBytes) {
  const std::string dir = TempDir("lru");
  auto t = DiskTier::Open(DiskOpts(dir, 3));
  ASSERT_TRUE(t.ok());
  KvTier& d = **t;
  KvBlock out;
  d.Put(MakeBlock(1));
  d.Put(MakeBlock(2));
  d.Put(MakeBlock(3));
  ASSERT_TRUE(d.Get(1, &out));
  d.Put(MakeBlock(4));  // evicts 2, the least recently used
  EXPECT_FALSE(d.Contains(2));
  EXPECT_FALSE(fs::exists((*t)->PathOf(2)));
  EXPECT_TRUE(d.Contains(1) && d.Contains(3) && d.Contains(4));
  d.Put(MakeBlock(4));  // overwrite in place: no eviction
  EXPECT_EQ(d.stats().evictions, 1);
  EXPECT_EQ((*t)->resident_bytes(), 3 * kFileBytes);
  d.Evict(3);
  EXPECT_FALSE(fs::exists((*t)->PathOf(3)));
  EXPECT_EQ(d.size_blocks(), 2);
  // Reopening with less room evicts down to it.
  t = DiskTier::Open(DiskOpts(dir, 1));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->size_blocks(), 1);
  EXPECT_EQ((*t)->stats().evictions, 1);
  fs::remove_all(dir);
}

using testing::FlipByte;

TEST(DiskTier, CorruptFilesAreDetectedRemovedAndCounted) {
  const std::string dir = TempDir("corrupt");
  auto t = DiskTier::Open(DiskOpts(dir, 8));
  ASSERT_TRUE(t.ok());
  DiskTier& d = **t;
  for (BlockKey k : {21, 22, 23, 24}) d.Put(MakeBlock(k));
  FlipByte(d.PathOf(21), kFileBytes / 2);                        // a payload bit
  fs::resize_file(d.PathOf(22), kFileBytes - 100);               // truncated
  fs::copy_file(d.PathOf(24), d.PathOf(23), fs::copy_options::overwrite_existing);  // wrong key
  KvBlock out;
  int64_t errors = 0;
  for (BlockKey k : {21, 22, 23}) {
    EXPECT_FALSE(d.Get(k, &out)) << k;
    EXPECT_EQ(d.stats().errors, ++errors);
    EXPECT_FALSE(d.Contains(k));
    EXPECT_FALSE(fs::exists(d.PathOf(k))) << k;
  }
  ASSERT_TRUE(d.Get(24, &out));  // the intact one is untouched
  EXPECT_EQ(out.data, MakeBlock(24).data);
  EXPECT_EQ(d.size_blocks(), 1);
  // A corrupt file found at open is indexed, then caught by Get the same way.
  FlipByte(d.PathOf(24), kFileBytes - 1);
  t = DiskTier::Open(DiskOpts(dir, 8));
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->Get(24, &out));
  EXPECT_EQ((*t)->stats().errors, 1);
  EXPECT_EQ((*t)->stats().misses, 1);
  EXPECT_EQ((*t)->size_blocks(), 0);
  fs::remove_all(dir);
}

TEST(DiskTier, ForeignFingerprintIsIgnoredNotDeleted) {
  const std::string dir = TempDir("foreign");
  {
    auto a = DiskTier::Open(DiskOpts(dir, 8, /*fp=*/1));
    ASSERT_TRUE(a.ok());
    (*a)->Put(MakeBlock(31));
  }
  // Stray files that are not blocks are left alone too.
  std::ofstream(dir + "/README") << "not a block";
  std::ofstream(dir + "/00000000000000ff.kvb") << "short";
  auto b = DiskTier::Open(DiskOpts(dir, 8, /*fp=*/2));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->size_blocks(), 0);
  KvBlock out;
  EXPECT_FALSE((*b)->Get(31, &out));
  (*b)->Put(MakeBlock(32));
  b->reset();
  EXPECT_TRUE(fs::exists(dir + "/" + ChecksumHex(31) + ".kvb"));
  EXPECT_TRUE(fs::exists(dir + "/README"));
  auto a = DiskTier::Open(DiskOpts(dir, 8, /*fp=*/1));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->size_blocks(), 1);
  ASSERT_TRUE((*a)->Get(31, &out));
  EXPECT_EQ(out.data, MakeBlock(31).data);
  fs::remove_all(dir);
}

// Delegates to the real Env, failing writes on demand (a full disk).
class FullDiskEnv : public Env {
 public:
  bool full = false;
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    if (full) return Status::Error(path + ": open for writing failed: No space left on device");
    return base_->NewWritableFile(path);
  }
  Result<std::string> ReadFile(const std::string& p) override { return base_->ReadFile(p); }
  Status RenameFile(const std::string& a, const std::string& b) override { return base_->RenameFile(a, b); }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }
  Status CreateDirs(const std::string& p) override { return base_->CreateDirs(p); }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  bool FileExists(const std::string& p) override { return base_->FileExists(p); }
  Result<std::vector<std::string>> ListDir(const std::string& p) override { return base_->ListDir(p); }
  uint64_t NowMicros() override { return base_->NowMicros(); }

 private:
  Env* base_ = Env::Default();
};

TEST(DiskTier, WriteFailuresAreCountedAndKeepTheOldBlock) {
  const std::string dir = TempDir("full");
  FullDiskEnv env;
  DiskTierOptions o = DiskOpts(dir, 8);
  o.env = &env;
  auto t = DiskTier::Open(o);
  ASSERT_TRUE(t.ok());
  (*t)->Put(MakeBlock(41));
  env.full = true;
  KvBlock changed = MakeBlock(41);
  changed.data[0] += 1.f;
  (*t)->Put(changed);        // fails: the old file stays
  (*t)->Put(MakeBlock(42));  // fails: not indexed
  EXPECT_EQ((*t)->stats().errors, 2);
  EXPECT_EQ((*t)->stats().puts, 1);
  EXPECT_FALSE((*t)->Contains(42));
  KvBlock out;
  ASSERT_TRUE((*t)->Get(41, &out));
  EXPECT_EQ(out.data, MakeBlock(41).data);
  // Wrong-sized blocks are refused.
  (*t)->Put(MakeBlock(43, kSmallFloats / 2));
  EXPECT_EQ((*t)->stats().errors, 3);
  fs::remove_all(dir);
}

TEST(DiskTier, OpenRejectsBadOptions) {
  DiskTierOptions o;
  o.capacity_bytes = 100;
  EXPECT_FALSE(DiskTier::Open(o).ok());
  o.dir = TempDir("badopts");
  o.capacity_bytes = 0;
  EXPECT_FALSE(DiskTier::Open(o).ok());
}

// ---------------------------------------------------------------- redis (T3)

TEST(RedisUrl, ParsesAndExplains) {
  auto a = ParseRedisUrl("redis://127.0.0.1:6380");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 0);
  a = ParseRedisUrl("redis://:s3cret@cache.local/2");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "cache.local");
  EXPECT_EQ(a->port, 6379);
  EXPECT_EQ(a->db, 2);
  EXPECT_EQ(a->password, "s3cret");
  a = ParseRedisUrl("redis://[::1]:7000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "::1");
  EXPECT_EQ(a->port, 7000);
  for (const char* bad : {"127.0.0.1:6379", "http://x:1", "redis://", "redis://h:", "redis://h:0",
                          "redis://h:99999", "redis://h:12ab", "redis://h/x", "redis://[::1"}) {
    auto r = ParseRedisUrl(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("hint: redis://"), std::string::npos) << r.status().message();
  }
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::FindRedisServer().empty())
      GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server); Redis tier untested";
    const std::string err = server_.Start();
    ASSERT_EQ(err, "") << err;
  }
  std::unique_ptr<RedisTier> Make(uint64_t fp = 1, int ttl = 0) {
    RedisTierOptions o;
    o.address.port = server_.port();
    o.fingerprint = Fp(fp);
    o.block_floats = kSmallFloats;
    o.ttl_seconds = ttl;
    o.retry_interval_s = 0.05;
    auto t = RedisTier::Create(o);
    EXPECT_TRUE(t.ok());
    return std::move(t).value();
  }
  // Raw access to the server, behind the tier's back.
  redisReply* Raw(const std::vector<std::string>& args) {
    if (!raw_) raw_ = redisConnect("127.0.0.1", server_.port());
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (auto& s : args) {
      argv.push_back(s.data());
      lens.push_back(s.size());
    }
    return static_cast<redisReply*>(redisCommandArgv(raw_, static_cast<int>(args.size()), argv.data(), lens.data()));
  }
  long long RawInt(const std::vector<std::string>& args) {
    redisReply* r = Raw(args);
    const long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -999;
    if (r) freeReplyObject(r);
    return v;
  }
  void TearDown() override {
    if (raw_) redisFree(raw_);
  }
  testing::RedisTestServer server_;
  redisContext* raw_ = nullptr;
};

TEST_F(RedisTierTest, RoundTripContainsEvictAndTtl) {
  auto t = Make(1, /*ttl=*/300);
  ASSERT_TRUE(t->Ping().ok());
  KvBlock out;
  EXPECT_FALSE(t->Get(51, &out));
  EXPECT_FALSE(t->Contains(51));
  t->Put(MakeBlock(51));
  t->Put(MakeBlock(52));
  EXPECT_TRUE(t->Contains(51));
  ASSERT_TRUE(t->Get(51, &out));
  EXPECT_EQ(out.key, 51u);
  EXPECT_EQ(out.data, MakeBlock(51).data);
  EXPECT_EQ(t->KeyOf(51), "myriad:kv:" + Fp(1).hex() + ":" + ChecksumHex(51));
  const long long ttl = RawInt({"TTL", t->KeyOf(51)});
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 300);
  EXPECT_EQ(t->size_blocks(), 2);
  // One pipelined round trip answers each key, in order.
  EXPECT_EQ(t->ContainsMany({51, 50, 52, 51, 54}), (std::vector<bool>{true, false, true, true, false}));
  EXPECT_TRUE(t->ContainsMany({}).empty());
  t->Evict(51);
  EXPECT_FALSE(t->Contains(51));
  EXPECT_EQ(t->size_blocks(), 1);
  const TierStats s = t->stats();
  EXPECT_EQ(s.puts, 2);
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.errors, 0);
  EXPECT_EQ(s.bytes_written, 2 * kSmallFloats * 4);
  auto no_ttl = Make(1);
  no_ttl->Put(MakeBlock(53));
  EXPECT_EQ(RawInt({"TTL", no_ttl->KeyOf(53)}), -1);  // no expiry
}

TEST_F(RedisTierTest, TwoServersShareBlocksOneModelOnly) {
  auto a = Make(1), b = Make(1), other_model = Make(2);
  a->Put(MakeBlock(61));
  KvBlock out;
  ASSERT_TRUE(b->Get(61, &out));  // written by one serving process, read by another
  EXPECT_EQ(out.data, MakeBlock(61).data);
  EXPECT_FALSE(other_model->Contains(61));
  EXPECT_FALSE(other_model->Get(61, &out));
  EXPECT_EQ(other_model->size_blocks(), 0);
  b->Evict(61);
  EXPECT_FALSE(a->Contains(61));
}

TEST_F(RedisTierTest, CorruptOrForeignValuesAreRejectedAndDeleted) {
  auto t = Make(1);
  KvBlock out;
  // Garbage under our key.
  freeReplyObject(Raw({"SET", t->KeyOf(71), "garbage"}));
  EXPECT_FALSE(t->Get(71, &out));
  EXPECT_EQ(RawInt({"EXISTS", t->KeyOf(71)}), 0);
  // A record of another model under our key.
  freeReplyObject(Raw({"SET", t->KeyOf(72), EncodeBlockRecord(MakeBlock(72), Fp(2))}));
  EXPECT_FALSE(t->Get(72, &out));
  // A flipped payload byte.
  std::string rec = EncodeBlockRecord(MakeBlock(73), Fp(1));
  rec[rec.size() - 5] ^= 1;
  freeReplyObject(Raw({"SET", t->KeyOf(73), rec}));
  EXPECT_FALSE(t->Get(73, &out));
  // Not a string at all.
  freeReplyObject(Raw({"LPUSH", t->KeyOf(74), "x"}));
  EXPECT_FALSE(t->Get(74, &out));
  const TierStats s = t->stats();
  EXPECT_EQ(s.errors, 4);
  EXPECT_EQ(s.misses, 4);
  EXPECT_EQ(s.hits, 0);
  t->Put(MakeBlock(73));  // and the tier still works
  ASSERT_TRUE(t->Get(73, &out));
  EXPECT_EQ(out.data, MakeBlock(73).data);
}

TEST_F(RedisTierTest, DeadServerFailsSoftThenReconnects) {
  auto t = Make(1);
  t->Put(MakeBlock(81));
  ASSERT_TRUE(t->Contains(81));
  const int port = server_.port();
  server_.Kill();
  KvBlock out;
  for (int i = 0; i < 3; ++i) {
    t->Put(MakeBlock(82));
    EXPECT_FALSE(t->Get(81, &out));
    EXPECT_FALSE(t->Contains(81));
    EXPECT_EQ(t->ContainsMany({81, 82}), (std::vector<bool>{false, false}));
    t->Evict(81);
    EXPECT_EQ(t->size_blocks(), 0);
  }
  EXPECT_FALSE(t->Ping().ok());
  TierStats s = t->stats();
  EXPECT_GE(s.errors, 18);
  EXPECT_EQ(s.puts, 1);
  EXPECT_EQ(s.misses, 3);
  // A new server on the same port (empty: no persistence): the tier reconnects.
  const std::string err = server_.Start(port);
  ASSERT_EQ(err, "") << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(80));  // past retry_interval_s
  t->Put(MakeBlock(83));
  ASSERT_TRUE(t->Get(83, &out));
  EXPECT_EQ(out.data, MakeBlock(83).data);
  EXPECT_EQ(t->ContainsMany({83, 81}), (std::vector<bool>{true, false}));  // the pipeline reconnects too
  EXPECT_EQ(t->stats().puts, 2);
}

TEST_F(RedisTierTest, HungServerNeverBlocksStatsAndOutagesAreCounted) {
  RedisTierOptions o;
  o.address.port = server_.port();
  o.fingerprint = Fp(1);
  o.block_floats = kSmallFloats;
  o.op_timeout_s = 1.0;
  o.retry_interval_s = 0.05;
  auto t = std::move(RedisTier::Create(o)).value();
  t->Put(MakeBlock(91));
  ASSERT_TRUE(t->Contains(91));
  EXPECT_EQ(t->outages(), 0);
  server_.Freeze();
  std::atomic<bool> get_returned{false};
  std::thread getter([&] {
    KvBlock out;
    EXPECT_FALSE(t->Get(91, &out));  // waits for op_timeout_s, then fails soft
    get_returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the GET is in flight
  const TierStats during = t->stats();  // must not wait for it
  EXPECT_FALSE(get_returned.load()) << "stats() waited for a command to a hung server";
  EXPECT_EQ(during.errors, 0);
  getter.join();
  EXPECT_EQ(t->outages(), 1);
  KvBlock out;
  EXPECT_FALSE(t->Get(91, &out));  // failing fast (or timing out again): one outage all the same
  EXPECT_EQ(t->outages(), 1);
  server_.Thaw();
  std::this_thread::sleep_for(std::chrono::milliseconds(80));  // past retry_interval_s
  ASSERT_TRUE(t->Get(91, &out));  // the block survived the freeze
  EXPECT_EQ(out.data, MakeBlock(91).data);
  EXPECT_EQ(t->reconnects(), 1);
  EXPECT_GE(t->stats().errors, 1);
}

TEST_F(RedisTierTest, UnreachableFromTheStart) {
  RedisTierOptions o;
  o.address.port = testing::FreeLocalPort();  // nobody listens there
  auto t = RedisTier::Create(o);
  ASSERT_TRUE(t.ok());
  KvBlock out;
  (*t)->Put(MakeBlock(1));
  EXPECT_FALSE((*t)->Get(1, &out));
  EXPECT_GE((*t)->stats().errors, 2);
  const Status p = (*t)->Ping();
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.message().find("connect"), std::string::npos) << p.message();
  o.ttl_seconds = -1;
  EXPECT_FALSE(RedisTier::Create(o).ok());
}

// ---------------------------------------------------------------- bandwidth

// Printed, not asserted: read bandwidth of each tier for one block of the
// demo model (64 KiB), from the tiers' own read_seconds.
TEST_F(RedisTierTest, PrintReadBandwidthPerTier) {
  const ModelConfig cfg = DemoConfig();
  const int64_t n = BlockFloats(cfg), row = KvRowFloats(cfg);
  constexpr int kBlocks = 32, kRounds = 8;
  std::vector<std::unique_ptr<KvTier>> tiers;
  for (KvStorageFormat f : {KvStorageFormat::kFp32, KvStorageFormat::kFp16, KvStorageFormat::kInt8})
    tiers.push_back(std::make_unique<HostTier>(HostTierOptions{kBlocks, f, row}));
  const std::string dir = TempDir("bw");
  DiskTierOptions d;
  d.dir = dir;
  d.capacity_bytes = int64_t{1} << 30;
  d.fingerprint = Fp(1);
  d.block_floats = n;
  tiers.push_back(std::move(DiskTier::Open(d)).value());
  RedisTierOptions r;
  r.address.port = server_.port();
  r.fingerprint = Fp(1);
  r.block_floats = n;
  tiers.push_back(std::move(RedisTier::Create(r)).value());
  const char* labels[] = {"host fp32", "host fp16", "host int8", "disk (page cache)", "redis (loopback)"};
  std::printf("read bandwidth, demo-moe block = %lld floats (%lld KiB fp32), %d blocks x %d rounds\n",
              static_cast<long long>(n), static_cast<long long>(n * 4 / 1024), kBlocks, kRounds);
  for (size_t i = 0; i < tiers.size(); ++i) {
    KvTier& t = *tiers[i];
    for (int b = 0; b < kBlocks; ++b) t.Put(MakeBlock(1000 + b, n, row));
    KvBlock out;
    for (int round = 0; round < kRounds; ++round)
      for (int b = 0; b < kBlocks; ++b) ASSERT_TRUE(t.Get(1000 + b, &out)) << labels[i];
    const TierStats s = t.stats();
    std::printf("  %-18s %8.1f MB/s  %8.1f us/block\n", labels[i], s.bytes_read / s.read_seconds / 1e6,
                s.read_seconds / s.hits * 1e6);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace myriad::serve
