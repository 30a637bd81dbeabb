// The engine against an independent oracle: greedy generation with one
// InferenceSession per request, one request at a time. Whatever the engine
// does — continuous batching, chunked prefill, prefix hits from T0, blocks
// evicted to a lower tier and loaded back, or recomputed — the tokens must be
// the oracle's. Plus cancellation, back-pressure, stop sequences and the
// load-or-recompute decisions.
#include "serve/engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "core/rng.h"
#include "model/inference.h"
#include "serve/kvcache/disk_tier.h"
#include "serve/kvcache/host_tier.h"
#include "serve/kvcache/redis_test_server.h"
#include "serve/kvcache/redis_tier.h"
#include "serve/kv_pool.h"
#include "serve/engine_test_util.h"
#include "serve/load_cost.h"

namespace myriad::serve {

namespace {

using engine_test::Collector;
using engine_test::EngineTest;
using engine_test::GreedyParams;
using engine_test::RunToEnd;

// An in-memory lower tier that reports a chosen read speed.
class FakeTier : public KvTier {
 public:
  FakeTier(std::string name, double seconds_per_read) : name_(std::move(name)), spr_(seconds_per_read) {}
  std::string name() const override { return name_; }
  void Put(const KvBlock& b) override {
    {
      std::unique_lock<std::mutex> lock(gate_mu_);
      gate_cv_.wait(lock, [&] { return open_; });
    }
    std::lock_guard<std::mutex> lock(mu_);
    blocks_[b.key] = b;
    ++st_.puts;
    st_.bytes_written += static_cast<int64_t>(b.data.size() * sizeof(float));
  }
  bool Get(BlockKey key, KvBlock* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(key);
    if (it == blocks_.end()) return ++st_.misses, false;
    *out = it->second;
    ++st_.hits;
    st_.bytes_read += static_cast<int64_t>(out->data.size() * sizeof(float));
    st_.read_seconds += spr_;
    return true;
  }
  bool Contains(BlockKey key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.count(key) > 0;
  }
  void Evict(BlockKey key) override {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.erase(key);
  }
  int64_t size_blocks() override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(blocks_.size());
  }
  TierStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return st_;
  }
  // While closed, Put waits (a tier that has fallen behind).
  void SetGate(bool open) {
    {
      std::lock_guard<std::mutex> lock(gate_mu_);
      open_ = open;
    }
    gate_cv_.notify_all();
  }
  void Prime(int64_t bytes, double seconds) {  // pretend earlier reads were measured
    std::lock_guard<std::mutex> lock(mu_);
    st_.bytes_read += bytes;
    st_.read_seconds += seconds;
  }

 private:
  std::string name_;
  double spr_;
  std::mutex mu_;
  std::map<BlockKey, KvBlock> blocks_;
  TierStats st_;
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool open_ = true;
};

int64_t TierHits(const EngineStats& s, const std::string& name) {
  for (const auto& [n, v] : s.tier_hits)
    if (n == name) return v;
  return -1;
}

TEST_F(EngineTest, ContinuousBatchingEqualsSerial) {
  for (bool prefix_cache : {false, true}) {
    EngineConfig cfg;
    cfg.max_batch = 4;
    cfg.step_token_budget = 24;  // prompts arrive in several chunks
    cfg.prefix_cache = prefix_cache;
    auto engine = Engine::Create(&model_, cfg);
    ASSERT_TRUE(engine.ok()) << engine.status().message();
    const int n = 10;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int> max_tokens;
    std::vector<std::unique_ptr<Collector>> cs;
    for (int i = 0; i < n; ++i) {
      prompts.push_back(Prompt(100 + i, 3 + 7 * i));
      max_tokens.push_back(4 + (i * 5) % 13);
      cs.push_back(std::make_unique<Collector>());
      ASSERT_TRUE((*engine)->Submit(prompts[i], GreedyParams(max_tokens[i]), cs[i]->Callback()).ok());
    }
    for (int i = 0; i < n; ++i) {
      cs[i]->Wait();
      EXPECT_EQ(cs[i]->tokens, Oracle(prompts[i], max_tokens[i])) << "request " << i;
      EXPECT_EQ(cs[i]->final_event.finish_reason, "length");
      EXPECT_EQ(cs[i]->final_event.completion_tokens, max_tokens[i]);
      EXPECT_EQ(cs[i]->final_event.prompt_tokens, static_cast<int64_t>(prompts[i].size()));
    }
    const EngineStats st = (*engine)->stats();
    EXPECT_EQ(st.requests, n);
    EXPECT_EQ(st.running, 0);
    (*engine)->Shutdown();
  }
}

