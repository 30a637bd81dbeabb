// PrefixCache alone, without a model: a KvPool of a small shape, "requests"
// that compute their blocks by writing a pattern derived from each block's
// chain key, and real in-process tiers (host memory, a disk tier in a temp
// dir, a real redis-server when installed). Every expectation -- which
// block ids are shared, which tier a block is loaded from, where a
// write-back lands, the order of evictions -- is worked out by hand from the
// policy in prefix_cache.h, and loaded data is compared with the pattern.
#include "serve/prefix_cache.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "serve/kvcache/disk_tier.h"
#include "serve/kvcache/host_tier.h"
#include "serve/kvcache/redis_test_server.h"
#include "serve/kvcache/redis_tier.h"
#include "serve/kvcache/tier_test_util.h"

namespace myriad::serve {
namespace {

namespace fs = std::filesystem;

// 2 layers x k|v x 16 tokens x 2 kv heads x 32 = 4096 floats (16 KiB) a
// block, so that by the priors (load_cost.cc) a host read (3.3 us) and a
// disk read (33 us) are memory-speed inline reads, a Redis read (164 us) is
// not, and all of them beat recomputing at the start value of 1000 tokens/s
// (16 ms a block).
ModelConfig SmallShape() { return testing::KvShape(2, 64, 2, 2); }

const ModelFingerprint kFp{0x5eed};

// What a block of `key` holds once computed: a pattern no other key shares.
float PatternAt(BlockKey key, int64_t i) {
  return static_cast<float>(key % 9973) + 0.25f * static_cast<float>(i % 512);
}
KvBlock PatternBlock(BlockKey key, int64_t floats) {
  KvBlock b;
  b.key = key;
  b.data.resize(floats);
  for (int64_t i = 0; i < floats; ++i) b.data[i] = PatternAt(key, i);
  return b;
}

// Tokens of block i of a prompt: `salt` picks the prompt, so prompts with
// equal salts for their first k blocks share exactly those k blocks.
std::vector<int32_t> Tokens(const std::vector<int>& block_salts, int extra) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < block_salts.size(); ++i)
    for (int j = 0; j < kBlockTokens; ++j) t.push_back(block_salts[i] * 100 + static_cast<int32_t>(i) * 16 + j);
  for (int j = 0; j < extra; ++j) t.push_back(7000 + j);
  return t;
}

// The chain keys of the full blocks of `tokens`, computed here directly.
std::vector<BlockKey> Keys(const std::vector<int32_t>& tokens) {
  std::vector<BlockKey> keys;
  for (size_t i = 0; (i + 1) * kBlockTokens <= tokens.size(); ++i)
    keys.push_back(ChainKey(keys.empty() ? 0 : keys.back(), tokens.data() + i * kBlockTokens, kBlockTokens, kFp));
  return keys;
}

std::unique_ptr<HostTier> Host(int64_t capacity_blocks) {
  HostTierOptions o;
  o.capacity_blocks = capacity_blocks;
  return std::make_unique<HostTier>(o);
}

