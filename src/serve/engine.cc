// The engine: a scheduler thread that, each step, admits waiting requests,
// builds one batch (decode tokens first, then prefill chunks, under
// step_token_budget), runs the batched runner, samples, emits and frees
// finished requests' blocks. Everything about KV blocks across requests --
// the prefix index, the lookups through the lower tiers, the
// load-or-recompute plan, prefetch and write-back -- is the PrefixCache's
// (prefix_cache.h); the engine decides only who runs and whether a request's
// blocks fit. docs/serving.md describes the policy.

#include "serve/engine.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_set>

#include "core/check.h"
#include "core/rng.h"
#include "serve/draft_cost.h"
#include "serve/kv_pool.h"
#include "serve/prefix_cache.h"
#include "serve/runner.h"

namespace myriad::serve {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

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
  ChainCursor chain;            // leading blocks entered in (or found in) the prefix index
  int64_t cached_tokens = 0;
  int64_t generated = 0, emitted = 0;
  bool cancelled = false;
  std::shared_ptr<PrefixLoad> load;  // non-null while its prefix hit is being read
  bool remote_asked = false;                  // StartRemoteLookup was called (waiting)
  std::shared_ptr<RemoteLookup> remote;       // its answer, until admission
  std::vector<TokenLogprobs> logprobs;        // per generated token, when params.logprobs >= 0
  std::vector<TokenLogprobs> prompt_lp;       // per prompt token from the second, when params.prompt_logprobs >= 0
  bool scores_prompt() const { return params.prompt_logprobs >= 0; }
  // Speculative decoding: this step's feed [pending, draft...] when it
  // verifies a draft, the draft's distributions (MTP) and its counters.
  std::vector<int32_t> feed, draft;
  std::vector<TokenDistribution> q;
  bool draft_mtp = false;
  std::unique_ptr<MtpDrafter> mtp;  // with MTP (or auto) drafts on a model that has the modules
  int64_t draft_steps = 0, draft_proposed = 0, draft_accepted = 0;
};

using Events = std::vector<std::pair<Request*, TokenEvent>>;

// One step's batch: a chunk of new tokens per request.
struct Batch {
  std::vector<SeqChunk> chunks;
  std::vector<Request*> owners;
  int64_t tokens = 0, prefill_tokens = 0;
  bool hidden = false;                 // some owner drafts with MTP: the forward keeps hidden rows
};

PrefixCacheConfig CacheConfig(const EngineConfig& cfg) {
  PrefixCacheConfig c;
  c.enabled = cfg.prefix_cache;
  c.tiers = cfg.tiers;
  c.load_or_recompute = cfg.load_or_recompute;
  c.write_through = cfg.write_through;
  c.remote_lookup_timeout_s = cfg.remote_lookup_timeout_s;
  return c;
}