TEST_F(EngineTest, ContextLimitEndsWithLength) {
  auto engine = Engine::Create(&model_, EngineConfig{});
  ASSERT_TRUE(engine.ok());
  std::vector<std::unique_ptr<Collector>> keep;
  const auto prompt = Prompt(3, 120);
  Collector* c = RunToEnd(engine->get(), prompt, GreedyParams(100), &keep);
  EXPECT_EQ(c->tokens, Oracle(prompt, 100));
  EXPECT_EQ(c->tokens.size(), 8u);  // 120 + 8 = max_seq_len
  EXPECT_EQ(c->final_event.finish_reason, "length");
}

// Three requests sharing a 40-token prefix (two full blocks and a half):
// the second and third hit its two full blocks in T0; every output is the
// oracle's. Returns the prefix.
std::vector<int32_t> RunSharedPrefix(EngineTest* t, Engine* engine, std::vector<std::unique_ptr<Collector>>* keep) {
  const auto system = t->Prompt(1, 40);
  for (int i = 0; i < 3; ++i) {
    auto prompt = system;
    const auto tail = t->Prompt(50 + i, 5 + i);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    Collector* c = RunToEnd(engine, prompt, GreedyParams(10), keep);
    EXPECT_EQ(c->tokens, t->Oracle(prompt, 10)) << "request " << i;
    EXPECT_EQ(c->final_event.cached_tokens, i == 0 ? 0 : 32) << "request " << i;
  }
  return system;
}

TEST_F(EngineTest, SharedPrefixHitsFromT0) {
  EngineConfig cfg;
  auto engine = Engine::Create(&model_, cfg);
  ASSERT_TRUE(engine.ok());
  std::vector<std::unique_ptr<Collector>> keep;
  const auto system = RunSharedPrefix(this, engine->get(), &keep);
  // The same prompt again: every full block but the one holding the last token.
  auto again = system;
  const auto tail = Prompt(52, 7);
  again.insert(again.end(), tail.begin(), tail.end());  // 47 tokens: blocks 0,1 cached (2 is partial)
  Collector* c = RunToEnd(engine->get(), again, GreedyParams(10), &keep);
  EXPECT_EQ(c->tokens, Oracle(again, 10));
  EXPECT_EQ(c->final_event.cached_tokens, 32);
  const EngineStats st = (*engine)->stats();
  EXPECT_EQ(st.t0_hits, 3 * 32);
  EXPECT_EQ(st.cached_tokens, 3 * 32);
}

