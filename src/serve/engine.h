// The serving engine: one scheduler loop that runs continuous batches of
// prefill chunks and decode steps over a paged KV pool, with a prefix cache
// across requests backed by lower KV tiers. HTTP (http/) and benchmarks talk
// to it through this header only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/inference.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/speculative.h"
#include "serve/kvcache/tier.h"

namespace myriad::serve {

struct EngineConfig {
  int64_t kv_pool_blocks = 0;       // T0 blocks (0: sized for max_batch full-length sequences)
  int max_batch = 16;               // sequences decoding at once
  int64_t step_token_budget = 256;  // prefill+decode tokens per engine step (chunked prefill)
  int max_queue = 64;               // waiting requests before Submit refuses (HTTP 429)
  bool prefix_cache = true;         // reuse KV blocks across requests
  // Lower tiers (may be empty): host, disk, redis, in that order. Not owned.
  std::vector<KvTier*> tiers;
  bool load_or_recompute = true;    // cost model decides how much of a hit to load
  // Lower tiers get a block when it leaves the device pool (write-back), and
  // every cached block at Shutdown. With write_through they also get each
  // block as soon as it is full, so servers sharing a remote tier see each
  // other's prefixes while both run.
  bool write_through = false;
  // A waiting request's lookup in a remote tier (Redis) runs on its own
  // thread; after this long the request is admitted without its answer.
  double remote_lookup_timeout_s = 0.05;
  // Speculative decoding (model/speculative.h): a decoding request's draft
  // (prompt lookup, its MTP modules, or auto) is verified in the batch's
  // forward, the accepted prefix plus one token kept; rejected drafts' KV
  // stays past the request's computed length (never published to the prefix
  // cache). Each step drafts k <= draft_tokens tokens, k chosen by a
  // measured cost model (draft_cost.h) for the number of decoding requests:
  // 0, no speculation, when verifying costs more than it saves.
  DraftMode speculative = DraftMode::kOff;
  int draft_tokens = 4;
  bool adaptive_draft = true;  // false: always draft_tokens (tests, benchmarks)
  // Weights the runner computes with (serve --weights): fp32 as trained, or
  // converted once at start to fp16 or int8 (per-output-row scales).
  WeightFormat weights = WeightFormat::kF32;
};

struct GenerationParams {
  int max_tokens = 128;
  SamplingParams sampling{0.f, 0, 1.f};  // greedy by default
  uint64_t seed = 1;
  std::vector<std::vector<int32_t>> stop_token_seqs;  // stop when the output ends with one
  // >= 0: every token event carries the token's log-probability under the
  // model (LogprobsOf: before temperature/top-k/top-p) and the `logprobs`
  // most likely alternatives. -1: none (nothing computed).
  int logprobs = -1;
  // With logprobs >= 0: the log-probabilities of the tempered distribution
  // instead, log_softmax(logits / temperature) -- the policy an RL trainer
  // scores (rl/rollout.h). Top-k/top-p truncation is not applied (nor does
  // the trainer apply it); at temperature 0 it is log_softmax(logits).
  bool logprobs_at_temperature = false;
  // >= 0: score the prompt. Every prompt token after the first gets its
  // log-probability under the model given the tokens before it (log_softmax
  // of the logits, as `logprobs`) and the `prompt_logprobs` most likely
  // alternatives, on the final event. The request's prefill then computes
  // every position (no prefix-cache hit is used; its blocks are still
  // published), and max_tokens may be 0: the prompt is scored, nothing
  // generated (a remote teacher's scoring of a student's tokens: rl/).
  int prompt_logprobs = -1;
};

// What happened to a request, streamed to its callback from the engine thread.
struct TokenEvent {
  int32_t token = -1;      // a generated token (-1 on the final event)
  bool done = false;       // last event of the request
  std::string finish_reason;  // "stop", "length", "cancelled", "error"
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;  // on the final event
  std::string error;       // when finish_reason == "error"
  std::optional<TokenLogprobs> logprobs;  // of `token`, when GenerationParams::logprobs >= 0
  // On the final event: this request's speculative decoding (verifications
  // of a draft, draft tokens proposed and accepted).
  int64_t draft_steps = 0, draft_proposed = 0, draft_accepted = 0;
  // On the final event, with GenerationParams::prompt_logprobs >= 0: prompt
  // tokens 1..prompt_tokens-1, each given the ones before it.
  std::vector<TokenLogprobs> prompt_logprobs;
};

struct EngineStats {
  int64_t requests = 0, rejected = 0, cancelled = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  int64_t t0_hits = 0;                  // prompt tokens served from the device pool
  std::vector<std::pair<std::string, int64_t>> tier_hits;  // tokens served per lower tier
  int64_t recomputed_hit_tokens = 0;    // cached tokens the cost model chose to recompute
  int64_t skipped_lookups = 0;          // slow-tier lookups not made: no hit there could beat recomputing
  int64_t late_lookups = 0;             // remote lookups past their deadline: admitted without a remote hit
  // Speculative decoding: verifications of a draft, tokens they emitted,
  // drafts proposed / accepted per position (conditional: a position is
  // proposed only after the one before it was accepted), decode steps the
  // cost model ran without drafts, and the last step's draft length.
  int64_t spec_steps = 0, spec_emitted = 0, spec_off_steps = 0;
  std::vector<int64_t> spec_proposed, spec_accepted;
  int spec_draft_tokens = 0;
  int running = 0, waiting = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t weight_version = 0;           // WeightsChanged calls that took effect
};

class Engine {
 public:
  // `model` must outlive the engine. Starts the scheduler thread.
  static Result<std::unique_ptr<Engine>> Create(const Model* model, const EngineConfig& cfg);
  virtual ~Engine() = default;
  // Queues a request; `on_event` is called from the engine thread for every
  // token and once with done=true. Returns an id, or an error when the queue
  // is full (back-pressure) or the prompt is too long for the model.
  virtual Result<uint64_t> Submit(std::vector<int32_t> prompt, const GenerationParams& params,
                                  std::function<void(const TokenEvent&)> on_event) = 0;
  // The request stops at its next step (its client went away); its final
  // event has finish_reason "cancelled".
  virtual void Cancel(uint64_t id) = 0;
  virtual EngineStats stats() = 0;
  // The model's parameters or MoE selection biases were changed in place
  // (an RL trainer's step on the Model this engine reads): call it after the
  // change, with no request in flight (every one submitted has had its final
  // event). It drops every prefix block cached in the device pool without
  // writing it down, refreshes the engine's copy of the selection biases,
  // and re-fingerprints the weights, so the prefix cache's chain keys
  // change: blocks the lower tiers hold under the old weights are never
  // matched again (they age out there). Returns when the next request will
  // see the new weights. Errors: a request in flight or submitted
  // meanwhile, weights converted at start (fp16/int8: copies of the old
  // weights), or a shut-down engine. Not from an event callback (it waits
  // for the scheduler thread that calls them). Changing the weights while a
  // request runs is a data race the engine cannot see: don't.
  virtual Status WeightsChanged() {
    return Status::Error("engine: this engine does not support WeightsChanged");
  }
  // Finishes running requests, refuses new ones, joins the thread.
  virtual void Shutdown() = 0;
};

}  // namespace myriad::serve
