#include "serve/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <future>

#include "core/check.h"
#include "core/log.h"

namespace myriad::serve {
namespace {

// A lower-tier block is read by the scheduler at admission (not the I/O
// thread) when its measured read takes at most this long, up to a total.
constexpr double kInlineBlockSeconds = 100e-6;
constexpr double kInlineBudgetSeconds = 2e-3;

std::shared_ptr<KvBlock> CopyOut(const KvPool& pool, int32_t b, BlockKey key) {
  auto blk = std::make_shared<KvBlock>();
  blk->key = key;
  blk->data.resize(pool.block_floats());
  pool.CopyOut(b, blk->data.data());
  return blk;
}

}  // namespace

PrefixCache::PrefixCache(KvPool* pool, const ModelFingerprint& fp, const PrefixCacheConfig& cfg,
                         std::function<void()> on_load_done)
    : pool_(*pool), fp_(fp), cfg_(cfg),
      cost_(pool->block_floats() * static_cast<int64_t>(sizeof(float)), 1000.0),
      on_load_done_(std::move(on_load_done)) {
  for (KvTier* t : cfg_.tiers) stats_.tier_hits.emplace_back(t->name(), 0);
  block_key_.assign(pool_.num_blocks(), 0);
  pool_.set_on_evict([this](int32_t b) { OnEvict(b); });
  if (WritesBack()) {
    writeback_ = std::make_unique<Worker>(/*nice=*/10);
    for (size_t t = 0; t < cfg_.tiers.size(); ++t)
      if (cfg_.tiers[t]->CanSpill())
        cfg_.tiers[t]->SetSpill([this, t](const KvBlock& blk) { WriteDownFrom(t + 1, blk); });
  }
  loader_ = std::make_unique<Worker>();
  for (KvTier* t : cfg_.tiers)
    if (t->remote()) lookup_ = std::make_unique<Worker>();
}

PrefixCache::~PrefixCache() { Close(); }

int64_t PrefixCache::MatchableBlocks(int64_t prompt_len) const {
  return cfg_.enabled && prompt_len > 0 ? (prompt_len - 1) / kBlockTokens : 0;
}

BlockKey PrefixCache::KeyAt(const int32_t* tokens, int64_t i, BlockKey parent) const {
  return ChainKey(parent, tokens + i * kBlockTokens, kBlockTokens, fp_);
}

int32_t PrefixCache::Find(BlockKey key) const {
  auto it = index_.find(key);
  return it == index_.end() ? -1 : it->second;
}

bool PrefixCache::Publish(int32_t b, BlockKey key) {
  CHECK(pool_.refs(b) > 0);
  if (pool_.is_cached(b) || index_.count(key)) return false;
  pool_.MarkCached(b);
  index_.emplace(key, b);
  block_key_[b] = key;
  return true;
}

void PrefixCache::OnEvict(int32_t b) {
  // Runs inside KvPool::Allocate, the block's data still intact.
  const BlockKey key = block_key_[b];
  index_.erase(key);
  block_key_[b] = 0;
  if (WritesBack()) WriteBack(b, key);
}

int64_t PrefixCache::Reset(const ModelFingerprint& fp) {
  const int64_t dropped = pool_.DropUnreferencedCached();
  CHECK_MSG(pool_.cached() == 0, "PrefixCache::Reset with cached blocks still referenced (a request running)");
  index_.clear();
  block_key_.assign(pool_.num_blocks(), 0);
  fp_ = fp;
  return dropped;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

// ---- admission ----

std::vector<int32_t> PrefixCache::AcquireResidentRun(const int32_t* tokens, int64_t n_blocks, ChainCursor* cursor) {
  std::vector<int32_t> run;
  *cursor = ChainCursor{};
  for (int64_t i = 0; i < n_blocks; ++i) {
    const BlockKey key = KeyAt(tokens, i, cursor->last_key);
    const int32_t b = Find(key);
    if (b < 0) break;
    pool_.Ref(b);
    run.push_back(b);
    cursor->blocks = i + 1;
    cursor->last_key = key;
  }
  return run;
}

void PrefixCache::ReleaseRun(const std::vector<int32_t>& run) {
  for (int32_t b : run) pool_.Release(b);
}

std::shared_ptr<RemoteLookup> PrefixCache::StartRemoteLookup(const int32_t* tokens, int64_t n_blocks) {
  if (!lookup_ || n_blocks <= 0) return nullptr;
  auto lookup = std::make_shared<RemoteLookup>();
  int64_t resident = 0;  // the leading run in T0 now: not asked about
  for (int64_t i = 0; i < n_blocks; ++i) {
    lookup->keys.push_back(KeyAt(tokens, i, i == 0 ? 0 : lookup->keys.back()));
    if (resident == i && Find(lookup->keys.back()) >= 0) ++resident;
  }
  if (resident == n_blocks) return nullptr;
  std::vector<size_t> ask;
  lookup->found.resize(cfg_.tiers.size());
  for (size_t t = 0; t < cfg_.tiers.size(); ++t)
    if (cfg_.tiers[t]->remote() && WorthAsking(cfg_.tiers[t], n_blocks - resident)) ask.push_back(t);
  if (ask.empty()) return nullptr;
  lookup->deadline = std::chrono::steady_clock::now() +
                     std::chrono::microseconds(static_cast<int64_t>(cfg_.remote_lookup_timeout_s * 1e6));
  lookup_->Post([this, lookup, ask, resident] {
    const std::vector<BlockKey> keys(lookup->keys.begin() + resident, lookup->keys.end());
    for (size_t t : ask) {
      std::vector<bool> got = cfg_.tiers[t]->ContainsMany(keys);
      got.insert(got.begin(), resident, false);  // (T0's; never read from here)
      lookup->found[t] = std::move(got);
    }
    lookup->done.store(true, std::memory_order_release);
    if (on_load_done_) on_load_done_();
  });
  return lookup;
}

std::shared_ptr<PrefixLoad> PrefixCache::Extend(const int32_t* tokens, int64_t n_blocks, const ChainCursor& after_run,
                                                int64_t spare_blocks, std::vector<int32_t>* table,
                                                const RemoteLookup* remote) {
  std::vector<MatchedBlock> match = MatchBeyond(tokens, n_blocks, after_run, spare_blocks, remote);
  int64_t inline_blocks = 0;
  const LoadPlan plan = PlanLoad(match, &inline_blocks);
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.t0_hits += after_run.blocks * kBlockTokens;
    stats_.recomputed_hit_tokens += plan.recompute_blocks * kBlockTokens;
  }
  match.resize(plan.load_blocks);
  if (match.empty()) return nullptr;
  return StartLoad(std::move(match), after_run, inline_blocks, table);
}

std::vector<MatchedBlock> PrefixCache::MatchBeyond(const int32_t* tokens, int64_t n_blocks,
                                                   const ChainCursor& after_run, int64_t spare_blocks,
                                                   const RemoteLookup* remote) {
  // Block by block: in T0 again (after a gap), in the write-back queue, in
  // the first lower tier that has the key; the match ends at a key found
  // nowhere. A local tier is asked once, for all the remaining keys, when
  // the walk first reaches it; a remote tier's answers are the lookup's,
  // made before admission (none when it is late: the tier counts as empty).
  const bool remote_ready = remote && remote->ready();
  if (remote && !remote_ready) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.late_lookups;
  }
  std::vector<BlockKey> keys;
  for (int64_t i = after_run.blocks; i < n_blocks; ++i)
    keys.push_back(KeyAt(tokens, i, keys.empty() ? after_run.last_key : keys.back()));
  std::vector<std::vector<bool>> in_tier(cfg_.tiers.size());
  std::vector<MatchedBlock> match;
  int64_t t0_copies = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(keys.size()); ++j) {
    MatchedBlock m;
    m.key = keys[j];
    if ((m.t0_block = Find(m.key)) >= 0) {
      // Copied into a fresh block, its source referenced meanwhile: that
      // takes one spare block each for a moment.
      if (t0_copies == spare_blocks) break;
      ++t0_copies;
    } else if (!(m.pending = Pending(m.key))) {
      for (size_t t = 0; t < cfg_.tiers.size() && m.tier < 0; ++t) {
        if (in_tier[t].empty() && cfg_.tiers[t]->remote()) {
          const int64_t first = after_run.blocks;
          if (remote_ready && static_cast<int64_t>(remote->found[t].size()) >= n_blocks)
            in_tier[t].assign(remote->found[t].begin() + first, remote->found[t].begin() + n_blocks);
          else
            in_tier[t].assign(keys.size(), false);
        } else if (in_tier[t].empty()) {
          in_tier[t].assign(j, false);
          const std::vector<BlockKey> rest(keys.begin() + j, keys.end());
          if (WorthAsking(cfg_.tiers[t], static_cast<int64_t>(rest.size()))) {
            const std::vector<bool> got = cfg_.tiers[t]->ContainsMany(rest);
            in_tier[t].insert(in_tier[t].end(), got.begin(), got.end());
          } else {
            in_tier[t].resize(keys.size(), false);
          }
        }
        if (in_tier[t][j]) m.tier = static_cast<int>(t);
      }
      if (m.tier < 0) break;
    }
    match.push_back(std::move(m));
  }
  return match;
}