std::unique_ptr<DiskTier> Disk(const std::string& dir, int64_t floats) {
  DiskTierOptions o;
  o.dir = dir;
  o.capacity_bytes = 64 << 20;
  o.fingerprint = kFp;
  o.block_floats = floats;
  auto t = DiskTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  PrefixCacheTest() : cfg_(SmallShape()) {}
  void TearDown() override {
    for (const auto& d : dirs_) fs::remove_all(d);
  }
  std::string Dir(const std::string& name) {
    dirs_.push_back(testing::FreshTempDir("prefix_" + name));
    return dirs_.back();
  }
  int64_t floats() const { return BlockFloats(cfg_); }

  // A request that computes all of `tokens` itself: blocks allocated,
  // written with the pattern of their chain key, the full ones published.
  // Returns its block table (referenced).
  std::vector<int32_t> Compute(KvPool* pool, PrefixCache* cache, const std::vector<int32_t>& tokens) {
    const std::vector<BlockKey> keys = Keys(tokens);
    std::vector<int32_t> table;
    const int64_t n = static_cast<int64_t>(tokens.size());
    for (int64_t i = 0; i * kBlockTokens < n; ++i) {
      table.push_back(pool->Allocate());
      EXPECT_GE(table.back(), 0);
      std::vector<float> d(pool->block_floats());  // device memory: written through a copy
      for (int64_t f = 0; f < pool->block_floats(); ++f)
        d[f] = i < static_cast<int64_t>(keys.size()) ? PatternAt(keys[i], f) : -1.f;
      pool->CopyIn(table.back(), d.data());
    }
    ChainCursor c;
    cache->PublishFull(tokens.data(), n, table, &c);
    EXPECT_EQ(c.blocks, static_cast<int64_t>(keys.size()));
    return table;
  }
  static void ReleaseLastFirst(KvPool* pool, const std::vector<int32_t>& table) {
    for (auto it = table.rbegin(); it != table.rend(); ++it) pool->Release(*it);
  }
  static void WaitReady(const PrefixLoad& load) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!load.ready() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(load.ready()) << "load never finished";
  }
  void ExpectPattern(const KvPool& pool, int32_t b, BlockKey key) {
    std::vector<float> d(pool.block_floats());
    pool.CopyOut(b, d.data());
    for (int64_t f = 0; f < pool.block_floats(); ++f)
      ASSERT_EQ(d[f], PatternAt(key, f)) << "block " << b << " float " << f;
  }
  static PrefixCacheConfig Tiers(std::vector<KvTier*> tiers, bool write_through = false) {
    PrefixCacheConfig c;
    c.tiers = std::move(tiers);
    c.write_through = write_through;
    return c;
  }
  static int64_t Hits(const PrefixCacheStats& s, const std::string& tier) {
    for (const auto& [n, v] : s.tier_hits)
      if (n == tier) return v;
    return -1;
  }

  ModelConfig cfg_;
  std::vector<std::string> dirs_;
};

TEST_F(PrefixCacheTest, MatchableBlocksLeaveTheLastTokenToCompute) {
  KvPool pool(cfg_, 4);
  PrefixCache cache(&pool, kFp, {});
  EXPECT_EQ(cache.MatchableBlocks(0), 0);
  EXPECT_EQ(cache.MatchableBlocks(1), 0);
  EXPECT_EQ(cache.MatchableBlocks(16), 0);  // its one block holds the last token
  EXPECT_EQ(cache.MatchableBlocks(17), 1);
  EXPECT_EQ(cache.MatchableBlocks(65), 4);
  PrefixCacheConfig off;
  off.enabled = false;
  KvPool pool2(cfg_, 4);
  PrefixCache disabled(&pool2, kFp, off);
  EXPECT_EQ(disabled.MatchableBlocks(65), 0);
}

TEST_F(PrefixCacheTest, PublishTakesAKeyOnceAndEvictionForgetsIt) {
  KvPool pool(cfg_, 3);
  PrefixCache cache(&pool, kFp, {});
  const int32_t a = pool.Allocate(), b = pool.Allocate(), c = pool.Allocate();
  EXPECT_TRUE(cache.Publish(a, 101));
  EXPECT_TRUE(cache.Publish(b, 102));
  EXPECT_FALSE(cache.Publish(c, 101));  // key held by another block
  EXPECT_FALSE(cache.Publish(a, 103));  // a has a key already
  EXPECT_EQ(cache.Find(101), a);
  EXPECT_EQ(cache.Find(103), -1);
  EXPECT_TRUE(pool.is_cached(a));
  EXPECT_FALSE(pool.is_cached(c));
  EXPECT_EQ(pool.cached(), 2);
  pool.Release(c);  // unpublished: free
  pool.Release(b);  // published: cached, findable
  pool.Release(a);
  EXPECT_EQ(cache.Find(102), b);
  EXPECT_EQ(pool.Allocate(), c);  // the free block first
  EXPECT_EQ(cache.Find(102), b);
  EXPECT_EQ(pool.Allocate(), b);  // then the least recently released: its key is gone
  EXPECT_EQ(cache.Find(102), -1);
  EXPECT_EQ(cache.Find(101), a);
  EXPECT_EQ(pool.cached(), 1);
  EXPECT_TRUE(cache.Publish(b, 102));  // the reused block may take a key again
  EXPECT_EQ(cache.Find(102), b);
}