class EngineImpl : public Engine {
 public:
  EngineImpl(const Model* model, const EngineConfig& cfg, int64_t pool_blocks)
      : model_(model), mcfg_(model->config()), cfg_(cfg), pool_(mcfg_, pool_blocks), runner_(*model, &pool_, cfg.weights),
        cache_(&pool_, FingerprintModel(*model, cfg.weights), CacheConfig(cfg), [this] { cv_.notify_all(); }) {
    stats_.kv_blocks_total = pool_blocks;
    mtp_ = (cfg.speculative == DraftMode::kMtp || cfg.speculative == DraftMode::kAuto) &&
           SpeculativeDecoder::HasMtp(mcfg_);
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
    // Room for one generated token, unless the prompt is only scored.
    const bool score_only = params.prompt_logprobs >= 0 && params.max_tokens == 0;
    if (n > mcfg_.max_seq_len || (n == mcfg_.max_seq_len && !score_only))
      return Status::Error("engine: prompt too long: " + std::to_string(n) + " tokens, the model's context is " +
                           std::to_string(mcfg_.max_seq_len) + " (hint: at most " +
                           std::to_string(mcfg_.max_seq_len - 1) + " prompt tokens)");
    if (params.max_tokens < (params.prompt_logprobs >= 0 ? 0 : 1))
      return Status::Error("engine: max_tokens=" + std::to_string(params.max_tokens) +
                           " (hint: at least 1, or 0 when scoring the prompt with prompt_logprobs)");
    if (params.prompt_logprobs >= 0 && n < 2)
      return Status::Error("engine: prompt_logprobs needs a prompt of at least 2 tokens (the first has no "
                           "log-probability)");
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
                           " (hint: lower max_tokens, or raise the pool: myriad serve --kv-blocks)");
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::Error("engine: shutting down");
    if (weights_pending_)
      return Status::Error("engine: refusing a request while WeightsChanged runs (hint: submit after it returns)");
    if (static_cast<int>(waiting_.size()) >= cfg_.max_queue) {
      ++stats_.rejected;
      return Status::Error("engine: queue full (" + std::to_string(waiting_.size()) +
                           " requests waiting, max_queue=" + std::to_string(cfg_.max_queue) +
                           ") (hint: retry later)");
    }
    r->id = next_id_++;
    const uint64_t id = r->id;
    waiting_.push_back(std::move(r));
    ++in_flight_;
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
    // The cache's counters are its own (taken first: never under mu_).
    const PrefixCacheStats c = cache_.stats();
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = stats_;
    s.t0_hits = c.t0_hits;
    s.tier_hits = c.tier_hits;
    s.recomputed_hit_tokens = c.recomputed_hit_tokens;
    s.skipped_lookups = c.skipped_lookups;
    s.late_lookups = c.late_lookups;
    return s;
  }

  Status WeightsChanged() override {
    if (cfg_.weights != WeightFormat::kF32)
      return Status::Error(std::string("engine: WeightsChanged with --weights ") + WeightFormatName(cfg_.weights) +
                           ": the engine computes with copies converted at start, which do not follow the model "
                           "(hint: fp32 weights for an engine whose model changes, or build a new engine)");
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return Status::Error("engine: WeightsChanged after Shutdown");
    if (in_flight_ > 0 || weights_pending_)
      return Status::Error("engine: WeightsChanged with " + std::to_string(in_flight_) +
                           " requests in flight (hint: wait for every request's final event first)");
    weights_pending_ = true;
    cv_.notify_all();
    weights_cv_.wait(lock, [&] { return !weights_pending_; });
    return Status::Ok();
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
    cache_.Close();  // queued write-backs, then T0's cached blocks, go down to the tiers
  }

 private:
  // ---- scheduler thread ----
  void Loop();
  void Step();
  void ApplyCancellations(Events* events);
  void Admit();
  void StartRemoteLookups();
  bool TryAdmit(Request* r);
  int64_t SpareBlocks(const Request& r, int64_t shared_blocks) const;
  void StartAt(Request* r, const ChainCursor& chain);
  void FinishLoad(Request* r);
  Batch BuildBatch();
  void AddChunk(Request* r, int64_t n, Batch* batch, const int32_t* tokens = nullptr);
  int StepDraftTokens(int decoding);
  bool MakeDraft(Request* r, int k);
  void RunBatch(const Batch& batch, Events* events);
  void AfterForward(Request* r, const float* logits, Events* events);
  void AfterVerify(Request* r, const float* rows, Events* events);
  bool AcceptToken(Request* r, int32_t tok, const float* logits, Events* events);
  void Retire();
  void Emit(Request* r, int64_t i, Events* events);
  void Finish(Request* r, const std::string& reason, Events* events);
  void ReleaseBlocks(Request* r);
  void WarmUp();
  void RefreshWeights();

  const Model* model_;
  const ModelConfig mcfg_;
  const EngineConfig cfg_;
  KvPool pool_;
  BatchRunner runner_;
  PrefixCache cache_;  // after pool_: closed and destroyed before it
  DraftCostModel draft_cost_;
  NgramDrafter ngram_;
  bool mtp_ = false;   // speculative mtp/auto with a model that has MTP modules

  std::mutex mu_;  // guards waiting_, cancel_, stopping_, stats_, next_id_, in_flight_, weights_pending_
  std::condition_variable cv_;
  std::condition_variable weights_cv_;  // WeightsChanged waits on it
  int64_t in_flight_ = 0;               // submitted, final event not yet made
  bool weights_pending_ = false;        // WeightsChanged waits for the scheduler to refresh
  std::deque<std::unique_ptr<Request>> waiting_;
  std::unordered_set<uint64_t> cancel_;
  bool stopping_ = false, joined_ = false;
  uint64_t next_id_ = 1;
  EngineStats stats_;

  std::vector<std::unique_ptr<Request>> running_;  // scheduler thread only (admitted, incl. loading)
  std::vector<std::unique_ptr<Request>> finished_;  // this step's, events still to send
  std::vector<float> tempered_;      // AcceptToken's logits / temperature
  bool head_awaits_lookup_ = false;  // the first waiting request waits for its remote lookup
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
  cache_.cost().ObservePrefill(n, secs);
  if (cfg_.speculative != DraftMode::kOff) {
    // The draft cost model's start: forwards of one token and of a full
    // draft's feed, after 32 positions of context (like decode steps).
    const int64_t ctx = std::min<int64_t>(32, n - 1), feed = std::min<int64_t>(cfg_.draft_tokens + 1, n - ctx);
    for (int rep = 0; rep < 2 && ctx >= 0; ++rep)
      for (int64_t m : {int64_t{1}, feed}) {
        if (m < 1) continue;
        SeqChunk d{tokens.data() + ctx, m, ctx, blocks.data(), static_cast<int64_t>(blocks.size())};
        auto t0 = Clock::now();
        runner_.Forward({d});
        draft_cost_.ObserveForward(m, Seconds(t0, Clock::now()));
      }
  }
  for (int32_t b : blocks) pool_.Release(b);
}

