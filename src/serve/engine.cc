// The engine: a scheduler thread that, each step, admits waiting requests
// (prefix match in T0, then in the lower tiers, load-or-recompute plan,
// prefetch on an I/O thread), builds one batch (decode tokens first, then
// prefill chunks, under step_token_budget), runs the batched runner, samples,
// emits, publishes full blocks to the prefix index and frees finished
// requests' blocks. Evicted cached blocks go down the tiers on a write-back
// thread: into the first tier that spills (host memory), and from there to
// disk and the remote store when it evicts them. docs/serving.md describes
// the policy.

#include "serve/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/check.h"
#include "core/log.h"
#include "core/rng.h"
#include "serve/kv_pool.h"
#include "serve/load_cost.h"
#include "serve/runner.h"
#include "serve/worker.h"

namespace myriad::serve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A lower-tier block is read by the scheduler at admission (not the I/O
// thread) when its measured read takes at most this long, up to a total.
constexpr double kInlineBlockSeconds = 100e-6;
constexpr double kInlineBudgetSeconds = 2e-3;

// Where one matched block beyond the leading T0 run comes from.
constexpr int32_t kCopiedFromT0 = -2;  // MatchedBlock::t0_block once copied at admission
struct MatchedBlock {
  BlockKey key = 0;
  int32_t t0_block = -1;                  // resident in T0 (copied into a fresh block)
  std::shared_ptr<const KvBlock> pending;  // on its way to the tiers (write-back queue)
  int tier = -1;                           // index into EngineConfig::tiers
};

// Blocks a request reads from lower tiers before it can run (I/O thread).
struct LoadJob {
  std::vector<MatchedBlock> src;
  std::vector<int32_t> dst;
  std::atomic<bool> done{false};
  int64_t ok = 0;  // leading blocks that arrived intact
};

struct Request {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // the prompt, then generated tokens
  int64_t prompt_len = 0;
  GenerationParams params;
  std::function<void(const TokenEvent&)> on_event;
  Rng rng;
  int64_t reserve = 0;          // blocks it may hold at most
  std::vector<int32_t> blocks;  // block table
  int64_t computed = 0;         // tokens whose KV is in the blocks
  int64_t published = 0;        // leading blocks entered in (or found in) the prefix index
  BlockKey last_key = 0;        // chain key of block published-1
  int64_t cached_tokens = 0;
  int64_t generated = 0, emitted = 0;
  bool cancelled = false;
  std::shared_ptr<LoadJob> load;  // non-null while its prefetch runs
  std::vector<int> load_tier;     // tier credited for each loaded block (-1: T0)
  int64_t load_base = 0;          // blocks before the loaded ones
};

class EngineImpl : public Engine {
 public:
  EngineImpl(const Model* model, const EngineConfig& cfg, int64_t pool_blocks)
      : model_(*model), mcfg_(model->config()), cfg_(cfg), fp_(FingerprintModel(*model)),
        pool_(mcfg_, pool_blocks), runner_(*model, &pool_),
        cost_(pool_.block_floats() * static_cast<int64_t>(sizeof(float)), 1000.0) {
    stats_.kv_blocks_total = pool_blocks;
    for (KvTier* t : cfg_.tiers) stats_.tier_hits.emplace_back(t->name(), 0);
    if (!cfg_.tiers.empty() && cfg_.prefix_cache) {
      writeback_ = std::make_unique<Worker>(/*nice=*/10);
      pool_.set_on_evict([this](int32_t b, BlockKey key) { WriteBack(b, key); });
      for (size_t t = 0; t < cfg_.tiers.size(); ++t)
        if (cfg_.tiers[t]->CanSpill()) cfg_.tiers[t]->SetSpill([this, t](const KvBlock& blk) { PutDown(t + 1, blk); });
    }
    loader_ = std::make_unique<Worker>();
    WarmUp();
    thread_ = std::thread([this] { Loop(); });
  }

  ~EngineImpl() override { Shutdown(); }

  Result<uint64_t> Submit(std::vector<int32_t> prompt, const GenerationParams& params,
                          std::function<void(const TokenEvent&)> on_event) override {
    const int64_t n = static_cast<int64_t>(prompt.size());
    if (n == 0) return Status::Error("engine: empty prompt (hint: send at least one token)");
    for (int32_t t : prompt)
      if (t < 0 || t >= mcfg_.vocab_size)
        return Status::Error("engine: token id " + std::to_string(t) + " outside the vocabulary of " +
                             std::to_string(mcfg_.vocab_size));
    if (n >= mcfg_.max_seq_len)
      return Status::Error("engine: prompt too long: " + std::to_string(n) + " tokens, the model's context is " +
                           std::to_string(mcfg_.max_seq_len) + " (hint: at most " +
                           std::to_string(mcfg_.max_seq_len - 1) + " prompt tokens)");
    if (params.max_tokens < 1)
      return Status::Error("engine: max_tokens=" + std::to_string(params.max_tokens) + " (hint: at least 1)");
    auto r = std::make_unique<Request>();
    r->tokens = std::move(prompt);
    r->prompt_len = n;
    r->params = params;
    r->on_event = on_event ? std::move(on_event) : [](const TokenEvent&) {};
    r->rng.Seed(params.seed);
    const int64_t total = std::min<int64_t>(n + params.max_tokens, mcfg_.max_seq_len);
    r->reserve = (total + kBlockTokens - 1) / kBlockTokens;
    if (r->reserve > pool_.num_blocks())
      return Status::Error("engine: request needs " + std::to_string(r->reserve) + " KV blocks of " +
                           std::to_string(kBlockTokens) + " tokens, the pool has " +
                           std::to_string(pool_.num_blocks()) +
                           " (hint: lower max_tokens or raise kv_pool_blocks)");
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::Error("engine: shutting down");
    if (static_cast<int>(waiting_.size()) >= cfg_.max_queue) {
      ++stats_.rejected;
      return Status::Error("engine: queue full (" + std::to_string(waiting_.size()) +
                           " requests waiting, max_queue=" + std::to_string(cfg_.max_queue) +
                           ") (hint: retry later)");
    }
    r->id = next_id_++;
    const uint64_t id = r->id;
    waiting_.push_back(std::move(r));
    ++stats_.requests;
    stats_.prompt_tokens += n;
    stats_.waiting = static_cast<int>(waiting_.size());
    cv_.notify_all();
    return id;
  }

  void Cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_.insert(id);
    cv_.notify_all();
  }

  EngineStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void Shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (joined_) return;
      stopping_ = true;
      joined_ = true;
    }
    cv_.notify_all();
    thread_.join();
    loader_.reset();
    writeback_.reset();  // drains the queued write-backs into the tiers
    // Blocks still cached in the device pool go down too, so a restarted
    // server finds them on disk (and other servers in the remote tier).
    if (!cfg_.tiers.empty() && cfg_.prefix_cache) {
      int64_t n = 0;
      KvBlock blk;
      for (int32_t b = 0; b < static_cast<int32_t>(pool_.num_blocks()); ++b) {
        if (!pool_.keyed(b)) continue;
        blk.key = pool_.key(b);
        blk.data.assign(pool_.data(b), pool_.data(b) + pool_.block_floats());
        PutDown(0, blk);
        ++n;
      }
      // Then what the memory tiers hold goes on to the persistent ones.
      for (KvTier* t : cfg_.tiers) t->SpillAll();
      for (KvTier* t : cfg_.tiers) t->SetSpill(nullptr);  // the tiers may outlive this engine
      if (n > 0) LOG_INFO("engine: %lld cached KV blocks written to the lower tiers at shutdown", static_cast<long long>(n));
    }
  }

  double prefill_tokens_per_second() const { return cost_.prefill_tokens_per_second(); }

 private:
  // ---- scheduler thread ----
  void Loop();
  void Step();
  void Admit();
  bool TryAdmit(Request* r);
  bool ReadBlocks(LoadJob* job, int64_t from, int64_t to);
  bool WorthAsking(KvTier* tier, int64_t n_blocks);
  void FinishLoad(Request* r);
  void AfterForward(Request* r, const float* logits, std::vector<std::pair<Request*, TokenEvent>>* events);
  void PublishFull(Request* r);
  void Finish(Request* r, const std::string& reason, std::vector<std::pair<Request*, TokenEvent>>* events);
  void ReleaseBlocks(Request* r);
  void WarmUp();
  void WriteBack(int32_t b, BlockKey key);
  void WriteThrough(int32_t b, BlockKey key);
  void PutDown(size_t from, const KvBlock& blk);
  std::shared_ptr<const KvBlock> Pending(BlockKey key);

  const Model& model_;
  const ModelConfig mcfg_;
  const EngineConfig cfg_;
  const ModelFingerprint fp_;
  KvPool pool_;
  BatchRunner runner_;
  LoadCostModel cost_;

  std::mutex mu_;  // guards waiting_, cancel_, stopping_, stats_, next_id_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::unordered_set<uint64_t> cancel_;
  bool stopping_ = false, joined_ = false;
  uint64_t next_id_ = 1;
  EngineStats stats_;

  std::vector<std::unique_ptr<Request>> running_;  // scheduler thread only (admitted, incl. loading)
  std::vector<std::unique_ptr<Request>> finished_;  // this step's, events still to send

  std::mutex pending_mu_;
  std::unordered_map<BlockKey, std::shared_ptr<const KvBlock>> pending_;  // write-backs in flight
  int64_t dropped_writebacks_ = 0;                                          // guarded by pending_mu_
  int64_t through_inflight_ = 0;                                            // guarded by pending_mu_
  std::unique_ptr<Worker> writeback_, loader_;
  std::thread thread_;
};