TEST_F(PrefixCacheTest, PrefixReuseAcrossRequestsInT0) {
  KvPool pool(cfg_, 8);
  PrefixCache cache(&pool, kFp, {});
  // A: 4 full blocks and one token: 5 blocks, the 4 full ones published.
  const std::vector<int32_t> a = Tokens({1, 1, 1, 1}, 1);
  const std::vector<int32_t> ta = Compute(&pool, &cache, a);
  ASSERT_EQ(ta.size(), 5u);
  const std::vector<BlockKey> ka = Keys(a);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cache.Find(ka[i]), ta[i]);
  ReleaseLastFirst(&pool, ta);
  EXPECT_EQ(pool.cached(), 4);
  EXPECT_EQ(pool.available(), 8);

  // B shares A's first two blocks, then differs: it shares exactly A's two
  // block ids (referenced), and nothing beyond them is found anywhere.
  const std::vector<int32_t> b = Tokens({1, 1, 2, 2}, 3);
  ChainCursor cb;
  std::vector<int32_t> run = cache.AcquireResidentRun(b.data(), cache.MatchableBlocks(67), &cb);
  EXPECT_EQ(run, (std::vector<int32_t>{ta[0], ta[1]}));
  EXPECT_EQ(cb.blocks, 2);
  EXPECT_EQ(cb.last_key, ka[1]);
  EXPECT_EQ(pool.refs(ta[0]), 1);
  EXPECT_EQ(pool.available(), 6);
  EXPECT_EQ(cache.Extend(b.data(), 4, cb, /*spare_blocks=*/4, &run), nullptr);
  EXPECT_EQ(run.size(), 2u);
  EXPECT_EQ(cache.stats().t0_hits, 2 * kBlockTokens);

  // C is A again, but 48 tokens long: its third block holds its last token,
  // so only two of the three cached blocks are matchable.
  const std::vector<int32_t> c(a.begin(), a.begin() + 48);
  ChainCursor cc;
  std::vector<int32_t> run_c = cache.AcquireResidentRun(c.data(), cache.MatchableBlocks(48), &cc);
  EXPECT_EQ(run_c, (std::vector<int32_t>{ta[0], ta[1]}));
  EXPECT_EQ(pool.refs(ta[0]), 2);
  // Refused admission gives the references back.
  cache.ReleaseRun(run_c);
  EXPECT_EQ(pool.refs(ta[0]), 1);
  cache.ReleaseRun(run);
  EXPECT_EQ(pool.available(), 8);
  EXPECT_EQ(cache.stats().t0_hits, 2 * kBlockTokens);  // C was never admitted
}

TEST_F(PrefixCacheTest, HitsFromHostAndDiskLoadInlineAndArePublished) {
  auto host = Host(16);
  auto disk = Disk(Dir("hits"), floats());
  const std::vector<int32_t> p = Tokens({3, 3, 3, 3}, 5);
  const std::vector<BlockKey> k = Keys(p);
  // Block 0 in both tiers (credited to the first, host), block 1 on disk
  // only, block 2 in the host tier, block 3 nowhere.
  host->Put(PatternBlock(k[0], floats()));
  disk->Put(PatternBlock(k[0], floats()));
  disk->Put(PatternBlock(k[1], floats()));
  host->Put(PatternBlock(k[2], floats()));
  KvPool pool(cfg_, 8);
  PrefixCache cache(&pool, kFp, Tiers({host.get(), disk.get()}));

  ChainCursor c;
  std::vector<int32_t> table = cache.AcquireResidentRun(p.data(), 4, &c);
  EXPECT_TRUE(table.empty());
  std::shared_ptr<PrefixLoad> load = cache.Extend(p.data(), 4, c, 8, &table);
  ASSERT_NE(load, nullptr);
  // By the priors all three are memory-speed reads: done at admission.
  EXPECT_TRUE(load->ready());
  ASSERT_EQ(load->src.size(), 3u);
  EXPECT_EQ(load->src[0].tier, 0);
  EXPECT_EQ(load->src[1].tier, 1);
  EXPECT_EQ(load->src[2].tier, 0);
  ASSERT_EQ(table.size(), 3u);
  const ChainCursor after = cache.CompleteLoad(*load);
  EXPECT_EQ(after.blocks, 3);
  EXPECT_EQ(after.last_key, k[2]);
  for (int i = 0; i < 3; ++i) {
    ExpectPattern(pool, table[i], k[i]);
    EXPECT_EQ(cache.Find(k[i]), table[i]);  // published in T0
  }
  PrefixCacheStats st = cache.stats();
  EXPECT_EQ(Hits(st, "host"), 2 * kBlockTokens);
  EXPECT_EQ(Hits(st, "disk"), 1 * kBlockTokens);
  EXPECT_EQ(st.t0_hits, 0);
  EXPECT_EQ(st.recomputed_hit_tokens, 0);
  EXPECT_EQ(host->stats().hits, 2);
  EXPECT_EQ(disk->stats().hits, 1);

  // The next request with this prefix finds all three in T0: shared, no
  // tier read.
  ChainCursor c2;
  std::vector<int32_t> run = cache.AcquireResidentRun(p.data(), 4, &c2);
  EXPECT_EQ(run, table);
  EXPECT_EQ(cache.Extend(p.data(), 4, c2, 8, &run), nullptr);
  st = cache.stats();
  EXPECT_EQ(st.t0_hits, 3 * kBlockTokens);
  EXPECT_EQ(host->stats().hits, 2);
  cache.ReleaseRun(run);
  ReleaseLastFirst(&pool, table);
  cache.Close();
}

