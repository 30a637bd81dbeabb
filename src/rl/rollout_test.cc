// Rollout against independent oracles: the log-probabilities against an
// InferenceSession's forward over prompt + completion (log_softmax of the
// tempered logits, in double), the order and the samples against a second
// engine run serially (one request at a time), prefix sharing against the
// block arithmetic, back-pressure with a queue that is full for sure.
#include "rl/rollout.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "core/rng.h"
#include "model/inference.h"

namespace myriad::rl {
namespace {

// Tiny models: one thread, fastest here, and the same sums in every run.
struct OneThread {
  int saved = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved); }
};

ModelConfig TinyMoe() {
  ModelConfig c;
  c.vocab_size = 97; c.d_model = 32; c.n_layers = 3; c.n_heads = 4; c.n_kv_heads = 2; c.d_ff = 48;
  c.n_dense_layers = 1; c.n_routed_experts = 6; c.n_shared_experts = 1; c.top_k = 2; c.d_expert = 24;
  c.score_func = "sigmoid"; c.max_seq_len = 128; c.init_std = 0.2;
  return c;
}

class RolloutTest : public ::testing::Test {
 protected:
  RolloutTest() : model_(TinyMoe()) { Init(&model_); }
  static void Init(Model* m) {
    m->InitWeights(5);
    Rng rng(13);
    for (auto& b : m->biases())
      for (auto& x : b) x = 0.05f * rng.Normal();
  }
  std::vector<int32_t> Prompt(uint64_t seed, int n) const {
    Rng rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = static_cast<int32_t>(rng.Below(model_.config().vocab_size));
    return p;
  }
  std::vector<std::vector<int32_t>> Prompts() const { return {Prompt(1, 40), Prompt(2, 7), Prompt(3, 25)}; }
  static serve::GenerationParams Sampled(float temperature, int max_tokens) {
    serve::GenerationParams p;
    p.max_tokens = max_tokens;
    p.sampling = SamplingParams{temperature, 0, 1.f};
    return p;
  }
  std::unique_ptr<serve::Engine> MakeEngine(serve::EngineConfig cfg = {}) {
    auto e = serve::Engine::Create(&model_, cfg);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return std::move(e).value();
  }
  // log_softmax(logits / T) of each completion token, from one session's
  // forward over prompt + completion.
  std::vector<double> OracleLogprobs(const Sample& s, float temperature) { return OracleLogprobs(model_, s, temperature); }
  static std::vector<double> OracleLogprobs(const Model& model, const Sample& s, float temperature) {
    InferenceSession session(model, model.config().max_seq_len);
    const int64_t V = model.config().vocab_size;
    std::vector<double> out;
    const float* logits = session.Forward(s.prompt.data(), static_cast<int64_t>(s.prompt.size()));
    for (size_t k = 0; k < s.completion.size(); ++k) {
      const double T = temperature > 0 ? temperature : 1.0;
      double mx = -1e300, z = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, logits[v] / T);
      for (int64_t v = 0; v < V; ++v) z += std::exp(logits[v] / T - mx);
      out.push_back(logits[s.completion[k]] / T - mx - std::log(z));
      if (k + 1 < s.completion.size()) logits = session.Forward(&s.completion[k], 1);
    }
    return out;
  }
  Model model_;
};

