// RL rollout throughput: P prompts x G sampled completions of exactly N
// tokens each (temperature 1, no stop), with the sampled tokens' logprobs,
// (a) through the serving engine with rl::Rollout (continuous batching, the
// group's prompt prefix shared in the KV cache) and (b) one sequence at a
// time with an InferenceSession, as `myriad generate` decodes (prefill,
// then one token per forward). Both draw each sample with the same seed
// (rl::SampleSeed), so they must produce the same tokens (reported as
// "identical"); they alternate (engine serial engine serial ...) in one run.
// Prints one JSON line per round, then the summary (medians, ranges, ratio).
//
//   bench_rollout [--ckpt runs/demo-moe] [--prompts 8] [--group 4] [--prompt-len 64] [--tokens 64]
//                 [--rounds 3] [--max-batch 32]
//
// Prompts are random token ids (seeded): speed, not text, is measured.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/env.h"
#include "core/rng.h"
#include "model/inference.h"
#include "model/sampler.h"
#include "ops/ops.h"
#include "rl/rollout.h"
#include "serve/engine.h"
#include "train/checkpoint/checkpoint.h"
#include "train/trainer.h"

using namespace myriad;

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// One sequence at a time: prefill, then sample and forward one token at a
// time, with the tempered logprob of each sampled token (the same work the
// engine's rollout does per sample).
std::vector<std::vector<int32_t>> Serial(const Model& model, const std::vector<std::vector<int32_t>>& prompts, int G,
                                         int N, float temperature, uint64_t seed) {
  const int64_t V = model.config().vocab_size;
  const SamplingParams sp{temperature, 0, 1.f};
  std::vector<std::vector<int32_t>> out;
  std::vector<float> tempered(V);
  InferenceSession s(model, model.config().max_seq_len);
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int j = 0; j < G; ++j) {
      s.Reset();
      Rng rng(rl::SampleSeed(seed, static_cast<int>(i), j));
      std::vector<int32_t> completion;
      const float* logits = s.Forward(prompts[i].data(), static_cast<int64_t>(prompts[i].size()));
      for (int k = 0; k < N; ++k) {
        const int32_t t = SampleToken(logits, V, sp, &rng);
        for (int64_t v = 0; v < V; ++v) tempered[v] = logits[v] / temperature;
        (void)LogprobsOf(tempered.data(), V, t, 0);
        completion.push_back(t);
        if (k + 1 < N) logits = s.Forward(&t, 1);
      }
      out.push_back(std::move(completion));
    }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> o = {{"--ckpt", "runs/demo-moe"}, {"--prompts", "8"},  {"--group", "4"},
                                          {"--prompt-len", "64"},      {"--tokens", "64"},   {"--rounds", "3"},
                                          {"--max-batch", "32"}};
  for (int i = 1; i < argc; i += 2) {
    if (!o.count(argv[i]) || i + 1 >= argc) {
      std::fprintf(stderr, "bench_rollout: %s %s\n", argv[i], o.count(argv[i]) ? "needs a value" : "is not a flag");
      return 2;
    }
    o[argv[i]] = argv[i + 1];
  }
  const int P = std::stoi(o["--prompts"]), G = std::stoi(o["--group"]), L = std::stoi(o["--prompt-len"]),
            N = std::stoi(o["--tokens"]), rounds = std::stoi(o["--rounds"]), max_batch = std::stoi(o["--max-batch"]);
  auto ck = LoadCheckpoint(Env::Default(), o["--ckpt"]);
  if (!ck.ok()) {
    std::fprintf(stderr, "bench_rollout: %s (hint: `make demo` trains runs/demo-moe)\n", ck.status().message().c_str());
    return 1;
  }
  if (!ck->manifest.contains("model_config")) {
    std::fprintf(stderr, "bench_rollout: %s has no model_config\n", ck->dir.c_str());
    return 1;
  }
  auto mc = ModelConfig::FromJson(ck->manifest["model_config"]);
  if (!mc.ok()) {
    std::fprintf(stderr, "bench_rollout: %s\n", mc.status().message().c_str());
    return 1;
  }
  Model model(*mc);
  if (Status s = RestoreModel(*ck, &model); !s.ok()) {
    std::fprintf(stderr, "bench_rollout: %s\n", s.message().c_str());
    return 1;
  }
  if (L + N > model.config().max_seq_len) {
    std::fprintf(stderr, "bench_rollout: --prompt-len + --tokens = %d exceeds the context of %lld\n", L + N,
                 static_cast<long long>(model.config().max_seq_len));
    return 2;
  }
  Rng rng(1234);
  std::vector<std::vector<int32_t>> prompts(P, std::vector<int32_t>(L));
  for (auto& p : prompts)
    for (auto& t : p) t = static_cast<int32_t>(rng.Below(model.config().vocab_size));

  serve::EngineConfig cfg;
  cfg.max_batch = max_batch;
  cfg.step_token_budget = std::max<int64_t>(256, max_batch);
  auto engine = serve::Engine::Create(&model, cfg);
  if (!engine.ok()) {
    std::fprintf(stderr, "bench_rollout: %s\n", engine.status().message().c_str());
    return 1;
  }
  serve::GenerationParams base;
  base.max_tokens = N;
  base.sampling = SamplingParams{1.f, 0, 1.f};
  const double tokens = static_cast<double>(P) * G * N;
  std::vector<double> eng_tps, ser_tps;
  int64_t identical = 0, compared = 0, cached = 0, prompt_tokens = 0;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t seed = 100 + r;  // a fresh seed (and, after WeightsChanged, an empty cache) each round
    if (Status s = (*engine)->WeightsChanged(); !s.ok()) {
      std::fprintf(stderr, "bench_rollout: %s\n", s.message().c_str());
      return 1;
    }
    rl::RolloutStats st;
    auto t0 = Clock::now();
    auto samples = rl::Rollout(**engine, prompts, G, base, seed, &st);
    const double e_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!samples.ok()) {
      std::fprintf(stderr, "bench_rollout: %s\n", samples.status().message().c_str());
      return 1;
    }
    t0 = Clock::now();
    const auto serial = Serial(model, prompts, G, N, 1.f, seed);
    const double s_s = std::chrono::duration<double>(Clock::now() - t0).count();
    for (size_t k = 0; k < serial.size(); ++k) identical += (*samples)[k].completion == serial[k], ++compared;
    cached += st.cached_tokens;
    prompt_tokens += st.prompt_tokens;
    eng_tps.push_back(tokens / e_s);
    ser_tps.push_back(tokens / s_s);
    std::printf("%s\n", nlohmann::json{{"round", r},
                                       {"engine_tok_s", tokens / e_s},
                                       {"serial_tok_s", tokens / s_s},
                                       {"cached_tokens", st.cached_tokens},
                                       {"prompt_tokens", st.prompt_tokens}}
                            .dump()
                            .c_str());
    std::fflush(stdout);
  }
  auto range = [](const std::vector<double>& v) {
    return std::vector<double>{*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
  };
  nlohmann::json j = {{"bench", "rollout"},
                      {"ckpt", ck->dir},
                      {"step", ck->step},
                      {"prompts", P},
                      {"group", G},
                      {"prompt_len", L},
                      {"tokens", N},
                      {"max_batch", max_batch},
                      {"rounds", rounds},
                      {"engine_tok_s_median", Median(eng_tps)},
                      {"engine_tok_s_range", range(eng_tps)},
                      {"serial_tok_s_median", Median(ser_tps)},
                      {"serial_tok_s_range", range(ser_tps)},
                      {"ratio_of_medians", Median(eng_tps) / Median(ser_tps)},
                      {"cached_fraction", prompt_tokens ? static_cast<double>(cached) / prompt_tokens : 0.0},
                      {"identical", std::to_string(identical) + "/" + std::to_string(compared)},
                      {"threads", ops::Active()->num_threads()},
                      {"backend", ops::Active()->name()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