TEST_F(PrefixCacheTest, CorruptDiskBlockFallsBackToRecompute) {
  auto disk = Disk(Dir("corrupt"), floats());
  const std::vector<int32_t> p = Tokens({4, 4, 4}, 2);
  const std::vector<BlockKey> k = Keys(p);
  for (int i = 0; i < 3; ++i) disk->Put(PatternBlock(k[i], floats()));
  testing::FlipByte(disk->PathOf(k[1]), 100);  // a payload bit (the header is 40 bytes)
  KvPool pool(cfg_, 8);
  PrefixCache cache(&pool, kFp, Tiers({disk.get()}));
  ChainCursor c;
  std::vector<int32_t> table = cache.AcquireResidentRun(p.data(), 3, &c);
  std::shared_ptr<PrefixLoad> load = cache.Extend(p.data(), 3, c, 8, &table);
  ASSERT_NE(load, nullptr);
  WaitReady(*load);
  EXPECT_EQ(load->src.size(), 3u);  // all three matched (the index has them)
  EXPECT_EQ(load->ok, 1);           // the read stopped at the corrupt one
  const ChainCursor after = cache.CompleteLoad(*load);
  EXPECT_EQ(after.blocks, 1);  // the request computes from block 1 on
  EXPECT_EQ(after.last_key, k[0]);
  ASSERT_EQ(table.size(), 3u);  // blocks 1 and 2 stay its own, to be recomputed
  ExpectPattern(pool, table[0], k[0]);
  EXPECT_EQ(cache.Find(k[0]), table[0]);
  EXPECT_EQ(cache.Find(k[1]), -1);
  EXPECT_EQ(cache.Find(k[2]), -1);
  EXPECT_FALSE(pool.is_cached(table[1]));
  EXPECT_EQ(Hits(cache.stats(), "disk"), kBlockTokens);
  EXPECT_EQ(disk->stats().errors, 1);
  EXPECT_FALSE(disk->Contains(k[1]));  // dropped by the tier
  EXPECT_TRUE(disk->Contains(k[2]));
  ReleaseLastFirst(&pool, table);
}