bool PrefixCache::WorthAsking(KvTier* tier, int64_t n_blocks) {
  // A tier too slow to read at admission is not even asked (a round trip
  // to a remote store) when loading all n blocks from it, plus the step the
  // request would wait for the I/O thread, could not beat recomputing them.
  if (!cfg_.load_or_recompute) return true;
  const double read = cost_.TierSecondsPerBlock(tier->name(), tier->stats());
  if (read <= kInlineBlockSeconds) return true;
  const double saved = n_blocks * (cost_.RecomputeSecondsPerBlock() - read) - cost_.step_seconds();
  if (saved > 0) return true;
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.skipped_lookups;
  return false;
}

LoadPlan PrefixCache::PlanLoad(const std::vector<MatchedBlock>& match, int64_t* inline_blocks) {
  // The leading blocks already in memory (T0 copies, write-back queue, a
  // tier whose measured read is a memory copy) are read at admission; a
  // read from a slower tier goes to the I/O thread, and the request waits
  // at least a step for it.
  std::vector<double> secs;
  double inline_secs = 0;
  bool inline_run = true;
  *inline_blocks = 0;
  for (const auto& m : match) {
    double s = 0.0;  // in memory already
    bool may_stall = false;  // a remote tier is never read by the scheduler, however fast it was
    if (m.tier >= 0) {
      KvTier* t = cfg_.tiers[m.tier];
      s = cost_.TierSecondsPerBlock(t->name(), t->stats());
      may_stall = t->remote();
    }
    secs.push_back(s);
    inline_run = inline_run && !may_stall && s <= kInlineBlockSeconds && inline_secs + s <= kInlineBudgetSeconds;
    if (inline_run) {
      ++*inline_blocks;
      inline_secs += s;
    }
  }
  LoadPlan plan;
  plan.load_blocks = static_cast<int64_t>(match.size());
  plan.async = plan.load_blocks > *inline_blocks;
  if (cfg_.load_or_recompute && !match.empty())
    plan = ChooseLoadPlan(secs, cost_.RecomputeSecondsPerBlock(), *inline_blocks, cost_.step_seconds());
  return plan;
}

