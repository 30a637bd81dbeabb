#include "rl/rollout.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "core/rng.h"
#include "serve/kvcache/tier.h"  // kBlockTokens

namespace myriad::rl {
namespace {

using Clock = std::chrono::steady_clock;

// Submit's back-pressure refusal (engine.cc: "engine: queue full ...").
bool IsQueueFull(const Status& s) { return s.message().find("queue full") != std::string::npos; }

struct Slot {
  Sample sample;
  uint64_t id = 0;
  bool submitted = false, done = false;
  std::string error;  // finish_reason "error"/"cancelled": why
};

}  // namespace

uint64_t SampleSeed(uint64_t seed, int prompt_index, int sample_index) {
  Rng base(seed);
  Rng mixed(base.NextU64() ^ (static_cast<uint64_t>(prompt_index) * 0x9E3779B97F4A7C15ull) ^
            (static_cast<uint64_t>(sample_index) * 0xC2B2AE3D27D4EB4Full));
  return mixed.NextU64();
}

Result<std::vector<Sample>> Rollout(serve::Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                    int group_size, const serve::GenerationParams& base, uint64_t seed,
                                    RolloutStats* stats) {
  if (group_size < 1)
    return Status::Error("rollout: group_size=" + std::to_string(group_size) + " (hint: at least 1)");
  if (base.sampling.temperature < 0.f)
    return Status::Error("rollout: temperature " + std::to_string(base.sampling.temperature) + " < 0");
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty()) return Status::Error("rollout: prompt " + std::to_string(i) + " is empty");
  const auto t0 = Clock::now();
  const int P = static_cast<int>(prompts.size()), G = group_size;
  std::vector<Slot> slots(static_cast<size_t>(P) * G);
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < G; ++j) {
      Sample& s = slots[static_cast<size_t>(i) * G + j].sample;
      s.prompt_index = i;
      s.sample_index = j;
      s.seed = SampleSeed(seed, i, j);
      s.prompt = prompts[i];
    }

  std::mutex mu;  // guards slots (after submission), ready, released, finished
  std::condition_variable cv;
  std::deque<size_t> ready;          // slots to submit, in order
  std::vector<bool> released(P, false);  // the group's samples 1..G-1 are in `ready`
  int64_t finished = 0;
  // A prompt with a full block before its last token shares it: sample 0
  // goes first, the rest once its prefill has published the blocks (its
  // first event). Shorter prompts have nothing to share: all at once.
  for (int i = 0; i < P; ++i) {
    ready.push_back(static_cast<size_t>(i) * G);
    if ((static_cast<int64_t>(prompts[i].size()) - 1) / serve::kBlockTokens == 0) {
      released[i] = true;
      for (int j = 1; j < G; ++j) ready.push_back(static_cast<size_t>(i) * G + j);
    }
  }
  auto release = [&](int i) {  // under mu
    if (released[i]) return;
    released[i] = true;
    for (int j = 1; j < G; ++j) ready.push_back(static_cast<size_t>(i) * G + j);
    cv.notify_all();
  };

  serve::GenerationParams params = base;
  params.logprobs = 0;
  params.logprobs_at_temperature = true;
  RolloutStats st;
  Status failure;
  int64_t submitted = 0;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    bool backoff = false;
    while (failure.ok() && !ready.empty()) {
      const size_t k = ready.front();
      Slot* slot = &slots[k];
      params.seed = slot->sample.seed;
      lock.unlock();
      auto id = engine.Submit(slot->sample.prompt, params, [&, slot](const serve::TokenEvent& ev) {
        std::lock_guard<std::mutex> g(mu);
        Sample& s = slot->sample;
        if (s.sample_index == 0) release(s.prompt_index);
        if (!ev.done) {
          s.completion.push_back(ev.token);
          s.logprobs.push_back(ev.logprobs ? ev.logprobs->logprob : 0.f);
          return;
        }
        s.finish_reason = ev.finish_reason;
        s.cached_tokens = ev.cached_tokens;
        if (ev.finish_reason == "error" || ev.finish_reason == "cancelled")
          slot->error = ev.finish_reason + (ev.error.empty() ? "" : ": " + ev.error);
        slot->done = true;
        ++finished;
        cv.notify_all();
      });
      lock.lock();
      if (id.ok()) {
        slot->id = *id;
        slot->submitted = true;
        ++submitted;
        ready.pop_front();
      } else if (IsQueueFull(id.status())) {
        ++st.queue_full_retries;
        backoff = true;
        break;
      } else {
        failure = id.status().With("rollout: prompt " + std::to_string(slot->sample.prompt_index));
      }
    }
    for (const Slot& s : slots)
      if (s.done && !s.error.empty() && failure.ok())
        failure = Status::Error("rollout: prompt " + std::to_string(s.sample.prompt_index) + " sample " +
                                std::to_string(s.sample.sample_index) + ": " + s.error);
    if (!failure.ok()) break;
    if (finished == static_cast<int64_t>(slots.size())) break;
    const int64_t seen = finished;
    const size_t queued = ready.size();
    // The engine's queue frees as it admits (not only when ours finish): poll.
    cv.wait_for(lock, backoff ? std::chrono::milliseconds(1) : std::chrono::milliseconds(100),
                [&] { return finished != seen || ready.size() != queued; });
  }
  if (!failure.ok()) {
    for (const Slot& s : slots)
      if (s.submitted && !s.done) engine.Cancel(s.id);
    cv.wait(lock, [&] { return finished == submitted; });
    return failure;
  }
  lock.unlock();

  std::vector<Sample> out;
  out.reserve(slots.size());
  for (Slot& s : slots) {
    st.prompt_tokens += static_cast<int64_t>(s.sample.prompt.size());
    st.cached_tokens += s.sample.cached_tokens;
    st.completion_tokens += static_cast<int64_t>(s.sample.completion.size());
    out.push_back(std::move(s.sample));
  }
  st.requests = submitted;
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (stats) *stats = st;
  return out;
}

}  // namespace myriad::rl