void EngineImpl::WarmUp() {
  // Prefill throughput of this machine's runner, for the load-or-recompute
  // model: two forwards of a short prompt, the second one timed.
  const int64_t n = std::min<int64_t>({64, mcfg_.max_seq_len - 1, pool_.num_blocks() * kBlockTokens});
  if (n < 1) return;
  std::vector<int32_t> tokens(n), blocks;
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % mcfg_.vocab_size);
  for (int64_t i = 0; i < (n + kBlockTokens - 1) / kBlockTokens; ++i) blocks.push_back(pool_.Allocate());
  SeqChunk c{tokens.data(), n, 0, blocks.data(), static_cast<int64_t>(blocks.size())};
  double secs = 0;
  for (int rep = 0; rep < 2; ++rep) {
    auto t0 = Clock::now();
    runner_.Forward({c});
    secs = Seconds(t0, Clock::now());
  }
  for (int32_t b : blocks) pool_.Release(b);
  cost_.ObservePrefill(n, secs);
}

void EngineImpl::WriteBack(int32_t b, BlockKey key) {
  // Runs inside KvPool::Allocate: copy now (the block is about to be reused),
  // write to the tiers later. When the tiers fall behind by more than a pool's
  // worth of blocks, further evictions are dropped rather than queued (a
  // cache may lose blocks; memory must stay bounded).
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (static_cast<int64_t>(pending_.size()) >= std::max<int64_t>(64, pool_.num_blocks())) {
      if (dropped_writebacks_++ == 0) LOG_WARN("engine: KV write-back behind; dropping evicted blocks");
      return;
    }
  }
  auto blk = std::make_shared<KvBlock>();
  blk->key = key;
  blk->data.assign(pool_.data(b), pool_.data(b) + pool_.block_floats());
  std::shared_ptr<const KvBlock> c = blk;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    pending_[key] = c;
  }
  writeback_->Post([this, c] {
    PutDown(0, *c);
    std::lock_guard<std::mutex> lock(pending_mu_);
    auto it = pending_.find(c->key);
    if (it != pending_.end() && it->second == c) pending_.erase(it);
  });
}