TEST_F(RolloutTest, DeterministicAndOrderedWhateverTheBatching) {
  OneThread one;
  const int G = 4;
  auto engine = MakeEngine();
  auto a = Rollout(*engine, Prompts(), G, Sampled(1.f, 12), 7);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = Rollout(*engine, Prompts(), G, Sampled(1.f, 12), 7);  // now with the prefixes cached
  ASSERT_TRUE(b.ok());
  serve::EngineConfig serial;
  serial.max_batch = 1;  // one request at a time: another completion order
  auto serial_engine = MakeEngine(serial);
  auto c = Rollout(*serial_engine, Prompts(), G, Sampled(1.f, 12), 7);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(a->size(), static_cast<size_t>(3 * G));
  for (size_t k = 0; k < a->size(); ++k) {
    const Sample& s = (*a)[k];
    EXPECT_EQ(s.prompt_index, static_cast<int>(k) / G);
    EXPECT_EQ(s.sample_index, static_cast<int>(k) % G);
    EXPECT_EQ(s.prompt, Prompts()[s.prompt_index]);
    EXPECT_EQ(s.seed, SampleSeed(7, s.prompt_index, s.sample_index));
    EXPECT_EQ(s.finish_reason, "length");
    for (const auto* other : {&(*b)[k], &(*c)[k]}) {
      EXPECT_EQ(other->completion, s.completion) << "sample " << k;
      ASSERT_EQ(other->logprobs.size(), s.logprobs.size());
      for (size_t t = 0; t < s.logprobs.size(); ++t) EXPECT_NEAR(other->logprobs[t], s.logprobs[t], 1e-5);
    }
  }
  // Another seed, other samples.
  auto d = Rollout(*engine, Prompts(), G, Sampled(1.f, 12), 8);
  ASSERT_TRUE(d.ok());
  int same = 0;
  for (size_t k = 0; k < a->size(); ++k) same += (*d)[k].completion == (*a)[k].completion;
  EXPECT_LT(same, 2);
}

TEST_F(RolloutTest, GroupSamplesDiffer) {
  OneThread one;
  auto engine = MakeEngine();
  const int G = 4;
  auto r = Rollout(*engine, Prompts(), G, Sampled(1.f, 12), 3);
  ASSERT_TRUE(r.ok());
  for (int i = 0; i < 3; ++i) {
    std::set<std::vector<int32_t>> distinct;
    for (int j = 0; j < G; ++j) distinct.insert((*r)[i * G + j].completion);
    EXPECT_EQ(distinct.size(), static_cast<size_t>(G)) << "prompt " << i;
  }
}

TEST_F(RolloutTest, LogprobsAreThePolicysAtTheSamplingTemperature) {
  OneThread one;
  auto engine = MakeEngine();
  for (float T : {1.f, 0.7f, 1.6f}) {
    auto r = Rollout(*engine, Prompts(), 3, Sampled(T, 10), 11);
    ASSERT_TRUE(r.ok()) << r.status().message();
    for (const Sample& s : *r) {
      const std::vector<double> want = OracleLogprobs(s, T);
      ASSERT_EQ(s.logprobs.size(), want.size());
      for (size_t k = 0; k < want.size(); ++k)
        EXPECT_NEAR(s.logprobs[k], want[k], 1e-4) << "T=" << T << " prompt " << s.prompt_index << " token " << k;
    }
  }
}

TEST_F(RolloutTest, GroupSharesThePromptsPrefix) {
  OneThread one;
  auto engine = MakeEngine();
  const int G = 4;
  RolloutStats st;
  // 40 tokens: 2 full blocks before the last token; 7 and 25: 0 and 1.
  auto r = Rollout(*engine, Prompts(), G, Sampled(1.f, 6), 5, &st);
  ASSERT_TRUE(r.ok());
  const int64_t shared[3] = {32, 0, 16};
  for (const Sample& s : *r)
    EXPECT_EQ(s.cached_tokens, s.sample_index == 0 ? 0 : shared[s.prompt_index])
        << "prompt " << s.prompt_index << " sample " << s.sample_index;
  EXPECT_EQ(st.cached_tokens, (G - 1) * (32 + 16));
  EXPECT_EQ(st.prompt_tokens, G * (40 + 7 + 25));
  EXPECT_EQ(st.completion_tokens, 3 * G * 6);
  EXPECT_EQ(st.requests, 3 * G);
  EXPECT_GT(st.seconds, 0);
}

