// Rollouts for RL (GRPO): G sampled completions per prompt from the serving
// engine, with the log-probability of every sampled token under the policy
// it was sampled from. The engine batches all of them continuously; the G
// samples of a prompt share its prefix's KV blocks (the first sample is
// prefilled alone, the other G-1 are submitted once its prefix blocks are
// published). docs/rl-rollouts.md describes prefix sharing, seeds and the
// logprob semantics.
//
// Threads: Rollout blocks the calling thread until every sample is done;
// the engine must not be shut down meanwhile. Other clients may share the
// engine (their requests only slow this one down).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "serve/engine.h"

namespace myriad::rl {

struct Sample {
  int prompt_index = 0;
  int sample_index = 0;            // 0..group_size-1 within its prompt
  uint64_t seed = 0;               // the engine request's sampling seed (SampleSeed)
  std::vector<int32_t> prompt, completion;
  // Per completion token: log p(token) under log_softmax(logits / T) at the
  // sampling temperature T (log_softmax(logits) at T = 0); top-k/top-p
  // truncation is not applied (the trainer scores the same full
  // distribution).
  std::vector<float> logprobs;
  std::string finish_reason;       // "stop" or "length"
  int64_t cached_tokens = 0;       // prompt tokens served from the prefix cache
};

struct RolloutStats {
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  int64_t requests = 0, queue_full_retries = 0;  // Submit refused by back-pressure, retried
  double seconds = 0;              // wall time of the whole rollout
};

// The seed of sample j of prompt i: a function of (seed, i, j) only, so a
// rollout is reproducible whatever order the engine finishes requests in.
uint64_t SampleSeed(uint64_t seed, int prompt_index, int sample_index);

// group_size samples per prompt, with max_tokens, temperature, top-k,
// top-p and stop sequences from `base` (its seed and logprobs are
// replaced: per-sample seeds, logprobs of the sampled tokens). Returns the
// samples ordered by (prompt index, sample index). A request refused
// because the engine's queue is full is retried once one of ours finishes;
// any other refusal or an engine error fails the rollout (the requests
// already submitted are cancelled and waited for first).
Result<std::vector<Sample>> Rollout(serve::Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                    int group_size, const serve::GenerationParams& base, uint64_t seed,
                                    RolloutStats* stats = nullptr);

}  // namespace myriad::rl