void EngineImpl::WriteThrough(int32_t b, BlockKey key) {
  // The block stays cached here (no pending entry needed): a copy goes to
  // the tiers in the background, unless they are a pool's worth behind.
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    if (static_cast<int64_t>(pending_.size()) + through_inflight_ >= std::max<int64_t>(64, pool_.num_blocks())) return;
    ++through_inflight_;
  }
  auto blk = std::make_shared<KvBlock>();
  blk->key = key;
  blk->data.assign(pool_.data(b), pool_.data(b) + pool_.block_floats());
  writeback_->Post([this, blk] {
    for (KvTier* t : cfg_.tiers) t->Put(*blk);
    std::lock_guard<std::mutex> lock(pending_mu_);
    --through_inflight_;
  });
}

void EngineImpl::PutDown(size_t from, const KvBlock& blk) {
  // Down the hierarchy from tier `from`: into each tier that lacks the block
  // (a block loaded from the tiers and evicted again is usually still there:
  // it is not written twice), stopping after a tier that spills -- the rest
  // get the block when that tier evicts it (or at shutdown). Runs on the
  // write-back thread (and at shutdown).
  for (size_t t = from; t < cfg_.tiers.size(); ++t) {
    KvTier* tier = cfg_.tiers[t];
    if (!tier->Contains(blk.key)) tier->Put(blk);
    if (tier->CanSpill()) break;
  }
}