void EngineImpl::RefreshWeights() {
  // Scheduler thread, nothing running or waiting: nobody reads the weights.
  runner_.RefreshBiases();
  cache_.Reset(FingerprintModel(*model_, cfg_.weights));
}

void EngineImpl::Loop() {
  for (;;) {
    bool refresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      refresh = weights_pending_ && running_.empty();
    }
    if (refresh) {
      RefreshWeights();
      std::lock_guard<std::mutex> lock(mu_);
      weights_pending_ = false;
      ++stats_.weight_version;
      weights_cv_.notify_all();
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto loading_only = [&] {
        for (auto& r : running_)
          if (!r->load) return false;
        return true;
      };
      if (running_.empty() || loading_only()) {
        if (running_.empty() && waiting_.empty() && stopping_ && !weights_pending_) break;
        // Wake on a new request, a cancel, shutdown, or (polling) a prefetch
        // or a remote lookup (the head of the queue waits for it: polled).
        if (head_awaits_lookup_)
          cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return !cancel_.empty() || stopping_; });
        else
          cv_.wait_for(lock, std::chrono::milliseconds(running_.empty() ? 50 : 1),
                       [&] { return !waiting_.empty() || !cancel_.empty() || stopping_ || weights_pending_; });
        if (running_.empty() && waiting_.empty()) {
          if (stopping_ && !weights_pending_) break;
          continue;
        }
      }
    }
    Step();
  }
}

void EngineImpl::Step() {
  Events events;
  ApplyCancellations(&events);
  Admit();
  for (auto& r : running_)
    if (r->load && r->load->ready()) FinishLoad(r.get());
  for (auto& r : running_)
    if (r->cancelled && !r->load) Finish(r.get(), "cancelled", &events);
  const Batch batch = BuildBatch();
  RunBatch(batch, &events);
  Retire();
  // Events go out last, outside any lock.
  for (auto& [r, ev] : events) r->on_event(ev);
  finished_.clear();
}

void EngineImpl::ApplyCancellations(Events* events) {
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
    Finish(r.get(), "cancelled", events);
    finished_.push_back(std::move(r));
  }
  for (auto& r : running_)
    if (cancel.count(r->id)) r->cancelled = true;
}

Batch EngineImpl::BuildBatch() {
  // Decode tokens first (with their drafts), then prefill chunks in
  // admission order, under the budget.
  Batch batch;
  std::vector<Request*> decoding;
  for (auto& r : running_) {
    if (r->load || r->cancelled || r->tokens.empty()) continue;
    if (r->computed >= r->prompt_len && static_cast<int64_t>(r->tokens.size()) - r->computed == 1)
      decoding.push_back(r.get());
  }
  const int k = StepDraftTokens(static_cast<int>(decoding.size()));
  for (Request* r : decoding) {
    r->feed.clear();
    if (k > 0 && MakeDraft(r, k)) {
      r->feed.push_back(r->tokens.back());
      r->feed.insert(r->feed.end(), r->draft.begin(), r->draft.end());
      AddChunk(r, static_cast<int64_t>(r->feed.size()), &batch, r->feed.data());
      batch.chunks.back().all_logits = true;
    } else {
      AddChunk(r, 1, &batch);
    }
  }
  for (auto& r : running_) {
    const int64_t budget = cfg_.step_token_budget - batch.tokens;
    if (budget <= 0) break;
    if (r->load || r->cancelled || r->computed >= r->prompt_len) continue;
    const int64_t n = std::min<int64_t>(r->prompt_len - r->computed, budget);
    batch.prefill_tokens += n;
    AddChunk(r.get(), n, &batch);
    batch.chunks.back().all_logits = r->scores_prompt();  // every row's logits score the next prompt token
  }
  for (Request* r : batch.owners) batch.hidden |= r->mtp != nullptr;
  return batch;
}