std::shared_ptr<PrefixLoad> PrefixCache::StartLoad(std::vector<MatchedBlock> match, const ChainCursor& base,
                                                   int64_t inline_blocks, std::vector<int32_t>* table) {
  // Fresh blocks for the loaded ones; T0-resident sources are referenced
  // while the allocations run so that they cannot be evicted meanwhile.
  auto load = std::make_shared<PrefixLoad>();
  load->base = base;
  for (auto& m : match)
    if (m.t0_block >= 0) pool_.Ref(m.t0_block);
  for (size_t i = 0; i < match.size(); ++i) {
    const int32_t b = pool_.Allocate();
    CHECK_MSG(b >= 0, "KV pool exhausted while loading a prefix hit (the caller's room check is wrong)");
    load->dst.push_back(b);
    table->push_back(b);
  }
  load->src = std::move(match);
  const int64_t n_load = static_cast<int64_t>(load->src.size());
  const int64_t n_inline = std::min(inline_blocks, n_load);
  if (!ReadBlocks(load.get(), 0, n_inline) || n_inline == n_load) {
    // Everything arrived (or a block failed and the rest is recomputed).
    for (auto& m : load->src)
      if (m.t0_block >= 0) {
        pool_.Release(m.t0_block);
        m.t0_block = -1;
      }
    load->done.store(true, std::memory_order_release);
    return load;
  }
  // The pool belongs to this thread: T0 sources after the inline run are
  // copied now, the I/O thread reads only the tiers.
  for (int64_t i = n_inline; i < n_load; ++i) {
    MatchedBlock& m = load->src[i];
    if (m.t0_block < 0) continue;
    pool_.CopyBlock(m.t0_block, load->dst[i]);
    pool_.Release(m.t0_block);
    m.t0_block = MatchedBlock::kCopiedFromT0;
  }
  loader_->Post([this, load, n_inline, n_load] {
    ReadBlocks(load.get(), n_inline, n_load);
    load->done.store(true, std::memory_order_release);
    if (on_load_done_) on_load_done_();
  });
  return load;
}

