// The engine's log-probabilities against an independent oracle, an
// InferenceSession's logits with log_softmax recomputed in long double: of
// each generated token (GenerationParams::logprobs), and of every prompt
// token when the prompt is scored (prompt_logprobs, what a remote
// distillation teacher serves).
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <mutex>

#include "model/inference.h"
#include "serve/engine.h"
#include "serve/engine_test_util.h"

namespace myriad::serve {
namespace {

using engine_test::Collector;
using engine_test::EngineTest;
using engine_test::GreedyParams;
using engine_test::RunToEnd;

// Logprobs: each token event carries log_softmax of the logits it was
// chosen from, computed here from the oracle's own InferenceSession in long
// double; greedy tokens are the most likely of their top list.
TEST_F(EngineTest, LogprobsAreTheModelsLogSoftmax) {
  EngineConfig cfg;
  auto engine = Engine::Create(model(), cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  const std::vector<int32_t> prompt = Prompt(91, 21);
  GenerationParams p = GreedyParams(9);
  p.logprobs = 4;
  std::vector<TokenEvent> events;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  auto id = (*engine)->Submit(prompt, p, [&](const TokenEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    if (ev.done) done = true;
    else events.push_back(ev);
    cv.notify_all();
  });
  ASSERT_TRUE(id.ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  }
  ASSERT_EQ(events.size(), 9u);
  InferenceSession s(model_, model_.config().max_seq_len);
  const int64_t V = model_.config().vocab_size;
  const float* logits = s.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
  for (const TokenEvent& ev : events) {
    ASSERT_TRUE(ev.logprobs.has_value());
    long double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(static_cast<long double>(logits[i]));
    auto ref = [&](int32_t t) { return static_cast<double>(static_cast<long double>(logits[t]) - std::log(z)); };
    EXPECT_EQ(ev.logprobs->token, ev.token);
    EXPECT_NEAR(ev.logprobs->logprob, ref(ev.token), 1e-4);
    ASSERT_EQ(ev.logprobs->top.size(), 4u);
    EXPECT_EQ(ev.logprobs->top[0].first, ev.token);  // greedy
    for (const auto& [t, lp] : ev.logprobs->top) EXPECT_NEAR(lp, ref(t), 1e-4);
    for (size_t i = 1; i < 4; ++i) EXPECT_GE(ev.logprobs->top[i - 1].second, ev.logprobs->top[i].second);
    logits = s.Forward(&ev.token, 1);
  }
  // Not asked for: nothing computed.
  std::vector<std::unique_ptr<Collector>> keep;
  RunToEnd(engine->get(), prompt, GreedyParams(2), &keep);
  (*engine)->Shutdown();
}

// Scoring a prompt (a remote teacher's job): every prompt token after the
// first gets the model's log-softmax given the tokens before it, against an
// InferenceSession fed one token at a time; the prompt's cached blocks are
// not used (every position is computed), over several prefill chunks.
TEST_F(EngineTest, PromptLogprobsScoreEveryPromptTokenWithoutAHit) {
  EngineConfig cfg;
  cfg.max_batch = 4;
  cfg.step_token_budget = 16;  // a 40-token prompt takes three chunks
  auto engine = Engine::Create(model(), cfg);
  ASSERT_TRUE(engine.ok()) << engine.status().message();
  const std::vector<int32_t> prompt = Prompt(93, 40);
  std::vector<std::unique_ptr<Collector>> keep;
  Collector* plain = RunToEnd(engine->get(), prompt, GreedyParams(3), &keep);  // caches the prompt's blocks
  ASSERT_EQ(plain->tokens.size(), 3u);

  GenerationParams p = GreedyParams(0);
  p.prompt_logprobs = 3;
  Collector* scored = RunToEnd(engine->get(), prompt, p, &keep);
  EXPECT_EQ(scored->final_event.finish_reason, "length");
  EXPECT_TRUE(scored->tokens.empty());
  EXPECT_EQ(scored->final_event.cached_tokens, 0);
  EXPECT_EQ(scored->final_event.completion_tokens, 0);
  const auto& lp = scored->final_event.prompt_logprobs;
  ASSERT_EQ(lp.size(), prompt.size() - 1);

  InferenceSession s(model_, model_.config().max_seq_len);
  const int64_t V = model_.config().vocab_size;
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const float* logits = s.Forward(&prompt[i], 1);
    long double z = 0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<long double>(logits[v]));
    auto ref = [&](int32_t t) { return static_cast<double>(static_cast<long double>(logits[t]) - std::log(z)); };
    EXPECT_EQ(lp[i].token, prompt[i + 1]) << i;
    EXPECT_NEAR(lp[i].logprob, ref(prompt[i + 1]), 1e-4) << i;
    ASSERT_EQ(lp[i].top.size(), 3u);
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (logits[v] > logits[best]) best = static_cast<int32_t>(v);
    EXPECT_EQ(lp[i].top[0].first, best) << i;
    for (const auto& [t, l] : lp[i].top) EXPECT_NEAR(l, ref(t), 1e-4);
  }

  // Scoring and generating at once: the same tokens as the plain request.
  p.max_tokens = 3;
  Collector* both = RunToEnd(engine->get(), prompt, p, &keep);
  EXPECT_EQ(both->tokens, plain->tokens);
  EXPECT_EQ(both->final_event.prompt_logprobs.size(), prompt.size() - 1);
  // Not asked for: none.
  EXPECT_TRUE(plain->final_event.prompt_logprobs.empty());

  // Clear errors: nothing to generate and nothing to score.
  auto bad = (*engine)->Submit(prompt, GreedyParams(0), nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prompt_logprobs"), std::string::npos) << bad.status().message();
  GenerationParams one = GreedyParams(0);
  one.prompt_logprobs = 0;
  bad = (*engine)->Submit({prompt[0]}, one, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("at least 2 tokens"), std::string::npos) << bad.status().message();
  (*engine)->Shutdown();
}

}  // namespace
}  // namespace myriad::serve