std::shared_ptr<const KvBlock> EngineImpl::Pending(BlockKey key) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  auto it = pending_.find(key);
  return it == pending_.end() ? nullptr : it->second;
}

void EngineImpl::Loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto loading_only = [&] {
        for (auto& r : running_)
          if (!r->load) return false;
        return true;
      };
      if (running_.empty() || loading_only()) {
        if (running_.empty() && waiting_.empty() && stopping_) break;
        // Wake on a new request, a cancel, shutdown, or (polling) a prefetch.
        cv_.wait_for(lock, std::chrono::milliseconds(running_.empty() ? 50 : 1),
                     [&] { return !waiting_.empty() || !cancel_.empty() || stopping_; });
        if (running_.empty() && waiting_.empty()) {
          if (stopping_) break;
          continue;
        }
      }
    }
    Step();
  }
}

void EngineImpl::Step() {
  std::vector<std::pair<Request*, TokenEvent>> events;
  // 1. Cancellations.
  {
    std::unordered_set<uint64_t> cancel;
    std::vector<std::unique_ptr<Request>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancel.swap(cancel_);
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if (cancel.count((*it)->id)) {
          dropped.push_back(std::move(*it));
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& r : dropped) {
      r->cancelled = true;
      Finish(r.get(), "cancelled", &events);
      finished_.push_back(std::move(r));
    }
    for (auto& r : running_)
      if (cancel.count(r->id)) r->cancelled = true;
  }
  // 2. Admission and finished prefetches.
  Admit();
  for (auto& r : running_)
    if (r->load && r->load->done.load(std::memory_order_acquire)) FinishLoad(r.get());
  for (auto& r : running_)
    if (r->cancelled && !r->load) Finish(r.get(), "cancelled", &events);

  // 3. The batch: decode tokens first, then prefill chunks, under the budget.
  std::vector<SeqChunk> chunks;
  std::vector<Request*> owners;
  int64_t budget = cfg_.step_token_budget, prefill_tokens = 0;
  auto add = [&](Request* r, int64_t n) {
    while (static_cast<int64_t>(r->blocks.size()) * kBlockTokens < r->computed + n) {
      const int32_t b = pool_.Allocate();
      CHECK_MSG(b >= 0, "KV pool exhausted despite the reservation");
      r->blocks.push_back(b);
    }
    chunks.push_back(SeqChunk{r->tokens.data() + r->computed, n, r->computed, r->blocks.data(),
                              static_cast<int64_t>(r->blocks.size())});
    owners.push_back(r);
    budget -= n;
  };
  for (auto& r : running_) {
    if (r->load || r->cancelled || r->tokens.empty()) continue;
    if (r->computed >= r->prompt_len && static_cast<int64_t>(r->tokens.size()) - r->computed == 1)
      add(r.get(), 1);
  }
  for (auto& r : running_) {
    if (budget <= 0) break;
    if (r->load || r->cancelled || r->computed >= r->prompt_len) continue;
    const int64_t n = std::min<int64_t>(r->prompt_len - r->computed, budget);
    prefill_tokens += n;
    add(r.get(), n);
  }
  // 4. Forward, sample, emit.
  if (!chunks.empty()) {
    const auto t0 = Clock::now();
    const float* logits = runner_.Forward(chunks);
    const double secs = Seconds(t0, Clock::now());
    cost_.ObserveStep(secs);
    if (prefill_tokens >= kBlockTokens)
      cost_.ObservePrefill(cfg_.step_token_budget - budget, secs);
    for (size_t i = 0; i < chunks.size(); ++i) {
      owners[i]->computed += chunks[i].n;
      AfterForward(owners[i], logits + i * runner_.vocab(), &events);
    }
  }
  // 5. Retire finished requests, then send events (outside any lock).
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->tokens.empty()) {  // Finish clears tokens to mark it
      finished_.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = static_cast<int>(running_.size());
    stats_.waiting = static_cast<int>(waiting_.size());
    stats_.kv_blocks_used = pool_.used();
  }
  for (auto& [r, ev] : events) r->on_event(ev);
  finished_.clear();
}

