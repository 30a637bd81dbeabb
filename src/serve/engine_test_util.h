// The serving engine's test fixture, shared by engine_test.cc and
// engine_spec_test.cc: a tiny MoE (runner_test.cc's), the oracle (greedy
// decoding of one sequence with an InferenceSession), and a collector of one
// request's events.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/rng.h"
#include "model/inference.h"
#include "serve/engine.h"

namespace myriad::serve {

ModelConfig TinyServeMoe(int64_t max_seq_len);  // runner_test.cc
ModelConfig TinyServeMla(int64_t max_seq_len);  // runner_test.cc
void InitTinyServeMoe(Model* model);

namespace engine_test {

class EngineTest : public ::testing::Test {
 public:
  const Model* model() const { return &model_; }
  EngineTest() : EngineTest(TinyServeMoe(128)) {}
  explicit EngineTest(const ModelConfig& cfg) : model_(cfg) { InitTinyServeMoe(&model_); }

  std::vector<int32_t> Prompt(uint64_t seed, int n) {
    Rng rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = static_cast<int32_t>(rng.Below(model_.config().vocab_size));
    return p;
  }
  // The oracle: greedy decoding of one sequence.
  std::vector<int32_t> Oracle(const std::vector<int32_t>& prompt, int max_tokens) {
    InferenceSession s(model_, model_.config().max_seq_len);
    const int64_t V = model_.config().vocab_size;
    std::vector<int32_t> out;
    const float* logits = s.Forward(prompt.data(), static_cast<int64_t>(prompt.size()));
    for (;;) {
      const int32_t t = static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
      out.push_back(t);
      if (static_cast<int>(out.size()) >= max_tokens || s.len() + 1 >= s.max_len()) break;
      logits = s.Forward(&t, 1);
    }
    return out;
  }

 protected:
  Model model_;
};

// Collects one request's events; Wait() blocks until the final one.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  TokenEvent final_event;
  bool done = false;
  std::function<void(const TokenEvent&)> Callback() {
    return [this](const TokenEvent& ev) {
      std::lock_guard<std::mutex> lock(mu);
      if (ev.done) {
        final_event = ev;
        done = true;
        cv.notify_all();
      } else {
        tokens.push_back(ev.token);
      }
    };
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; })) << "request never finished";
  }
};

inline GenerationParams GreedyParams(int max_tokens) {
  GenerationParams p;
  p.max_tokens = max_tokens;
  return p;
}

// Runs one request to the end.
inline Collector* RunToEnd(Engine* e, const std::vector<int32_t>& prompt, const GenerationParams& p,
               std::vector<std::unique_ptr<Collector>>* keep) {
  keep->push_back(std::make_unique<Collector>());
  Collector* c = keep->back().get();
  auto id = e->Submit(prompt, p, c->Callback());
  EXPECT_TRUE(id.ok()) << id.status().message();
  c->Wait();
  return c;
}

}  // namespace engine_test
}  // namespace myriad::serve