// A T0 of 4 blocks over one lower tier: a request of up to 64 tokens
// reserves all 4, so the next one evicts the previous one's cached blocks,
// which the write-back thread puts in the tier. Runs a, then b, waits (with
// `wait`) until a's three full blocks are in the tier, then runs a again and
// returns that last run.
Collector* RunEvictAndReturn(EngineTest* t, KvTier* tier, const std::vector<int32_t>& a,
                             const std::vector<int32_t>& b, int max_tokens, bool wait,
                             std::vector<std::unique_ptr<Collector>>* keep,
                             std::unique_ptr<Engine>* engine_out) {
  EngineConfig cfg;
  cfg.kv_pool_blocks = 4;
  cfg.max_batch = 1;
  cfg.tiers = {tier};
  // The hit must come: a remote tier's lookup may take its time under a
  // loaded test machine (the default, 50 ms, would admit without it).
  cfg.remote_lookup_timeout_s = 10;
  auto engine = Engine::Create(t->model(), cfg);
  EXPECT_TRUE(engine.ok());
  RunToEnd(engine->get(), a, GreedyParams(max_tokens), keep);
  RunToEnd(engine->get(), b, GreedyParams(max_tokens), keep);
  for (int i = 0; wait && i < 2000 && tier->size_blocks() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (wait) {
    EXPECT_GE(tier->size_blocks(), 3);
  }
  Collector* c = RunToEnd(engine->get(), a, GreedyParams(max_tokens), keep);
  *engine_out = std::move(engine.value());
  return c;
}

TEST_F(EngineTest, EvictedBlocksComeBackFromLowerTier) {
  for (bool fast : {true, false}) {
    FakeTier tier("fake", 0.0);
    if (!fast) tier.Prime(1 << 20, 100.0);  // measured: 100 s per MiB, far slower than recomputing
    std::vector<std::unique_ptr<Collector>> keep;
    std::unique_ptr<Engine> engine;
    const auto a = Prompt(7, 50);
    Collector* c = RunEvictAndReturn(this, &tier, a, Prompt(8, 50), 8, true, &keep, &engine);
    EXPECT_EQ(c->tokens, Oracle(a, 8)) << (fast ? "loaded" : "recomputed");
    const EngineStats st = engine->stats();
    EXPECT_EQ(c->final_event.cached_tokens, fast ? 48 : 0);
    EXPECT_EQ(TierHits(st, "fake"), fast ? 48 : 0);
    // Slow: the tier is not even asked (no hit there could pay).
    EXPECT_EQ(st.skipped_lookups, fast ? 0 : 3);  // a, b, then a again
    EXPECT_EQ(st.recomputed_hit_tokens, 0);
  }
}

// Blocks evicted while the tier is still writing earlier ones are served
// from the write-back queue (credited to the first tier).
TEST_F(EngineTest, BlocksInWriteBackStillHit) {
  FakeTier tier("fake", 0.0);
  tier.SetGate(false);
  std::vector<std::unique_ptr<Collector>> keep;
  std::unique_ptr<Engine> engine;
  const auto a = Prompt(7, 50);
  Collector* c = RunEvictAndReturn(this, &tier, a, Prompt(8, 50), 8, false, &keep, &engine);
  EXPECT_EQ(c->tokens, Oracle(a, 8));
  EXPECT_EQ(c->final_event.cached_tokens, 48);
  EXPECT_EQ(tier.size_blocks(), 0);  // nothing written yet
  EXPECT_EQ(TierHits(engine->stats(), "fake"), 48);
  tier.SetGate(true);
  engine->Shutdown();  // drains the write-backs
  EXPECT_GE(tier.size_blocks(), 6);
}

// The real host tier under the engine: same outputs, hits counted by name.
TEST_F(EngineTest, HostTierRoundTrip) {
  HostTierOptions opt;
  opt.capacity_blocks = 64;
  HostTier host(opt);
  std::vector<std::unique_ptr<Collector>> keep;
  std::unique_ptr<Engine> engine;
  const auto a = Prompt(17, 60);
  Collector* c = RunEvictAndReturn(this, &host, a, Prompt(18, 60), 4, true, &keep, &engine);
  EXPECT_EQ(c->tokens, Oracle(a, 4));
  EXPECT_EQ(c->final_event.cached_tokens, 48);
  EXPECT_EQ(TierHits(engine->stats(), "host"), 48);
}

// MLA (DeepSeek-V3's latent attention): its blocks hold one latent row per
// token and layer. Greedy output with prefix hits from T0 and with blocks
// evicted to each real tier (host, disk, Redis) and loaded back is the
// oracle's (one session, no cache), and the hits are counted by tier.
class EngineMlaTest : public EngineTest {
 public:
  EngineMlaTest() : EngineTest(TinyServeMla(128)) {}
};

TEST_F(EngineMlaTest, PrefixHitsFromT0AndEveryTierKeepGreedyOutput) {
  {
    auto engine = Engine::Create(&model_, EngineConfig{});
    ASSERT_TRUE(engine.ok());
    std::vector<std::unique_ptr<Collector>> keep;
    RunSharedPrefix(this, engine->get(), &keep);
    EXPECT_EQ((*engine)->stats().t0_hits, 2 * 32);
  }
  const ModelConfig& cfg = model_.config();
  const ModelFingerprint fp = FingerprintModel(model_);
  std::vector<std::unique_ptr<KvTier>> tiers;
  for (auto f : {KvStorageFormat::kFp32, KvStorageFormat::kInt8}) {
    HostTierOptions ho;
    ho.capacity_blocks = 64;
    ho.format = f;
    ho.row_floats = KvRowFloats(cfg);
    tiers.push_back(std::make_unique<HostTier>(ho));
  }
  const std::string dir = ::testing::TempDir() + "/myriad_mla_disk_" + std::to_string(getpid());
  DiskTierOptions dopt;
  dopt.dir = dir;
  dopt.capacity_bytes = 1 << 26;
  dopt.fingerprint = fp;
  dopt.block_floats = BlockFloats(cfg);
  auto disk = DiskTier::Open(dopt);
  ASSERT_TRUE(disk.ok()) << disk.status().message();
  tiers.push_back(std::move(disk).value());
  testing::RedisTestServer redis_server;
  if (!testing::FindRedisServer().empty()) {
    const std::string err = redis_server.Start();
    ASSERT_EQ(err, "") << err;
    RedisTierOptions ro;
    ro.address.port = redis_server.port();
    ro.fingerprint = fp;
    ro.block_floats = BlockFloats(cfg);
    auto redis = RedisTier::Create(ro);
    ASSERT_TRUE(redis.ok()) << redis.status().message();
    tiers.push_back(std::move(redis).value());
  } else {
    ADD_FAILURE() << "redis-server is not installed (apt-get install redis-server): the Redis tier is untested";
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    KvTier* tier = tiers[i].get();
    SCOPED_TRACE(tier->name() + (i == 1 ? " int8" : ""));
    std::vector<std::unique_ptr<Collector>> keep;
    std::unique_ptr<Engine> engine;
    const auto a = Prompt(70 + i, 50);
    Collector* c = RunEvictAndReturn(this, tier, a, Prompt(80 + i, 50), 8, true, &keep, &engine);
    // int8 storage rounds the latent rows: the tokens may then differ from
    // the fp32 oracle's, but the hits must come.
    if (i != 1) EXPECT_EQ(c->tokens, Oracle(a, 8));
    // The hit is found; the load-or-recompute plan may choose to recompute
    // it (a Redis read measured slow on a loaded machine, against this tiny
    // model's prefill): either way all 48 tokens are accounted for.
    const int64_t recomputed = engine->stats().recomputed_hit_tokens;
    EXPECT_EQ(c->final_event.cached_tokens + recomputed, 48);
    EXPECT_EQ(TierHits(engine->stats(), tier->name()) + recomputed, 48);
    if (tier->name() != "redis") EXPECT_EQ(recomputed, 0) << "memory and disk reads beat recomputing";
  }
  std::filesystem::remove_all(dir);
}

// Host memory over another tier: evictions from T0 go to the host tier
// only; the tier below receives a block when the host tier evicts it (a
// spill), and everything the host holds at shutdown.
TEST_F(EngineTest, HostTierSpillsToTheTierBelow) {
  HostTierOptions opt;
  opt.capacity_blocks = 3;
  HostTier host(opt);
  FakeTier below("below", 0.0);
  EngineConfig cfg;
  cfg.kv_pool_blocks = 4;
  cfg.max_batch = 1;
  cfg.tiers = {&host, &below};
  auto engine = Engine::Create(model(), cfg);
  ASSERT_TRUE(engine.ok());
  std::vector<std::unique_ptr<Collector>> keep;
  auto wait_for = [](const std::function<bool()>& ok) {
    for (int i = 0; i < 2000 && !ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return ok();
  };
  const auto a = Prompt(27, 50), b = Prompt(28, 50), c = Prompt(29, 50);
  RunToEnd(engine->get(), a, GreedyParams(8), &keep);
  RunToEnd(engine->get(), b, GreedyParams(8), &keep);  // evicts a's 3 full blocks into host
  ASSERT_TRUE(wait_for([&] { return host.size_blocks() == 3; }));
  EXPECT_EQ(below.size_blocks(), 0);  // not written past the host tier
  RunToEnd(engine->get(), c, GreedyParams(8), &keep);  // b's blocks push a's out of host, into `below`
  ASSERT_TRUE(wait_for([&] { return below.size_blocks() >= 3; }));
  Collector* again = RunToEnd(engine->get(), a, GreedyParams(8), &keep);
  EXPECT_EQ(again->tokens, Oracle(a, 8));
  EXPECT_EQ(again->final_event.cached_tokens, 48);
  const EngineStats st = (*engine)->stats();
  EXPECT_EQ(TierHits(st, "below"), 48);
  EXPECT_EQ(TierHits(st, "host"), 0);
  EXPECT_GT(host.stats().evictions, 0);
  (*engine)->Shutdown();
  // a, b and c's full blocks, whether they ended in T0 or host, all reach the tier below.
  EXPECT_GE(below.size_blocks(), 9);
  // The tiers outlive the engine: a later Put into host must not call into it.
  host.Put(KvBlock{12345, std::vector<float>(8, 1.0f)});
  EXPECT_TRUE(host.Contains(12345));
}

// Everything at once: shared prefixes, a T0 too small for the working set
// (evictions, write-backs, loads, blocks shared by running requests),
// chunked prefill, cancellations. Every output is the oracle's (a cancelled
// one: a prefix of it).
TEST_F(EngineTest, MixedWorkloadMatchesOracle) {
  FakeTier tier("fake", 0.0);
  EngineConfig cfg;
  cfg.kv_pool_blocks = 10;
  cfg.max_batch = 4;
  cfg.step_token_budget = 32;
  cfg.tiers = {&tier};
  auto engine = Engine::Create(&model_, cfg);
  ASSERT_TRUE(engine.ok());
  std::vector<std::vector<int32_t>> prefixes = {Prompt(71, 48), Prompt(72, 33), Prompt(73, 20)};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_tokens;
  Rng rng(5);
  for (int i = 0; i < 16; ++i) {
    auto p = prefixes[i % 3];
    const auto tail = Prompt(200 + i, 1 + static_cast<int>(rng.Below(20)));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
    max_tokens.push_back(2 + static_cast<int>(rng.Below(10)));
  }
  for (int round = 0; round < 2; ++round) {
    std::vector<std::unique_ptr<Collector>> cs;
    std::vector<uint64_t> ids;
    for (int i = 0; i < 16; ++i) {
      cs.push_back(std::make_unique<Collector>());
      auto id = (*engine)->Submit(prompts[i], GreedyParams(max_tokens[i]), cs.back()->Callback());
      ASSERT_TRUE(id.ok()) << id.status().message();
      ids.push_back(*id);
    }
    if (round == 0) {
      (*engine)->Cancel(ids[5]);
      (*engine)->Cancel(ids[11]);
    }
    for (int i = 0; i < 16; ++i) {
      cs[i]->Wait();
      const auto want = Oracle(prompts[i], max_tokens[i]);
      if (cs[i]->final_event.finish_reason == "cancelled") {
        EXPECT_TRUE(round == 0 && (i == 5 || i == 11));
        ASSERT_LE(cs[i]->tokens.size(), want.size());
        EXPECT_TRUE(std::equal(cs[i]->tokens.begin(), cs[i]->tokens.end(), want.begin())) << "request " << i;
      } else {
        EXPECT_EQ(cs[i]->tokens, want) << "round " << round << " request " << i;
      }
    }
  }
  const EngineStats st = (*engine)->stats();
  EXPECT_GT(st.t0_hits, 0);
  EXPECT_GT(st.tier_hits[0].second, 0);  // the second round finds evicted blocks below
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

// A remote tier that hangs (every call waits on a gate, as a SIGSTOPped
// Redis makes its client wait): requests keep being served, degraded to no
// remote hit, because the scheduler never calls a remote tier.
class HangingRemoteTier : public FakeTier {
 public:
  HangingRemoteTier() : FakeTier("remote", 1e-3) {}
  bool remote() const override { return true; }
  bool Contains(BlockKey key) override {
    WaitOpen();
    return FakeTier::Contains(key);
  }
  bool Get(BlockKey key, KvBlock* out) override {
    WaitOpen();
    return FakeTier::Get(key, out);
  }
  void Hang(bool hang) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hang_ = hang;
    }
    cv_.notify_all();
  }

 private:
  void WaitOpen() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !hang_; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool hang_ = false;
};

TEST_F(EngineTest, HungRemoteTierNeverStallsTheScheduler) {
  HangingRemoteTier remote;
  EngineConfig cfg;
  cfg.tiers = {&remote};
  cfg.write_through = true;
  cfg.load_or_recompute = false;  // always ask, always load
  auto engine = Engine::Create(model(), cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  std::vector<std::unique_ptr<Collector>> keep;
  const std::vector<int32_t> a = Prompt(101, 40), b = Prompt(102, 40);
  RunToEnd(engine->get(), a, GreedyParams(4), &keep);
  remote.Hang(true);  // from here every lookup and read waits until released
  // A stream, and while it runs a new request whose prefix must be looked up.
  keep.push_back(std::make_unique<Collector>());
  Collector* stream = keep.back().get();
  ASSERT_TRUE((*engine)->Submit(Prompt(103, 20), GreedyParams(60), stream->Callback()).ok());
  Collector* fresh = RunToEnd(engine->get(), b, GreedyParams(6), &keep);
  EXPECT_EQ(fresh->tokens, Oracle(b, 6));
  EXPECT_EQ(fresh->final_event.cached_tokens, 0);  // degraded: no remote hit
  stream->Wait();  // (Wait fails the test after 60 s: the tier hangs until released below)
  EXPECT_EQ(stream->tokens, Oracle(Prompt(103, 20), 60));
  EXPECT_GE((*engine)->stats().late_lookups, 1);
  remote.Hang(false);
  (*engine)->Shutdown();
}

TEST_F(EngineTest, CancelStopsARequest) {
  auto engine = Engine::Create(&model_, EngineConfig{});
  ASSERT_TRUE(engine.ok());
  Engine* e = engine->get();
  Collector c;
  uint64_t id = 0;
  std::mutex id_mu;
  std::unique_lock<std::mutex> hold(id_mu);
  auto inner = c.Callback();
  auto r = e->Submit(Prompt(4, 10), GreedyParams(100), [&](const TokenEvent& ev) {
    inner(ev);
    if (!ev.done) {
      std::lock_guard<std::mutex> lock(id_mu);
      e->Cancel(id);  // from the callback, as a client that went away
    }
  });
  ASSERT_TRUE(r.ok());
  id = *r;
  hold.unlock();
  c.Wait();
  EXPECT_EQ(c.final_event.finish_reason, "cancelled");
  EXPECT_LT(c.tokens.size(), 100u);
  EXPECT_EQ(e->stats().cancelled, 1);
  // The engine goes on serving.
  std::vector<std::unique_ptr<Collector>> keep;
  const auto p = Prompt(5, 12);
  EXPECT_EQ(RunToEnd(e, p, GreedyParams(5), &keep)->tokens, Oracle(p, 5));
}

TEST_F(EngineTest, BackPressureAndBadRequests) {
  EngineConfig cfg;
  cfg.max_batch = 1;
  cfg.max_queue = 2;
  auto engine = Engine::Create(&model_, cfg);
  ASSERT_TRUE(engine.ok());
  Engine* e = engine->get();
  // The first request's first token holds the engine thread in its callback
  // until the queue has been probed, so nothing leaves the queue meanwhile.
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, release = false;
  Collector first;
  auto first_cb = first.Callback();
  auto r0 = e->Submit(Prompt(19, 10), GreedyParams(100), [&](const TokenEvent& ev) {
    first_cb(ev);
    std::unique_lock<std::mutex> lock(mu);
    inside = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  ASSERT_TRUE(r0.ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return inside; });
  }
  std::vector<std::unique_ptr<Collector>> cs;
  std::vector<uint64_t> ids = {*r0};
  int rejected = 0;
  for (int i = 0; i < 6; ++i) {
    cs.push_back(std::make_unique<Collector>());
    auto r = e->Submit(Prompt(20 + i, 10), GreedyParams(100), cs.back()->Callback());
    if (r.ok()) {
      ids.push_back(*r);
    } else {
      ++rejected;
      EXPECT_NE(r.status().message().find("queue full"), std::string::npos) << r.status().message();
      cs.pop_back();
    }
  }
  EXPECT_EQ(rejected, 4);  // one running, two waiting
  EXPECT_EQ(e->stats().rejected, 4);
  for (uint64_t id : ids) e->Cancel(id);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  first.Wait();
  EXPECT_EQ(first.final_event.finish_reason, "cancelled");
  for (auto& c : cs) {
    c->Wait();
    EXPECT_EQ(c->final_event.finish_reason, "cancelled");
    EXPECT_TRUE(c->tokens.empty());  // cancelled while waiting
  }

  auto too_long = e->Submit(Prompt(1, 128), GreedyParams(1), [](const TokenEvent&) {});
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("prompt too long"), std::string::npos);
  EXPECT_FALSE(e->Submit({}, GreedyParams(1), [](const TokenEvent&) {}).ok());
  EXPECT_FALSE(e->Submit({1000}, GreedyParams(1), [](const TokenEvent&) {}).ok());
  EXPECT_FALSE(e->Submit({1}, GreedyParams(0), [](const TokenEvent&) {}).ok());
  e->Shutdown();
  EXPECT_FALSE(e->Submit({1}, GreedyParams(1), [](const TokenEvent&) {}).ok());
}

TEST_F(EngineTest, StopSequences) {
  auto engine = Engine::Create(&model_, EngineConfig{});
  ASSERT_TRUE(engine.ok());
  const auto prompt = Prompt(9, 17);
  const auto full = Oracle(prompt, 30);
  std::vector<std::unique_ptr<Collector>> keep;
  // Stop at the two tokens at output positions 6 and 7; the expected output
  // is everything before their first occurrence.
  const std::vector<int32_t> stop(full.begin() + 6, full.begin() + 8);
  size_t first = 0;
  while (!std::equal(stop.begin(), stop.end(), full.begin() + first)) ++first;
  GenerationParams p = GreedyParams(30);
  p.stop_token_seqs = {{96, 95, 94, 93}, stop};  // the first never matches
  Collector* c = RunToEnd(engine->get(), prompt, p, &keep);
  EXPECT_EQ(c->tokens, std::vector<int32_t>(full.begin(), full.begin() + first));
  EXPECT_EQ(c->final_event.finish_reason, "stop");
  EXPECT_EQ(c->final_event.completion_tokens, static_cast<int64_t>(first + 2));
  // A held-back partial match is released when the request ends by length.
  GenerationParams q = GreedyParams(5);
  q.stop_token_seqs = {{full[4], 96}};
  if (full[5] != 96) {
    Collector* d = RunToEnd(engine->get(), prompt, q, &keep);
    EXPECT_EQ(d->tokens, std::vector<int32_t>(full.begin(), full.begin() + 5));
    EXPECT_EQ(d->final_event.finish_reason, "length");
  }
}

TEST_F(EngineTest, SeededSamplingIndependentOfBatching) {
  GenerationParams p;
  p.max_tokens = 12;
  p.sampling = SamplingParams{0.9f, 20, 0.95f};
  p.seed = 42;
  const auto prompt = Prompt(11, 9);
  std::vector<std::unique_ptr<Collector>> keep;
  auto alone = Engine::Create(&model_, EngineConfig{});
  ASSERT_TRUE(alone.ok());
  const auto solo = RunToEnd(alone->get(), prompt, p, &keep)->tokens;
  auto busy = Engine::Create(&model_, EngineConfig{});
  ASSERT_TRUE(busy.ok());
  std::vector<std::unique_ptr<Collector>> others;
  for (int i = 0; i < 5; ++i) {
    others.push_back(std::make_unique<Collector>());
    ASSERT_TRUE((*busy)->Submit(Prompt(60 + i, 20), p, others.back()->Callback()).ok());
  }
  EXPECT_EQ(RunToEnd(busy->get(), prompt, p, &keep)->tokens, solo);
  for (auto& o : others) o->Wait();
}

// End-to-end figures for docs/serving.md (printed, not asserted; runs only
// with MYRIAD_SERVE_FIGURES=1): 16 requests of 128 prompt + 32 generated
// tokens on a small MoE, one after another vs all submitted at once.
TEST(EngineFigures, ConcurrentVsSerial) {
  if (!std::getenv("MYRIAD_SERVE_FIGURES")) GTEST_SKIP() << "set MYRIAD_SERVE_FIGURES=1 to measure";
  ModelConfig mc;
  mc.vocab_size = 4096; mc.d_model = 256; mc.n_layers = 4; mc.n_heads = 8; mc.n_kv_heads = 8;
  mc.d_ff = 1024; mc.n_dense_layers = 1; mc.n_routed_experts = 8; mc.top_k = 2; mc.d_expert = 512;
  mc.max_seq_len = 512;
  Model model(mc);
  model.InitWeights(1);
  const int n = 16, P = 128, G = 32;
  std::vector<std::vector<int32_t>> prompts(n);
  for (int i = 0; i < n; ++i)
    for (int t = 0; t < P; ++t) prompts[i].push_back((i * 131 + t * 17) % 4096);
  EngineConfig cfg;
  cfg.prefix_cache = false;
  using Clock = std::chrono::steady_clock;
  double secs[2];
  for (int concurrent = 0; concurrent < 2; ++concurrent) {
    auto engine = Engine::Create(&model, cfg);
    ASSERT_TRUE(engine.ok());
    std::vector<std::unique_ptr<Collector>> cs;
    const auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      cs.push_back(std::make_unique<Collector>());
      ASSERT_TRUE((*engine)->Submit(prompts[i], GreedyParams(G), cs.back()->Callback()).ok());
      if (!concurrent) cs.back()->Wait();
    }
    for (auto& c : cs) c->Wait();
    secs[concurrent] = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::printf("[figures] engine, %d requests of %d+%d tokens: serial %.2f s (%.0f generated tokens/s), "
              "concurrent %.2f s (%.0f generated tokens/s)\n",
              n, P, G, secs[0], n * G / secs[0], secs[1], n * G / secs[1]);
}

TEST(LoadCostTest, SlowTierRecomputesFastTierLoads) {
  const double recompute = 16 / 1000.0;  // 1000 prefill tokens/s
  LoadPlan slow = ChooseLoadPlan({0.5, 0.5, 0.5}, recompute);
  EXPECT_EQ(slow.load_blocks, 0);
  EXPECT_EQ(slow.recompute_blocks, 3);
  LoadPlan fast = ChooseLoadPlan({0.001, 0.001, 0.001}, recompute);
  EXPECT_EQ(fast.load_blocks, 3);
  EXPECT_EQ(fast.recompute_blocks, 0);
  // Free blocks first (already in memory), then a slow tier: load the free ones only.
  LoadPlan mixed = ChooseLoadPlan({0, 0, 1.0, 1.0}, recompute);
  EXPECT_EQ(mixed.load_blocks, 2);
  EXPECT_EQ(mixed.recompute_blocks, 2);
  // A slow block followed by free ones is worth loading when the sum is cheaper.
  LoadPlan worth = ChooseLoadPlan({0.02, 0, 0, 0}, recompute);
  EXPECT_EQ(worth.load_blocks, 4);
  EXPECT_LE(worth.load_seconds + worth.recompute_seconds, worth.all_recompute_seconds);
}

TEST(LoadCostTest, WaitingForTheIoThreadCostsAStep) {
  const double recompute = 0.005;  // per block
  // Three blocks read at 1 ms each beat recomputing them (15 ms) when read
  // inline, but not when the request must also sit out a 20 ms step.
  const std::vector<double> secs = {0.001, 0.001, 0.001};
  LoadPlan inline_all = ChooseLoadPlan(secs, recompute, /*inline_blocks=*/3, /*async_seconds=*/0.020);
  EXPECT_EQ(inline_all.load_blocks, 3);
  EXPECT_FALSE(inline_all.async);
  LoadPlan async_all = ChooseLoadPlan(secs, recompute, /*inline_blocks=*/0, /*async_seconds=*/0.020);
  EXPECT_EQ(async_all.load_blocks, 0);
  EXPECT_EQ(async_all.recompute_blocks, 3);
  // Two inline, then slow ones: load the inline ones, recompute the rest...
  LoadPlan split = ChooseLoadPlan({0.0, 0.0, 0.001, 0.001}, recompute, 2, 0.020);
  EXPECT_EQ(split.load_blocks, 2);
  EXPECT_FALSE(split.async);
  // ...unless enough of them make the wait pay.
  LoadPlan many = ChooseLoadPlan(std::vector<double>(12, 0.001), recompute, 0, 0.020);
  EXPECT_EQ(many.load_blocks, 12);
  EXPECT_TRUE(many.async);
  EXPECT_NEAR(many.load_seconds, 0.032, 1e-12);
}

TEST(LoadCostTest, MeasuredBandwidthReplacesThePrior) {
  const int64_t block_bytes = 1 << 16;
  LoadCostModel m(block_bytes, 2000.0);
  EXPECT_DOUBLE_EQ(m.RecomputeSecondsPerBlock(), 16 / 2000.0);
  TierStats none;
  EXPECT_DOUBLE_EQ(m.TierSecondsPerBlock("redis", none), block_bytes / PriorBytesPerSecond("redis"));
  EXPECT_LT(m.TierSecondsPerBlock("host", none), m.TierSecondsPerBlock("disk", none));
  TierStats measured;
  measured.bytes_read = 8 * block_bytes;
  measured.read_seconds = 0.8;  // 0.1 s per block
  EXPECT_NEAR(m.TierSecondsPerBlock("host", measured), 0.1, 1e-12);
  m.ObservePrefill(100, 1.0);  // first measurement replaces the start value
  EXPECT_NEAR(m.prefill_tokens_per_second(), 100.0, 1e-9);
  m.ObservePrefill(200, 1.0);
  EXPECT_NEAR(m.prefill_tokens_per_second(), 120.0, 1e-9);
}

}  // namespace
}  // namespace myriad::serve