int EngineImpl::StepDraftTokens(int decoding) {
  if (cfg_.speculative == DraftMode::kOff || decoding == 0) return 0;
  // Every decoding request's feed fits the step's token budget.
  const int cap = static_cast<int>(std::min<int64_t>(cfg_.draft_tokens, cfg_.step_token_budget / decoding - 1));
  const int k = cfg_.adaptive_draft ? draft_cost_.Choose(decoding, cap) : std::max(0, cap);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.spec_draft_tokens = k;
  if (k == 0) ++stats_.spec_off_steps;
  return k;
}

bool EngineImpl::MakeDraft(Request* r, int k) {
  // Room: the draft's positions and the tokens it could emit stay within
  // max_tokens, the context and so the request's block reservation.
  const int64_t len = r->computed;  // positions fed; tokens.back() is pending
  k = static_cast<int>(std::min<int64_t>({k, r->params.max_tokens - r->generated - 1, mcfg_.max_seq_len - len - 1}));
  r->draft.clear();
  r->q.clear();
  r->draft_mtp = false;
  if (k <= 0) return false;
  const DraftMode mode = cfg_.speculative;
  if (mode != DraftMode::kMtp) r->draft = ngram_.Draft(r->tokens, k);
  if (r->mtp && r->mtp->Ready(len) &&
      (mode == DraftMode::kMtp || (mode == DraftMode::kAuto && !AutoPrefersNgram(ngram_, r->tokens, r->draft, k)))) {
    const auto t0 = Clock::now();
    r->draft = r->mtp->Draft(r->tokens, k, r->params.sampling, &r->rng, &r->q);
    draft_cost_.ObserveDraftSeconds(static_cast<int64_t>(r->draft.size()), Seconds(t0, Clock::now()));
    r->draft_mtp = true;
  } else if (mode == DraftMode::kMtp) {
    r->draft.clear();
  }
  return !r->draft.empty();
}

void EngineImpl::AddChunk(Request* r, int64_t n, Batch* batch, const int32_t* tokens) {
  // Blocks are taken as tokens arrive; the admission's reservation
  // guarantees they are there.
  while (static_cast<int64_t>(r->blocks.size()) * kBlockTokens < r->computed + n) {
    const int32_t b = pool_.Allocate();
    CHECK_MSG(b >= 0, "KV pool exhausted despite the reservation");
    r->blocks.push_back(b);
  }
  batch->chunks.push_back(SeqChunk{tokens ? tokens : r->tokens.data() + r->computed, n, r->computed,
                                   r->blocks.data(), static_cast<int64_t>(r->blocks.size())});
  batch->owners.push_back(r);
  batch->tokens += n;
}

void EngineImpl::RunBatch(const Batch& batch, Events* events) {
  if (batch.chunks.empty()) return;
  const auto t0 = Clock::now();
  const float* logits = runner_.Forward(batch.chunks, batch.hidden);
  const double secs = Seconds(t0, Clock::now());
  cache_.cost().ObserveStep(secs);
  if (batch.prefill_tokens >= kBlockTokens) cache_.cost().ObservePrefill(batch.tokens, secs);
  if (batch.prefill_tokens == 0) draft_cost_.ObserveForward(batch.tokens, secs);
  const int64_t V = runner_.vocab();
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    Request* r = batch.owners[i];
    const SeqChunk& c = batch.chunks[i];
    if (r->mtp) r->mtp->Observe(c.start, c.n, runner_.hidden_row(i));
    if (c.all_logits && r->computed < r->prompt_len) {  // a prefill chunk of a prompt being scored
      const float* rows = logits + runner_.logits_row(i) * V;
      for (int64_t j = 0; j < c.n; ++j)
        if (c.start + j + 1 < r->prompt_len)
          r->prompt_lp.push_back(LogprobsOf(rows + j * V, V, r->tokens[c.start + j + 1], r->params.prompt_logprobs));
      r->computed += c.n;
      AfterForward(r, rows + (c.n - 1) * V, events);
    } else if (c.all_logits) {
      AfterVerify(r, logits + runner_.logits_row(i) * V, events);
    } else {
      r->computed += c.n;
      AfterForward(r, logits + runner_.logits_row(i) * V, events);
    }
  }
}