TEST_F(PrefixCacheTest, ResidentBlockAfterAGapIsCopied) {
  // A's block 1 is evicted from T0 into the host tier while blocks 0, 2
  // stay: the match shares block 0, loads 1 from the host tier and copies
  // 2 from its T0 block into a fresh one.
  auto host = Host(16);
  KvPool pool(cfg_, 4);
  PrefixCache cache(&pool, kFp, Tiers({host.get()}));
  const std::vector<int32_t> a = Tokens({5, 5, 5}, 1);
  const std::vector<BlockKey> k = Keys(a);
  const std::vector<int32_t> ta = Compute(&pool, &cache, a);  // 4 blocks, 3 published
  ReleaseLastFirst(&pool, ta);  // ta[3] free; cached, least recent first: ta[2], ta[1], ta[0]
  // Use 2 and 0 again: ta[1] becomes the least recent.
  pool.Ref(ta[2]);
  pool.Release(ta[2]);
  pool.Ref(ta[0]);
  pool.Release(ta[0]);
  const int32_t x = pool.Allocate(), y = pool.Allocate();  // the free block, then ta[1] evicted
  EXPECT_EQ(x, ta[3]);
  EXPECT_EQ(y, ta[1]);
  cache.Drain();
  EXPECT_TRUE(host->Contains(k[1]));
  EXPECT_EQ(host->size_blocks(), 1);
  pool.Release(x);  // free again: room for the two fresh blocks
  pool.Release(y);

  ChainCursor c;
  std::vector<int32_t> table = cache.AcquireResidentRun(a.data(), 3, &c);
  EXPECT_EQ(table, (std::vector<int32_t>{ta[0]}));
  EXPECT_EQ(pool.available(), 3);  // x, y and the cached ta[2]
  std::shared_ptr<PrefixLoad> load = cache.Extend(a.data(), 3, c, /*spare_blocks=*/1, &table);
  ASSERT_NE(load, nullptr);
  WaitReady(*load);
  ASSERT_EQ(load->src.size(), 2u);
  EXPECT_EQ(load->src[0].tier, 0);
  EXPECT_EQ(load->src[1].t0_block, MatchedBlock::kCopiedFromT0);
  const ChainCursor after = cache.CompleteLoad(*load);
  EXPECT_EQ(after.blocks, 3);
  ASSERT_EQ(table.size(), 3u);
  ExpectPattern(pool, table[1], k[1]);
  ExpectPattern(pool, table[2], k[2]);
  EXPECT_NE(table[2], ta[2]);
  const PrefixCacheStats st = cache.stats();
  EXPECT_EQ(st.t0_hits, 2 * kBlockTokens);  // the shared block and the copy
  EXPECT_EQ(Hits(st, "host"), kBlockTokens);
  ReleaseLastFirst(&pool, table);
}

TEST_F(PrefixCacheTest, EvictionFollowsReleaseOrderAndWritesBackToTheSpillingTier) {
  // Host tier of 1 block above a disk tier: T0 evictions go to the host
  // tier only; the disk gets what the host tier evicts, and the rest at Close.
  auto host = Host(1);
  auto disk = Disk(Dir("placement"), floats());
  KvPool pool(cfg_, 4);
  PrefixCache cache(&pool, kFp, Tiers({host.get(), disk.get()}));
  const std::vector<int32_t> a = Tokens({6, 6}, 0), b = Tokens({7, 7}, 0);
  const std::vector<BlockKey> ka = Keys(a), kb = Keys(b);
  const std::vector<int32_t> ta = Compute(&pool, &cache, a), tb = Compute(&pool, &cache, b);
  ReleaseLastFirst(&pool, ta);  // LRU: a1, a0
  ReleaseLastFirst(&pool, tb);  // then b1, b0
  EXPECT_EQ(pool.Allocate(), ta[1]);
  cache.Drain();
  EXPECT_TRUE(host->Contains(ka[1]));
  EXPECT_EQ(disk->size_blocks(), 0);
  EXPECT_EQ(pool.Allocate(), ta[0]);  // a1 leaves the host tier for the disk
  cache.Drain();
  EXPECT_TRUE(host->Contains(ka[0]));
  EXPECT_FALSE(host->Contains(ka[1]));
  EXPECT_TRUE(disk->Contains(ka[1]));
  EXPECT_EQ(disk->size_blocks(), 1);
  EXPECT_EQ(pool.Allocate(), tb[1]);
  cache.Drain();
  EXPECT_TRUE(host->Contains(kb[1]));
  EXPECT_TRUE(disk->Contains(ka[0]));
  EXPECT_EQ(disk->size_blocks(), 2);
  // b0 is still cached in T0: Close writes it down (host tier, evicting b1
  // to disk), then the host tier spills what it holds (b0) to disk.
  cache.Close();
  EXPECT_TRUE(host->Contains(kb[0]));
  EXPECT_EQ(disk->size_blocks(), 4);
  KvBlock out;
  for (BlockKey key : {ka[0], ka[1], kb[0], kb[1]}) {
    ASSERT_TRUE(disk->Get(key, &out));
    EXPECT_EQ(out.data, PatternBlock(key, floats()).data);
  }
}

TEST_F(PrefixCacheTest, WithoutASpillingTierEvictionsGoToEveryTier) {
  auto d1 = Disk(Dir("every1"), floats()), d2 = Disk(Dir("every2"), floats());
  KvPool pool(cfg_, 2);
  PrefixCache cache(&pool, kFp, Tiers({d1.get(), d2.get()}));
  const std::vector<int32_t> a = Tokens({8}, 1);
  const BlockKey k0 = Keys(a)[0];
  ReleaseLastFirst(&pool, Compute(&pool, &cache, a));
  pool.Allocate();  // the free one
  pool.Allocate();  // evicts k0
  cache.Drain();
  EXPECT_TRUE(d1->Contains(k0));
  EXPECT_TRUE(d2->Contains(k0));
}

