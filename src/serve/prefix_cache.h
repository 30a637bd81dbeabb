// PrefixCache: what the serving engine knows about KV blocks across
// requests, apart from scheduling. It holds
//   - the block index: the chain key (tier.h) of each full block in the
//     device pool (T0), published as requests compute them (the pool keeps
//     a published block as cached, and tells this cache when it reuses
//     one), walked by prefix at admission;
//   - the lookups through the tiers: T0, then the write-back queue, then the
//     lower tiers in order (host, disk, Redis), one ContainsMany per tier;
//     a remote tier (KvTier::remote) is asked ahead of admission on the
//     lookup thread (StartRemoteLookup), so a hung server never stalls the
//     scheduler: a request whose answer is late is admitted without it;
//   - the load-or-recompute decision: its inputs (LoadCostModel, owned here,
//     fed by the engine's measured steps) and the plan (ChooseLoadPlan);
//   - the loads: fresh T0 blocks for the planned hit, memory copies at once,
//     the rest on its own I/O thread;
//   - the write-back policy: a T0 eviction goes down the hierarchy on a
//     write-back thread into the first lower tier that spills (host memory),
//     which hands its own evictions on to the tiers below it; with
//     write_through every published block also goes to every tier; at Close
//     every block still cached in T0, then every block the spilling tiers
//     hold, goes down.
// docs/serving.md ("KV pool and prefix cache", "Lower tiers", "Load or
// recompute") describes the policy.
//
// Threads: every method except stats() is for the thread that owns the pool
// (the engine's scheduler). Internally the write-back thread, the I/O
// thread and the lookup thread call the tiers, and the I/O thread fills a
// PrefixLoad's blocks; the pool's block data pointers are stable, so the
// I/O thread may fill blocks allocated for it. The scheduler itself calls
// only the local tiers (host, disk), and never waits for the other threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "serve/kv_pool.h"
#include "serve/kvcache/tier.h"
#include "serve/load_cost.h"
#include "serve/worker.h"

namespace myriad::serve {

struct PrefixCacheConfig {
  bool enabled = true;             // EngineConfig::prefix_cache: publish and match at all
  std::vector<KvTier*> tiers;      // host, disk, redis, in that order; not owned, outlive Close
  bool load_or_recompute = true;   // the cost model decides how much of a hit to load
  bool write_through = false;      // every published block also goes to every tier at once
  // How long a waiting request waits for its remote-tier lookup before it is
  // admitted without (a hung server: no remote hit, the prefix recomputed).
  double remote_lookup_timeout_s = 0.05;
};

// How far a sequence's chain of published blocks goes: its first `blocks`
// blocks are in the index (published by it or found there), the last of
// them under `last_key` (0 before the first).
struct ChainCursor {
  int64_t blocks = 0;
  BlockKey last_key = 0;
};

// Where one matched block beyond the shared T0 run comes from.
struct MatchedBlock {
  static constexpr int32_t kCopiedFromT0 = -2;  // t0_block once its copy is made
  BlockKey key = 0;
  int32_t t0_block = -1;                   // resident in T0 (copied into a fresh block)
  std::shared_ptr<const KvBlock> pending;  // on its way to the tiers (write-back queue)
  int tier = -1;                           // index into PrefixCacheConfig::tiers
};

// A planned hit being read into a request's fresh blocks.
struct PrefixLoad {
  std::vector<MatchedBlock> src;  // in prefix order
  std::vector<int32_t> dst;       // the T0 block each one is read into
  ChainCursor base;               // the chain before src[0]
  std::atomic<bool> done{false};
  int64_t ok = 0;                 // leading blocks that arrived intact (final once ready)
  bool ready() const { return done.load(std::memory_order_acquire); }
};

// A prompt's remote-tier lookup, made on the lookup thread while the
// request waits in the queue: which of its matchable blocks each remote
// tier holds.
struct RemoteLookup {
  std::vector<BlockKey> keys;             // chain keys of blocks 0..n-1
  std::vector<std::vector<bool>> found;   // per tier: per key (empty: not asked)
  std::chrono::steady_clock::time_point deadline;  // admitted without it after this
  std::atomic<bool> done{false};
  bool ready() const { return done.load(std::memory_order_acquire); }
  // Ready, or given up on: the request may be admitted.
  bool settled() const { return ready() || std::chrono::steady_clock::now() >= deadline; }
};

struct PrefixCacheStats {
  int64_t t0_hits = 0;                // prompt tokens served from the device pool
  std::vector<std::pair<std::string, int64_t>> tier_hits;  // tokens loaded per lower tier
  int64_t recomputed_hit_tokens = 0;  // matched tokens the plan chose to recompute
  int64_t skipped_lookups = 0;        // slow-tier lookups not made: no hit there could pay
  int64_t late_lookups = 0;           // remote lookups not answered in time: admitted without
};

class PrefixCache {
 public:
  // `pool` must outlive this object, which hooks its on_evict (one
  // PrefixCache per pool). `on_load_done` is called on the I/O thread when
  // a background load finishes (the engine wakes its loop).
  PrefixCache(KvPool* pool, const ModelFingerprint& fp, const PrefixCacheConfig& cfg,
              std::function<void()> on_load_done = nullptr);
  ~PrefixCache();  // Close()

  // Full blocks of a prompt of n tokens that may be matched: all of them
  // except the one holding the last token, which is always computed (its
  // logits give the first generated token). 0 when the cache is disabled.
  int64_t MatchableBlocks(int64_t prompt_len) const;