bool PrefixCache::ReadBlocks(PrefixLoad* load, int64_t from, int64_t to) {
  // Stops at the first block that is missing or damaged (load->ok counts
  // the intact leading ones); T0 sources are released as they are copied.
  const int64_t floats = pool_.block_floats();
  KvBlock blk;
  for (int64_t i = from; i < to; ++i) {
    MatchedBlock& m = load->src[i];
    const int32_t dst = load->dst[i];
    if (m.t0_block >= 0) {
      pool_.CopyBlock(m.t0_block, dst);
      pool_.Release(m.t0_block);
      m.t0_block = MatchedBlock::kCopiedFromT0;
    } else if (m.pending) {
      pool_.CopyIn(dst, m.pending->data.data());
    } else if (m.tier >= 0) {
      const bool ok = cfg_.tiers[m.tier]->Get(m.key, &blk) && blk.key == m.key &&
                      static_cast<int64_t>(blk.data.size()) == floats;
      if (!ok) return false;
      pool_.CopyIn(dst, blk.data.data());
    }
    ++load->ok;
  }
  return true;
}

ChainCursor PrefixCache::CompleteLoad(const PrefixLoad& load) {
  CHECK(load.ready());
  ChainCursor c = load.base;
  std::vector<int64_t> tier_tokens(cfg_.tiers.size(), 0);
  int64_t t0_copied = 0;
  for (int64_t i = 0; i < load.ok; ++i) {
    const MatchedBlock& m = load.src[i];
    if (cfg_.enabled) Publish(load.dst[i], m.key);
    c.last_key = m.key;
    if (m.t0_block == MatchedBlock::kCopiedFromT0) {
      ++t0_copied;
    } else {
      const int tier = m.pending ? 0 : m.tier;  // the write-back queue is credited to the first tier
      if (tier >= 0) tier_tokens[tier] += kBlockTokens;
    }
  }
  c.blocks = load.base.blocks + load.ok;
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.t0_hits += t0_copied * kBlockTokens;
  for (size_t t = 0; t < tier_tokens.size(); ++t) stats_.tier_hits[t].second += tier_tokens[t];
  return c;
}

void PrefixCache::PublishFull(const int32_t* tokens, int64_t computed, const std::vector<int32_t>& table,
                              ChainCursor* cursor) {
  if (!cfg_.enabled) return;
  while ((cursor->blocks + 1) * kBlockTokens <= computed) {
    const BlockKey key = KeyAt(tokens, cursor->blocks, cursor->last_key);
    const int32_t b = table[cursor->blocks];
    if (Publish(b, key) && cfg_.write_through && writeback_) WriteThrough(b, key);
    cursor->last_key = key;
    ++cursor->blocks;
  }
}