void EngineImpl::Admit() {
  for (;;) {
    Request* r = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty() || static_cast<int>(running_.size()) >= cfg_.max_batch) return;
      r = waiting_.front().get();
    }
    if (!TryAdmit(r)) return;  // first come, first served: wait for blocks
    std::lock_guard<std::mutex> lock(mu_);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

bool EngineImpl::TryAdmit(Request* r) {
  // Prefix match over the full blocks of the prompt, leaving at least its
  // last token to compute (its logits give the first generated token).
  const int64_t n_full = cfg_.prefix_cache ? (r->prompt_len - 1) / kBlockTokens : 0;
  auto key_of = [&](BlockKey parent, int64_t i) {
    return ChainKey(parent, r->tokens.data() + i * kBlockTokens, kBlockTokens, fp_);
  };
  // 1. The leading run resident in T0: shared as it is.
  std::vector<int32_t> t0_run;
  BlockKey t0_last = 0;
  for (int64_t i = 0; i < n_full; ++i) {
    const BlockKey key = key_of(t0_last, i);
    const int32_t b = pool_.Find(key);
    if (b < 0) break;
    t0_run.push_back(b);
    t0_last = key;
  }
  // 2. Room: the T0 run is shared; everything else this request may ever
  // hold must fit beside the other requests' outstanding reservations.
  for (int32_t b : t0_run) pool_.Ref(b);
  int64_t outstanding = 0;
  for (auto& o : running_) outstanding += o->reserve - static_cast<int64_t>(o->blocks.size());
  const int64_t need = r->reserve - static_cast<int64_t>(t0_run.size());
  const int64_t spare = pool_.available() - outstanding - need;
  if (spare < 0) {
    for (int32_t b : t0_run) pool_.Release(b);
    return false;
  }
  // 3. The match goes on block by block: in T0 again (after a gap), in the
  // write-back queue, in the first lower tier that has the key.
  // A tier is asked once, for all the remaining keys (one round trip to a
  // remote store), when the walk first reaches it.
  const int64_t first = static_cast<int64_t>(t0_run.size());
  std::vector<BlockKey> keys;
  for (int64_t i = first; i < n_full; ++i) keys.push_back(key_of(keys.empty() ? t0_last : keys.back(), i));
  std::vector<std::vector<bool>> in_tier(cfg_.tiers.size());
  std::vector<MatchedBlock> more;
  int64_t t0_copies = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(keys.size()); ++j) {
    MatchedBlock m;
    m.key = keys[j];
    if ((m.t0_block = pool_.Find(m.key)) >= 0) {
      // Copied into a fresh block, its source referenced meanwhile: that
      // takes one spare block each for a moment.
      if (t0_copies == spare) break;
      ++t0_copies;
    } else if (!(m.pending = Pending(m.key))) {
      for (size_t t = 0; t < cfg_.tiers.size() && m.tier < 0; ++t) {
        if (in_tier[t].empty()) {
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
    more.push_back(std::move(m));
  }
  // 4. Load or recompute the blocks beyond the T0 run. The leading blocks
  // already in memory (T0 copies, write-back queue, a tier whose measured
  // read is a memory copy) are read here at once; a read from a slower tier
  // goes to the I/O thread, and the request waits at least a step for it.
  std::vector<double> secs;
  int64_t inline_n = 0;
  double inline_secs = 0;
  bool inline_run = true;
  for (const auto& m : more) {
    double s = 0.0;  // in memory already
    if (m.tier >= 0) {
      KvTier* t = cfg_.tiers[m.tier];
      s = cost_.TierSecondsPerBlock(t->name(), t->stats());
    }
    secs.push_back(s);
    inline_run = inline_run && s <= kInlineBlockSeconds && inline_secs + s <= kInlineBudgetSeconds;
    if (inline_run) {
      ++inline_n;
      inline_secs += s;
    }
  }
  LoadPlan plan;
  plan.load_blocks = static_cast<int64_t>(more.size());
  plan.async = plan.load_blocks > inline_n;
  if (cfg_.load_or_recompute && !more.empty())
    plan = ChooseLoadPlan(secs, cost_.RecomputeSecondsPerBlock(), inline_n, cost_.step_seconds());
  more.resize(plan.load_blocks);
  r->blocks = t0_run;
  r->computed = static_cast<int64_t>(t0_run.size()) * kBlockTokens;
  r->published = static_cast<int64_t>(t0_run.size());
  r->last_key = t0_last;
  r->cached_tokens = r->computed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.t0_hits += r->computed;
    stats_.recomputed_hit_tokens += plan.recompute_blocks * kBlockTokens;
  }
  if (more.empty()) return true;
  // Fresh blocks for the loaded ones; T0-resident sources are referenced
  // while the allocations run so that they cannot be evicted meanwhile.
  auto job = std::make_shared<LoadJob>();
  for (auto& m : more)
    if (m.t0_block >= 0) pool_.Ref(m.t0_block);
  for (auto& m : more) {
    const int32_t b = pool_.Allocate();
    CHECK(b >= 0);
    job->dst.push_back(b);
    r->blocks.push_back(b);
    r->load_tier.push_back(m.pending ? 0 : m.tier);  // write-back queue: credited to the first tier
  }
  r->load_base = static_cast<int64_t>(t0_run.size());
  job->src = std::move(more);
  r->load = job;
  const int64_t n_load = static_cast<int64_t>(job->src.size());
  const int64_t n_inline = std::min(inline_n, n_load);
  if (!ReadBlocks(job.get(), 0, n_inline) || n_inline == n_load) {
    // Everything arrived (or a block failed and the rest is recomputed): the
    // request computes its tail in this very step.
    for (auto& m : job->src)
      if (m.t0_block >= 0) {
        pool_.Release(m.t0_block);
        m.t0_block = -1;
      }
    job->done.store(true, std::memory_order_release);
    FinishLoad(r);
    return true;
  }
  // The pool belongs to this thread: T0 sources after the inline run are
  // copied now, the I/O thread reads only the tiers.
  for (int64_t i = n_inline; i < n_load; ++i) {
    MatchedBlock& m = job->src[i];
    if (m.t0_block < 0) continue;
    std::memcpy(pool_.data(job->dst[i]), pool_.data(m.t0_block), pool_.block_floats() * sizeof(float));
    pool_.Release(m.t0_block);
    m.t0_block = kCopiedFromT0;
  }
  loader_->Post([this, job, n_inline, n_load] {
    ReadBlocks(job.get(), n_inline, n_load);
    job->done.store(true, std::memory_order_release);
    cv_.notify_all();
  });
  return true;
}

bool EngineImpl::WorthAsking(KvTier* tier, int64_t n_blocks) {
  // A tier too slow to read at admission is not even asked (a round trip
  // to a remote store) when loading all n blocks from it, plus the step the
  // request would wait for the I/O thread, could not beat recomputing them.
  if (!cfg_.load_or_recompute) return true;
  const double read = cost_.TierSecondsPerBlock(tier->name(), tier->stats());
  if (read <= kInlineBlockSeconds) return true;
  const double saved = n_blocks * (cost_.RecomputeSecondsPerBlock() - read) - cost_.step_seconds();
  if (saved > 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.skipped_lookups;
  return false;
}

bool EngineImpl::ReadBlocks(LoadJob* job, int64_t from, int64_t to) {
  // Stops at the first block that is missing or damaged (job->ok counts the
  // intact leading ones); T0 sources are released as they are copied.
  const int64_t floats = pool_.block_floats();
  KvBlock blk;
  bool ok = true;
  for (int64_t i = from; i < to; ++i) {
    MatchedBlock& m = job->src[i];
    float* dst = pool_.data(job->dst[i]);
    if (m.t0_block >= 0) {
      std::memcpy(dst, pool_.data(m.t0_block), floats * sizeof(float));
      pool_.Release(m.t0_block);
      m.t0_block = kCopiedFromT0;
    } else if (m.pending) {
      std::memcpy(dst, m.pending->data.data(), floats * sizeof(float));
    } else if (ok && m.tier >= 0) {
      ok = cfg_.tiers[m.tier]->Get(m.key, &blk) && blk.key == m.key && static_cast<int64_t>(blk.data.size()) == floats;
      if (ok) std::memcpy(dst, blk.data.data(), floats * sizeof(float));
    }
    if (!ok) return false;
    ++job->ok;
  }
  return true;
}

void EngineImpl::FinishLoad(Request* r) {
  LoadJob& job = *r->load;
  // Blocks after the first failed read are recomputed (they stay in the
  // table as this request's own blocks).
  int64_t t0_copied = 0;
  for (int64_t i = 0; i < job.ok; ++i) {
    const int32_t b = job.dst[i];
    const BlockKey key = job.src[i].key;
    if (cfg_.prefix_cache) pool_.Publish(b, key);
    r->last_key = key;
    if (job.src[i].t0_block == kCopiedFromT0) ++t0_copied;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.t0_hits += t0_copied * kBlockTokens;
    for (int64_t i = 0; i < job.ok; ++i)
      if (job.src[i].t0_block != kCopiedFromT0 && r->load_tier[i] >= 0)
        stats_.tier_hits[r->load_tier[i]].second += kBlockTokens;
  }
  r->published = r->load_base + job.ok;
  r->computed = r->published * kBlockTokens;
  r->cached_tokens = r->computed;
  r->load.reset();
  r->load_tier.clear();
}

void EngineImpl::AfterForward(Request* r, const float* logits, std::vector<std::pair<Request*, TokenEvent>>* events) {
  PublishFull(r);
  if (r->computed < static_cast<int64_t>(r->tokens.size())) return;  // a prefill chunk short of the end
  const int32_t tok = SampleToken(logits, runner_.vocab(), r->params.sampling, &r->rng);
  r->tokens.push_back(tok);
  ++r->generated;
  // Stop sequences: finish without emitting the stop tokens; hold back a
  // tail that could still become one.
  const int64_t out0 = r->prompt_len;
  const int64_t out_len = static_cast<int64_t>(r->tokens.size()) - out0;
  int64_t hold = 0;
  for (const auto& s : r->params.stop_token_seqs) {
    const int64_t m = static_cast<int64_t>(s.size());
    if (m == 0) continue;
    if (m <= out_len && std::equal(s.begin(), s.end(), r->tokens.end() - m)) {
      const int64_t keep = out_len - m;  // tokens before the stop sequence
      for (int64_t i = r->emitted; i < keep; ++i) {
        TokenEvent ev;
        ev.token = r->tokens[out0 + i];
        events->emplace_back(r, ev);
      }
      r->emitted = std::max(r->emitted, keep);
      Finish(r, "stop", events);
      return;
    }
    // Longest proper prefix of s that ends the output.
    for (int64_t k = std::min(m - 1, out_len); k > hold; --k)
      if (std::equal(s.begin(), s.begin() + k, r->tokens.end() - k)) {
        hold = k;
        break;
      }
  }
  const bool at_limit = r->generated >= r->params.max_tokens ||
                        static_cast<int64_t>(r->tokens.size()) >= mcfg_.max_seq_len;
  if (at_limit) hold = 0;
  for (int64_t i = r->emitted; i < out_len - hold; ++i) {
    TokenEvent ev;
    ev.token = r->tokens[out0 + i];
    events->emplace_back(r, ev);
  }
  r->emitted = std::max(r->emitted, out_len - hold);
  if (at_limit) Finish(r, "length", events);
}

void EngineImpl::PublishFull(Request* r) {
  if (!cfg_.prefix_cache) return;
  while ((r->published + 1) * kBlockTokens <= r->computed) {
    const BlockKey key = ChainKey(r->last_key, r->tokens.data() + r->published * kBlockTokens, kBlockTokens, fp_);
    const int32_t b = r->blocks[r->published];
    if (!pool_.keyed(b) && pool_.Publish(b, key) && cfg_.write_through && writeback_) WriteThrough(b, key);
    r->last_key = key;
    ++r->published;
  }
}

void EngineImpl::Finish(Request* r, const std::string& reason, std::vector<std::pair<Request*, TokenEvent>>* events) {
  TokenEvent ev;
  ev.done = true;
  ev.finish_reason = reason;
  ev.prompt_tokens = r->prompt_len;
  ev.cached_tokens = r->cached_tokens;
  ev.completion_tokens = r->generated;
  events->emplace_back(r, ev);
  ReleaseBlocks(r);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.cached_tokens += r->cached_tokens;
  stats_.completion_tokens += r->generated;
  if (reason == "cancelled") ++stats_.cancelled;
  r->tokens.clear();  // marks it finished for the retire pass
}

void EngineImpl::ReleaseBlocks(Request* r) {
  // Last block first: the tail of a prefix goes stale before its head, so
  // eviction keeps the shared beginnings longest.
  for (auto it = r->blocks.rbegin(); it != r->blocks.rend(); ++it) pool_.Release(*it);
  r->blocks.clear();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(const Model* model, const EngineConfig& cfg) {
  if (model == nullptr) return Status::Error("engine: no model");
  const ModelConfig& m = model->config();
  if (cfg.max_batch < 1) return Status::Error("engine: max_batch=" + std::to_string(cfg.max_batch) + " (hint: at least 1)");
  if (cfg.step_token_budget < cfg.max_batch)
    return Status::Error("engine: step_token_budget=" + std::to_string(cfg.step_token_budget) +
                         " is below max_batch=" + std::to_string(cfg.max_batch) +
                         " (hint: every running request decodes one token per step)");
  if (cfg.max_queue < 0) return Status::Error("engine: max_queue must be >= 0");
  for (KvTier* t : cfg.tiers)
    if (t == nullptr) return Status::Error("engine: null KV tier");
  const int64_t per_seq = (m.max_seq_len + kBlockTokens - 1) / kBlockTokens;
  const int64_t blocks = cfg.kv_pool_blocks > 0 ? cfg.kv_pool_blocks : cfg.max_batch * per_seq;
  return std::unique_ptr<Engine>(new EngineImpl(model, cfg, blocks));
}

}  // namespace myriad::serve