void EngineImpl::Retire() {
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->tokens.empty()) {  // Finish clears tokens to mark it
      finished_.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = static_cast<int>(running_.size());
  stats_.waiting = static_cast<int>(waiting_.size());
  stats_.kv_blocks_used = pool_.used();
}

void EngineImpl::StartRemoteLookups() {
  // Every waiting request's remote-tier lookup starts as soon as it is seen
  // (on the lookup thread), so its answer is there by the time it is first
  // in line. Requests leave waiting_ only on this thread: the pointers hold.
  std::vector<Request*> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : waiting_)
      if (!r->remote_asked && !r->scores_prompt()) fresh.push_back(r.get());  // a scored prompt matches no hit
  }
  for (Request* r : fresh) {
    r->remote_asked = true;
    r->remote = cache_.StartRemoteLookup(r->tokens.data(), cache_.MatchableBlocks(r->prompt_len));
  }
}

void EngineImpl::Admit() {
  StartRemoteLookups();
  head_awaits_lookup_ = false;
  for (;;) {
    Request* r = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty() || static_cast<int>(running_.size()) >= cfg_.max_batch) return;
      r = waiting_.front().get();
    }
    // Its remote answer is on its way: it waits in line (the running
    // requests keep decoding) until the answer or the deadline comes.
    if (r->remote && !r->remote->settled()) {
      head_awaits_lookup_ = true;
      return;
    }
    if (!TryAdmit(r)) return;  // first come, first served: wait for blocks
    std::lock_guard<std::mutex> lock(mu_);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

bool EngineImpl::TryAdmit(Request* r) {
  // 1. The leading run of the prompt's blocks resident in T0, shared as it is.
  // A prompt being scored computes every position: no hit is matched.
  const int64_t n_full = r->scores_prompt() ? 0 : cache_.MatchableBlocks(r->prompt_len);
  ChainCursor after_run;
  std::vector<int32_t> run = cache_.AcquireResidentRun(r->tokens.data(), n_full, &after_run);
  // 2. Room, or the request waits.
  const int64_t spare = SpareBlocks(*r, static_cast<int64_t>(run.size()));
  if (spare < 0) {
    cache_.ReleaseRun(run);
    return false;
  }
  // 3. Admitted: the rest of the match is loaded (or recomputed) by the cache.
  r->blocks = std::move(run);
  StartAt(r, after_run);
  r->load = cache_.Extend(r->tokens.data(), n_full, after_run, spare, &r->blocks, r->remote.get());
  r->remote.reset();
  if (r->load && r->load->ready()) FinishLoad(r);  // read at once: computes its tail in this step
  if (mtp_) r->mtp = std::make_unique<MtpDrafter>(runner_.weights(), mcfg_.max_seq_len);
  return true;
}

int64_t EngineImpl::SpareBlocks(const Request& r, int64_t shared_blocks) const {
  // The shared run is held already; everything else this request may ever
  // hold must fit beside the other requests' outstanding reservations.
  int64_t outstanding = 0;
  for (auto& o : running_) outstanding += o->reserve - static_cast<int64_t>(o->blocks.size());
  return pool_.available() - outstanding - (r.reserve - shared_blocks);
}

void EngineImpl::StartAt(Request* r, const ChainCursor& chain) {
  // Its first chain.blocks blocks hold cached KV: it computes from there.
  r->chain = chain;
  r->computed = chain.blocks * kBlockTokens;
  r->cached_tokens = r->computed;
}

void EngineImpl::FinishLoad(Request* r) {
  StartAt(r, cache_.CompleteLoad(*r->load));
  r->load.reset();
}

void EngineImpl::AfterForward(Request* r, const float* logits, Events* events) {
  cache_.PublishFull(r->tokens.data(), r->computed, r->blocks, &r->chain);
  if (r->computed < static_cast<int64_t>(r->tokens.size())) return;  // a prefill chunk short of the end
  if (r->params.max_tokens == 0) return Finish(r, "length", events);  // scored the prompt only
  AcceptToken(r, SampleToken(logits, runner_.vocab(), r->params.sampling, &r->rng), logits, events);
}