// The RL loop: roll out, change the weights in place (a trainer's step),
// WeightsChanged, roll out again: the second rollout's logprobs are the new
// policy's, though its prompts' prefixes were cached under the old one.
TEST_F(RolloutTest, AfterWeightsChangedTheLogprobsAreTheNewPolicys) {
  OneThread one;
  auto engine = MakeEngine();
  auto before = Rollout(*engine, Prompts(), 3, Sampled(1.f, 6), 4);
  ASSERT_TRUE(before.ok());
  std::vector<float> w = model_.ParamsToHost();
  Rng rng(77);
  for (float& x : w) x += 0.05f * rng.Normal();
  model_.ParamsFromHost(w.data(), 0, static_cast<int64_t>(w.size()));
  for (auto& b : model_.biases())
    for (float& x : b) x += 0.5f * rng.Normal();
  ASSERT_TRUE(engine->WeightsChanged().ok());
  RolloutStats st;
  auto after = Rollout(*engine, Prompts(), 3, Sampled(1.f, 6), 4, &st);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(st.cached_tokens, 2 * (32 + 16)) << "only the group's own sharing, nothing from before";
  Model old_model(TinyMoe());  // the policy before the step
  Init(&old_model);
  double moved = 0;
  for (const Sample& s : *after) {
    const std::vector<double> want = OracleLogprobs(s, 1.f), old = OracleLogprobs(old_model, s, 1.f);
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_NEAR(s.logprobs[t], want[t], 1e-4) << "prompt " << s.prompt_index << " token " << t;
      moved = std::max(moved, std::fabs(want[t] - old[t]));
    }
  }
  EXPECT_GT(moved, 1e-2) << "the step must change the logprobs, or this test cannot fail";
}

// The engine's queue holds one request and its thread is held in another
// client's callback: Rollout's second Submit is refused for sure, and it
// must retry, not fail.
TEST_F(RolloutTest, RetriesWhenTheQueueIsFull) {
  OneThread one;
  serve::EngineConfig cfg;
  cfg.max_queue = 1;
  auto engine = MakeEngine(cfg);
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, release = false;
  std::atomic<bool> other_done{false};
  auto blocker = engine->Submit(Prompt(9, 5), Sampled(0.f, 2), [&](const serve::TokenEvent& ev) {
    if (ev.done) {
      other_done = true;
      return;
    }
    std::unique_lock<std::mutex> lock(mu);
    held = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  ASSERT_TRUE(blocker.ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return held; });
  }
  std::thread releaser([&] {
    while (engine->stats().rejected == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lock(mu);
    release = true;
    cv.notify_all();
  });
  RolloutStats st;
  auto r = Rollout(*engine, Prompts(), 3, Sampled(1.f, 5), 2, &st);
  releaser.join();
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_GT(st.queue_full_retries, 0);
  EXPECT_EQ(r->size(), 9u);
  // The same samples as without back-pressure.
  auto free_engine = MakeEngine();
  auto want = Rollout(*free_engine, Prompts(), 3, Sampled(1.f, 5), 2);
  ASSERT_TRUE(want.ok());
  for (size_t k = 0; k < r->size(); ++k) EXPECT_EQ((*r)[k].completion, (*want)[k].completion) << k;
  while (!other_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST_F(RolloutTest, BadInputIsAClearError) {
  auto engine = MakeEngine();
  auto r = Rollout(*engine, Prompts(), 0, Sampled(1.f, 4), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("group_size"), std::string::npos) << r.status().message();
  auto too_long = Rollout(*engine, {Prompt(1, 5), Prompt(2, 200)}, 2, Sampled(1.f, 4), 1);
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("prompt 1"), std::string::npos) << too_long.status().message();
  EXPECT_NE(too_long.status().message().find("too long"), std::string::npos) << too_long.status().message();
  // The engine is usable afterwards (the first prompt's samples were waited for).
  auto ok = Rollout(*engine, {Prompt(1, 5)}, 2, Sampled(1.f, 4), 1);
  EXPECT_TRUE(ok.ok()) << ok.status().message();
}

}  // namespace
}  // namespace myriad::rl