// ---- write-back ----

int64_t PrefixCache::MaxQueuedWrites() const {
  // When the tiers fall behind by more than a pool's worth of blocks,
  // further write-backs are dropped rather than queued (a cache may lose
  // blocks; memory must stay bounded).
  return std::max<int64_t>(64, pool_.num_blocks());
}

void PrefixCache::WriteBack(int32_t b, BlockKey key) {
  // Copy now (the block is about to be reused), write to the tiers later;
  // the copy stays findable (Pending) until the write is done.
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (static_cast<int64_t>(pending_.size()) >= MaxQueuedWrites()) {
      if (dropped_writebacks_++ == 0) LOG_WARN("engine: KV write-back behind; dropping evicted blocks");
      return;
    }
  }
  std::shared_ptr<const KvBlock> c = CopyOut(pool_, b, key);
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending_[key] = c;
  }
  writeback_->Post([this, c] {
    WriteDownFrom(0, *c);
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto it = pending_.find(c->key);
    if (it != pending_.end() && it->second == c) pending_.erase(it);
  });
}

void PrefixCache::WriteThrough(int32_t b, BlockKey key) {
  // The block stays cached in T0 (no pending entry needed): a copy goes to
  // every tier in the background, unless they are a pool's worth behind.
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (static_cast<int64_t>(pending_.size()) + through_inflight_ >= MaxQueuedWrites()) return;
    ++through_inflight_;
  }
  std::shared_ptr<const KvBlock> c = CopyOut(pool_, b, key);
  writeback_->Post([this, c] {
    for (KvTier* t : cfg_.tiers) t->Put(*c);
    std::lock_guard<std::mutex> lock(pending_mu_);
    --through_inflight_;
  });
}

void PrefixCache::WriteDownFrom(size_t first_tier, const KvBlock& blk) {
  // Into each tier from `first_tier` on that lacks the block (a block loaded
  // from the tiers and evicted again is usually still there: it is not
  // written twice), stopping after a tier that spills -- the rest get the
  // block when that tier evicts it (or at Close). Runs on the write-back
  // thread (and in Close).
  for (size_t t = first_tier; t < cfg_.tiers.size(); ++t) {
    KvTier* tier = cfg_.tiers[t];
    if (!tier->Contains(blk.key)) tier->Put(blk);
    if (tier->CanSpill()) break;
  }
}

std::shared_ptr<const KvBlock> PrefixCache::Pending(BlockKey key) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_.find(key);
  return it == pending_.end() ? nullptr : it->second;
}

void PrefixCache::Drain() {
  if (!writeback_) return;
  std::promise<void> done;
  std::future<void> f = done.get_future();
  writeback_->Post([&done] { done.set_value(); });  // runs after every earlier task
  f.wait();
}

void PrefixCache::Close() {
  if (closed_) return;
  closed_ = true;
  lookup_.reset();
  loader_.reset();
  writeback_.reset();  // drains the queued write-backs into the tiers
  pool_.set_on_evict(nullptr);
  if (!WritesBack()) return;
  // Blocks still cached in the device pool go down too, so a restarted
  // server finds them on disk (and other servers in the remote tier).
  int64_t n = 0;
  KvBlock blk;
  for (int32_t b = 0; b < static_cast<int32_t>(pool_.num_blocks()); ++b) {
    if (!pool_.is_cached(b)) continue;
    blk.key = block_key_[b];
    blk.data.resize(pool_.block_floats());
    pool_.CopyOut(b, blk.data.data());
    WriteDownFrom(0, blk);
    ++n;
  }
  // Then what the memory tiers hold goes on to the persistent ones.
  for (KvTier* t : cfg_.tiers) t->SpillAll();
  for (KvTier* t : cfg_.tiers) t->SetSpill(nullptr);  // the tiers may outlive this cache
  if (n > 0) LOG_INFO("engine: %lld cached KV blocks written to the lower tiers at shutdown", static_cast<long long>(n));
}

}  // namespace myriad::serve
