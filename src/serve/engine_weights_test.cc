// Engine::WeightsChanged: an engine whose model is changed in place (an RL
// trainer's step) must, after the call, generate what a fresh engine (and
// the one-sequence oracle) generates on the new weights -- no stale prefix
// KV from T0 or a lower tier, no stale selection biases.
#include <gtest/gtest.h>
#include <omp.h>

#include <condition_variable>
#include <mutex>

#include "core/rng.h"
#include "serve/engine.h"
#include "serve/engine_test_util.h"
#include "serve/kvcache/host_tier.h"

namespace myriad::serve {
namespace {

using engine_test::Collector;
using engine_test::EngineTest;
using engine_test::GreedyParams;
using engine_test::RunToEnd;

// Tiny models: one thread, so the engine's and the oracle's sums agree bit
// for bit and greedy ties cannot split them.
struct OneThread {
  int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
};

class EngineWeightsTest : public EngineTest {
 protected:
  // Every parameter moved by Normal(0, scale) noise, in place.
  void PerturbParams(uint64_t seed, float scale) {
    std::vector<float> w = model_.ParamsToHost();
    Rng rng(seed);
    for (float& x : w) x += scale * rng.Normal();
    model_.ParamsFromHost(w.data(), 0, static_cast<int64_t>(w.size()));
  }
  void PerturbBiases(uint64_t seed, float scale) {
    Rng rng(seed);
    for (auto& b : model_.biases())
      for (float& x : b) x += scale * rng.Normal();
  }
};

TEST_F(EngineWeightsTest, AfterAStepGeneratesWhatAFreshEngineDoes) {
  OneThread one;
  auto made = Engine::Create(model(), EngineConfig{});
  ASSERT_TRUE(made.ok()) << made.status().message();
  Engine* e = made->get();
  std::vector<std::unique_ptr<Collector>> keep;
  const auto prompt = Prompt(3, 40);  // two full blocks matchable
  const int n = 12;
  const auto old_out = Oracle(prompt, n);
  EXPECT_EQ(RunToEnd(e, prompt, GreedyParams(n), &keep)->tokens, old_out);

  PerturbParams(11, 0.05f);
  PerturbBiases(12, 0.5f);
  const auto new_out = Oracle(prompt, n);
  ASSERT_NE(new_out, old_out) << "the perturbation must change the output, or this test cannot fail";

  // Without the call the engine reuses the prefix KV of the old weights.
  Collector* stale = RunToEnd(e, prompt, GreedyParams(n), &keep);
  EXPECT_EQ(stale->final_event.cached_tokens, 32);

  ASSERT_TRUE(e->WeightsChanged().ok());
  EXPECT_EQ(e->stats().weight_version, 1);
  Collector* c = RunToEnd(e, prompt, GreedyParams(n), &keep);
  EXPECT_EQ(c->tokens, new_out);
  EXPECT_EQ(c->final_event.cached_tokens, 0) << "a prefix block of the old weights was reused";
  // The new weights' blocks are cached again.
  Collector* again = RunToEnd(e, prompt, GreedyParams(n), &keep);
  EXPECT_EQ(again->tokens, new_out);
  EXPECT_EQ(again->final_event.cached_tokens, 32);

  // A fresh engine on the new weights agrees.
  auto fresh = Engine::Create(model(), EngineConfig{});
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(RunToEnd(fresh->get(), prompt, GreedyParams(n), &keep)->tokens, new_out);
}

// Only the selection biases change: the engine's copy of them must follow.
TEST_F(EngineWeightsTest, RefreshesTheSelectionBiases) {
  OneThread one;
  auto made = Engine::Create(model(), EngineConfig{});
  ASSERT_TRUE(made.ok());
  std::vector<std::unique_ptr<Collector>> keep;
  const auto prompt = Prompt(5, 9);  // no full block: nothing cached, only the biases matter
  const int n = 16;
  const auto old_out = Oracle(prompt, n);
  EXPECT_EQ(RunToEnd(made->get(), prompt, GreedyParams(n), &keep)->tokens, old_out);
  PerturbBiases(21, 3.f);
  const auto new_out = Oracle(prompt, n);
  ASSERT_NE(new_out, old_out) << "the biases must change the routing, or this test cannot fail";
  ASSERT_TRUE((*made)->WeightsChanged().ok());
  EXPECT_EQ(RunToEnd(made->get(), prompt, GreedyParams(n), &keep)->tokens, new_out);
}

// A lower tier holds the old weights' blocks: after the call they are never
// matched (the chain keys carry the new fingerprint).
TEST_F(EngineWeightsTest, LowerTierBlocksOfTheOldWeightsAreNotMatched) {
  OneThread one;
  HostTierOptions opt;
  opt.capacity_blocks = 64;
  HostTier host(opt);
  EngineConfig cfg;
  cfg.tiers = {&host};
  cfg.write_through = true;
  cfg.load_or_recompute = false;  // always load a hit: a stale one would show
  auto made = Engine::Create(model(), cfg);
  ASSERT_TRUE(made.ok());
  std::vector<std::unique_ptr<Collector>> keep;
  const auto prompt = Prompt(7, 50);
  const int n = 8;
  EXPECT_EQ(RunToEnd(made->get(), prompt, GreedyParams(n), &keep)->tokens, Oracle(prompt, n));
  PerturbParams(31, 0.05f);
  const auto new_out = Oracle(prompt, n);
  ASSERT_TRUE((*made)->WeightsChanged().ok());
  Collector* c = RunToEnd(made->get(), prompt, GreedyParams(n), &keep);
  EXPECT_EQ(c->tokens, new_out);
  EXPECT_EQ(c->final_event.cached_tokens, 0);
  for (const auto& [name, hits] : (*made)->stats().tier_hits) EXPECT_EQ(hits, 0) << name;
}

TEST_F(EngineWeightsTest, RefusesWhileARequestIsInFlight) {
  OneThread one;
  auto made = Engine::Create(model(), EngineConfig{});
  ASSERT_TRUE(made.ok());
  // The request's first token event blocks the engine thread until released:
  // it is in flight for sure while WeightsChanged is called.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false, started = false;
  Collector done;
  auto inner = done.Callback();
  auto id = (*made)->Submit(Prompt(9, 10), GreedyParams(4), [&](const TokenEvent& ev) {
    if (!ev.done) {
      std::unique_lock<std::mutex> lock(mu);
      started = true;
      cv.notify_all();
      cv.wait(lock, [&] { return release; });
    }
    inner(ev);
  });
  ASSERT_TRUE(id.ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started; });
  }
  const Status s = (*made)->WeightsChanged();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("in flight"), std::string::npos) << s.message();
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  }
  done.Wait();
  EXPECT_TRUE((*made)->WeightsChanged().ok());
  EXPECT_EQ((*made)->stats().weight_version, 1);
}

TEST_F(EngineWeightsTest, RefusesConvertedWeights) {
  EngineConfig cfg;
  cfg.weights = WeightFormat::kF16;
  auto made = Engine::Create(model(), cfg);
  ASSERT_TRUE(made.ok());
  const Status s = (*made)->WeightsChanged();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fp16"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace myriad::serve