TEST_F(PrefixCacheTest, WriteThroughPutsEveryPublishedBlockInEveryTier) {
  auto host = Host(8);
  auto disk = Disk(Dir("through"), floats());
  KvPool pool(cfg_, 4);
  PrefixCache cache(&pool, kFp, Tiers({host.get(), disk.get()}, /*write_through=*/true));
  const std::vector<int32_t> a = Tokens({9, 9}, 1);
  const std::vector<BlockKey> k = Keys(a);
  const std::vector<int32_t> ta = Compute(&pool, &cache, a);
  cache.Drain();
  for (BlockKey key : k) {  // still referenced in T0, already below
    EXPECT_TRUE(host->Contains(key));
    EXPECT_TRUE(disk->Contains(key));
  }
  EXPECT_EQ(host->size_blocks(), 2);
  EXPECT_EQ(pool.evictions(), 0);
  ReleaseLastFirst(&pool, ta);
}

class PrefixCacheRedisTest : public PrefixCacheTest {
 protected:
  void SetUp() override {
    if (testing::FindRedisServer().empty())
      GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server); Redis lookups untested";
    const std::string err = server_.Start();
    ASSERT_EQ(err, "") << err;
  }
  std::unique_ptr<RedisTier> Redis() {
    RedisTierOptions o;
    o.address.port = server_.port();
    o.fingerprint = kFp;
    o.block_floats = floats();
    auto t = RedisTier::Create(o);
    EXPECT_TRUE(t.ok());
    return std::move(t).value();
  }
  // The remote lookup a waiting request gets (StartRemoteLookup), waited for.
  static std::shared_ptr<RemoteLookup> Lookup(PrefixCache* cache, const std::vector<int32_t>& p, int64_t n) {
    std::shared_ptr<RemoteLookup> l = cache->StartRemoteLookup(p.data(), n);
    while (l && !l->ready()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return l;
  }
  testing::RedisTestServer server_;
};

TEST_F(PrefixCacheRedisTest, HitsPerTierThroughHostDiskAndRedis) {
  auto host = Host(16);
  auto disk = Disk(Dir("redis"), floats());
  auto redis = Redis();
  const std::vector<int32_t> p = Tokens({2, 2, 2, 2, 2}, 1);
  const std::vector<BlockKey> k = Keys(p);
  // Block 0 in the host tier, 1 on disk (and in Redis), 2 and 3 in Redis,
  // 4 nowhere.
  host->Put(PatternBlock(k[0], floats()));
  disk->Put(PatternBlock(k[1], floats()));
  redis->Put(PatternBlock(k[1], floats()));  // credited to the first tier holding it: disk
  redis->Put(PatternBlock(k[2], floats()));
  redis->Put(PatternBlock(k[3], floats()));
  KvPool pool(cfg_, 8);
  PrefixCache cache(&pool, kFp, Tiers({host.get(), disk.get(), redis.get()}));
  const auto lookup = Lookup(&cache, p, 5);
  ASSERT_NE(lookup, nullptr);
  ChainCursor c;
  std::vector<int32_t> table = cache.AcquireResidentRun(p.data(), 5, &c);
  std::shared_ptr<PrefixLoad> load = cache.Extend(p.data(), 5, c, 8, &table, lookup.get());
  ASSERT_NE(load, nullptr);
  // Plan by the priors: host 3.3 us and disk 33 us inline, each Redis block
  // 164 us on the I/O thread plus a 10 ms step of waiting, against 16 ms a
  // block recomputed: loading all four is cheapest (10.4 ms vs 64 ms).
  ASSERT_EQ(load->src.size(), 4u);
  EXPECT_EQ(load->src[0].tier, 0);
  EXPECT_EQ(load->src[1].tier, 1);
  EXPECT_EQ(load->src[2].tier, 2);
  EXPECT_EQ(load->src[3].tier, 2);
  WaitReady(*load);
  const ChainCursor after = cache.CompleteLoad(*load);
  EXPECT_EQ(after.blocks, 4);
  for (int i = 0; i < 4; ++i) ExpectPattern(pool, table[i], k[i]);
  const PrefixCacheStats st = cache.stats();
  EXPECT_EQ(Hits(st, "host"), kBlockTokens);
  EXPECT_EQ(Hits(st, "disk"), kBlockTokens);
  EXPECT_EQ(Hits(st, "redis"), 2 * kBlockTokens);
  EXPECT_EQ(st.recomputed_hit_tokens, 0);
  EXPECT_EQ(st.skipped_lookups, 0);
  EXPECT_EQ(redis->stats().hits, 2);
  ReleaseLastFirst(&pool, table);
}