void EngineImpl::AfterVerify(Request* r, const float* rows, Events* events) {
  // rows: the logits after the pending token and after each draft token.
  SpeculativeStats st;
  const std::vector<int32_t> out = AcceptDraft(rows, r->draft, r->draft_mtp ? &r->q : nullptr, runner_.vocab(),
                                               r->params.sampling, &r->rng, &st);
  const int accepted = static_cast<int>(out.size()) - 1;
  if (r->draft_mtp) r->mtp->Verified(accepted);
  const int proposed = static_cast<int>(st.proposed.empty() ? 0 : st.proposed.size());
  draft_cost_.ObserveVerification(proposed, accepted);
  r->draft_steps++;
  r->draft_proposed += static_cast<int64_t>(r->draft.size());
  r->draft_accepted += accepted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.spec_steps++;
    stats_.spec_emitted += static_cast<int64_t>(out.size());
    if (stats_.spec_proposed.size() < st.proposed.size())
      stats_.spec_proposed.resize(st.proposed.size()), stats_.spec_accepted.resize(st.proposed.size());
    for (size_t i = 0; i < st.proposed.size(); ++i)
      stats_.spec_proposed[i] += st.proposed[i], stats_.spec_accepted[i] += st.accepted[i];
  }
  // The pending token and the accepted drafts now hold KV; the rejected
  // drafts' rows past `computed` are written over later and, never being
  // inside a full computed block, never published.
  r->computed += 1 + accepted;
  cache_.PublishFull(r->tokens.data(), r->computed, r->blocks, &r->chain);
  for (size_t i = 0; i < out.size(); ++i)
    if (!AcceptToken(r, out[i], rows + static_cast<int64_t>(i) * runner_.vocab(), events)) break;
}

bool EngineImpl::AcceptToken(Request* r, int32_t tok, const float* logits, Events* events) {
  // A generated token (sampled from `logits`): stop sequences, limits, events.
  // Returns false once the request has finished.
  if (r->params.logprobs >= 0) {
    const float temp = r->params.sampling.temperature;
    if (r->params.logprobs_at_temperature && temp > 0.f && temp != 1.f) {
      const int64_t V = runner_.vocab();
      tempered_.resize(V);
      for (int64_t i = 0; i < V; ++i) tempered_[i] = logits[i] / temp;
      logits = tempered_.data();
    }
    r->logprobs.push_back(LogprobsOf(logits, runner_.vocab(), tok, r->params.logprobs));
  }
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
      for (int64_t i = r->emitted; i < keep; ++i) Emit(r, i, events);
      r->emitted = std::max(r->emitted, keep);
      Finish(r, "stop", events);
      return false;
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
  for (int64_t i = r->emitted; i < out_len - hold; ++i) Emit(r, i, events);
  r->emitted = std::max(r->emitted, out_len - hold);
  if (at_limit) {
    Finish(r, "length", events);
    return false;
  }
  return true;
}

void EngineImpl::Emit(Request* r, int64_t i, Events* events) {
  // Generated token i (0-based in the output).
  TokenEvent ev;
  ev.token = r->tokens[r->prompt_len + i];
  if (i < static_cast<int64_t>(r->logprobs.size())) ev.logprobs = r->logprobs[i];
  events->emplace_back(r, std::move(ev));
}

void EngineImpl::Finish(Request* r, const std::string& reason, Events* events) {
  TokenEvent ev;
  ev.done = true;
  ev.finish_reason = reason;
  ev.prompt_tokens = r->prompt_len;
  ev.cached_tokens = r->cached_tokens;
  ev.completion_tokens = r->generated;
  ev.draft_steps = r->draft_steps;
  ev.draft_proposed = r->draft_proposed;
  ev.draft_accepted = r->draft_accepted;
  ev.prompt_logprobs = std::move(r->prompt_lp);
  events->emplace_back(r, std::move(ev));
  ReleaseBlocks(r);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.cached_tokens += r->cached_tokens;
  stats_.completion_tokens += r->generated;
  --in_flight_;
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
  if (cfg.speculative != DraftMode::kOff && cfg.draft_tokens < 1)
    return Status::Error("engine: draft_tokens=" + std::to_string(cfg.draft_tokens) + " (hint: at least 1)");
  if (cfg.speculative == DraftMode::kMtp && !SpeculativeDecoder::HasMtp(m))
    return Status::Error(std::string("engine: --speculative mtp needs a model with MTP modules; this one has ") +
                         (m.dsa() ? "DSA attention, which MTP drafts do not support" : "model.mtp_depth = 0") +
                         " (hint: --speculative ngram or auto)");
  const int64_t per_seq = (m.max_seq_len + kBlockTokens - 1) / kBlockTokens;
  const int64_t blocks = cfg.kv_pool_blocks > 0 ? cfg.kv_pool_blocks : cfg.max_batch * per_seq;
  return std::unique_ptr<Engine>(new EngineImpl(model, cfg, blocks));
}

}  // namespace myriad::serve