  // Admission, step 1: the leading run of the first n_blocks blocks of
  // `tokens` resident in T0, each referenced for the caller (shared as they
  // are); *cursor is the chain after it.
  std::vector<int32_t> AcquireResidentRun(const int32_t* tokens, int64_t n_blocks, ChainCursor* cursor);
  // Admission refused: drops the run's references.
  void ReleaseRun(const std::vector<int32_t>& run);
  // Before admission: asks the remote tiers (on the lookup thread) which of
  // the first n_blocks blocks of `tokens` they hold. Null when there is
  // nothing to ask (no remote tier, the prefix resident in T0, or the cost
  // model says no hit there could pay); `tokens` is read only in this call.
  std::shared_ptr<RemoteLookup> StartRemoteLookup(const int32_t* tokens, int64_t n_blocks);
  // Admission, step 2, once the request is admitted with its run (whose
  // tokens count as T0 hits from here): match blocks [after_run.blocks,
  // n_blocks) in T0 (copies: at most spare_blocks of them), the write-back
  // queue and the tiers; plan what to load; allocate a fresh block for each
  // planned one (appended to *table) and read what is in memory at once.
  // Returns null when nothing is loaded; else a load that is ready() at
  // once or when the I/O thread is done. Either way, CompleteLoad follows.
  // The remote tiers' answers come from `remote` (StartRemoteLookup's, when
  // ready; else the remote tiers count as missing).
  std::shared_ptr<PrefixLoad> Extend(const int32_t* tokens, int64_t n_blocks, const ChainCursor& after_run,
                                     int64_t spare_blocks, std::vector<int32_t>* table,
                                     const RemoteLookup* remote = nullptr);
  // A ready load: its intact leading blocks are published and credited to
  // where they came from; returns the chain after them. The blocks after
  // the first failed read stay in the table, to be recomputed.
  ChainCursor CompleteLoad(const PrefixLoad& load);

  // Publishes every block of `table` that became full (its tokens up to
  // `computed` are written), advancing *cursor; with write_through, a block
  // newly published also goes to the tiers.
  void PublishFull(const int32_t* tokens, int64_t computed, const std::vector<int32_t>& table, ChainCursor* cursor);

  // The block index. Find: the T0 block published under `key`, or -1.
  // Publish: enters block b (which the caller references, and whose tokens
  // are all written) under `key` and has the pool keep it as cached; false,
  // and b stays unpublished, when the key is held by another block (two
  // requests computed the same prefix at once) or b already has a key.
  int32_t Find(BlockKey key) const;
  bool Publish(int32_t b, BlockKey key);

  // The weights changed (Engine::WeightsChanged), with no block referenced:
  // every block cached in T0 is dropped (freed, not written down), the
  // index is emptied, and chain keys are made with `fp` from now on, so
  // what the tiers and the write-back queue hold under the old fingerprint
  // is never matched. Returns the dropped blocks.
  int64_t Reset(const ModelFingerprint& fp);

  // The cost model: the engine feeds it measured prefills and steps.
  LoadCostModel& cost() { return cost_; }
  PrefixCacheStats stats() const;  // any thread

  // Waits until every write-back queued so far is in the tiers (a spilling
  // tier's hand-offs included). For tests and tools; no-op without tiers.
  void Drain();

  // Stops the I/O thread, drains the write-back queue into the tiers, then
  // writes every block still cached in T0 down the hierarchy and has the
  // spilling tiers hand theirs on; unhooks from the pool and the tiers (the
  // index is then no longer kept up to date).
  // Idempotent; the pool must not be used for new loads after it.
  void Close();

 private:
  BlockKey KeyAt(const int32_t* tokens, int64_t i, BlockKey parent) const;
  bool WritesBack() const { return cfg_.enabled && !cfg_.tiers.empty(); }
  // Extend's parts.
  std::vector<MatchedBlock> MatchBeyond(const int32_t* tokens, int64_t n_blocks, const ChainCursor& after_run,
                                        int64_t spare_blocks, const RemoteLookup* remote);
  bool WorthAsking(KvTier* tier, int64_t n_blocks);
  LoadPlan PlanLoad(const std::vector<MatchedBlock>& match, int64_t* inline_blocks);
  std::shared_ptr<PrefixLoad> StartLoad(std::vector<MatchedBlock> match, const ChainCursor& base,
                                        int64_t inline_blocks, std::vector<int32_t>* table);
  bool ReadBlocks(PrefixLoad* load, int64_t from, int64_t to);
  // The pool reuses cached block b: its key leaves the index, the block
  // goes to the write-back queue.
  void OnEvict(int32_t b);
  // Write-back.
  void WriteBack(int32_t b, BlockKey key);
  void WriteThrough(int32_t b, BlockKey key);
  void WriteDownFrom(size_t first_tier, const KvBlock& blk);
  std::shared_ptr<const KvBlock> Pending(BlockKey key);
  int64_t MaxQueuedWrites() const;

  KvPool& pool_;
  ModelFingerprint fp_;  // changed only by Reset (scheduler thread; the other threads get keys, not fp_)
  const PrefixCacheConfig cfg_;
  LoadCostModel cost_;
  std::function<void()> on_load_done_;
  bool closed_ = false;

  std::unordered_map<BlockKey, int32_t> index_;  // published key -> T0 block
  std::vector<BlockKey> block_key_;              // per T0 block: its key while published

  mutable std::mutex stats_mu_;
  PrefixCacheStats stats_;

  std::mutex pending_mu_;  // guards pending_, dropped_writebacks_, through_inflight_
  std::unordered_map<BlockKey, std::shared_ptr<const KvBlock>> pending_;  // write-backs in flight
  int64_t dropped_writebacks_ = 0;
  int64_t through_inflight_ = 0;
  std::unique_ptr<Worker> writeback_, loader_, lookup_;
};

}  // namespace myriad::serve