TEST_F(PrefixCacheRedisTest, LookupThatCannotPayIsNotMade) {
  // One block left to match, in Redis (prior read 164 us, waited for on the
  // I/O thread: one 10 ms step). At 1000 tokens/s recomputing it takes
  // 16 ms, so asking pays (16 - 0.16 - 10 > 0) and the block is loaded; at
  // a measured 16000 tokens/s it takes 1 ms and the tier is not even asked.
  auto redis = Redis();
  const std::vector<int32_t> p = Tokens({11}, 1);
  const BlockKey k0 = Keys(p)[0];
  redis->Put(PatternBlock(k0, floats()));
  PrefixCacheConfig pc;
  pc.tiers = {redis.get()};
  {
    KvPool pool(cfg_, 4);
    PrefixCache cache(&pool, kFp, pc);
    cache.cost().ObservePrefill(16000, 1.0);
    ChainCursor c;
    std::vector<int32_t> table = cache.AcquireResidentRun(p.data(), 1, &c);
    EXPECT_EQ(cache.StartRemoteLookup(p.data(), 1), nullptr);
    EXPECT_EQ(cache.Extend(p.data(), 1, c, 4, &table), nullptr);
    EXPECT_EQ(cache.stats().skipped_lookups, 1);
    EXPECT_EQ(redis->stats().hits, 0);
  }
  KvPool pool(cfg_, 4);
  PrefixCache cache(&pool, kFp, pc);
  ChainCursor c;
  const auto lookup = Lookup(&cache, p, 1);
  std::vector<int32_t> table = cache.AcquireResidentRun(p.data(), 1, &c);
  std::shared_ptr<PrefixLoad> load = cache.Extend(p.data(), 1, c, 4, &table, lookup.get());
  ASSERT_NE(load, nullptr);
  WaitReady(*load);
  EXPECT_EQ(cache.CompleteLoad(*load).blocks, 1);
  ExpectPattern(pool, table[0], k0);
  EXPECT_EQ(cache.stats().skipped_lookups, 0);
  EXPECT_EQ(Hits(cache.stats(), "redis"), kBlockTokens);
  ReleaseLastFirst(&pool, table);
}

TEST_F(PrefixCacheRedisTest, LateRemoteLookupMeansNoRemoteHit) {
  // A frozen server: the lookup waits on the lookup thread; admission does
  // not wait for it (Extend returns at once) and the tier counts as empty.
  auto redis = Redis();
  const std::vector<int32_t> p = Tokens({12, 12}, 1);
  for (BlockKey k : Keys(p)) redis->Put(PatternBlock(k, floats()));
  PrefixCacheConfig pc;
  pc.tiers = {redis.get()};
  pc.load_or_recompute = false;
  KvPool pool(cfg_, 4);
  PrefixCache cache(&pool, kFp, pc);
  server_.Freeze();
  std::shared_ptr<RemoteLookup> lookup = cache.StartRemoteLookup(p.data(), 2);
  ASSERT_NE(lookup, nullptr);
  EXPECT_FALSE(lookup->ready());  // (it waits for the 2 s timeout)
  ChainCursor c;
  std::vector<int32_t> table = cache.AcquireResidentRun(p.data(), 2, &c);
  EXPECT_EQ(cache.Extend(p.data(), 2, c, 4, &table, lookup.get()), nullptr);
  EXPECT_EQ(cache.stats().late_lookups, 1);
  EXPECT_EQ(Hits(cache.stats(), "redis"), 0);
  EXPECT_FALSE(lookup->ready()) << "admission waited for the frozen server";
  server_.Thaw();
  ReleaseLastFirst(&pool, table);
}

}  // namespace
}  // namespace myriad::serve
