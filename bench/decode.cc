// Myriad's side of bench/decode.py: batch-1 greedy decode with a KV cache on
// random weights, printing one JSON line with tokens/s, weight bytes read per
// token, KV cache bytes per token (beside GQA's at equal width) and the DRAM
// read bandwidth measured in this process.
//
//   bench_decode --config FILE [--set k=v ...] [--tokens N] [--prompt-len P] [--weights fp32|fp16|int8]
//   bench_decode --hf HF_DIR [...]   (an imported model with its own weights)
//   bench_decode --hf HF_DIR --attention gqa   (an MLA model with GQA attention of equal width instead)
// Also reports the KV cache bytes per token (KvBytesPerToken), and GQA's at
// equal width for an MLA model.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_args.h"
#include "backend/cpu/kernel_bench.h"
#include "core/rng.h"
#include "model/hf/hf_model.h"
#include "model/flops.h"
#include "model/inference.h"
#include "model/sampler.h"
#include "ops/ops.h"
#include "train/trainer.h"

using namespace myriad;

int main(int argc, char** argv) {
  BenchArgs args;
  args.opts = {{"--tokens", "64"}, {"--prompt-len", "16"}, {"--weights", "fp32"}, {"--attention", "model"}};
  if (!args.Parse(argc, argv)) return 2;
  const std::string& config = args.config;
  const std::vector<std::string>& sets = args.sets;
  const int tokens = args.Int("--tokens"), prompt_len = args.Int("--prompt-len");
  const std::string weights = args.Str("--weights");
  WeightFormat fmt;
  if (!ParseWeightFormat(weights, &fmt)) { std::fprintf(stderr, "unknown --weights %s\n", weights.c_str()); return 2; }
  std::unique_ptr<Model> owned;
  if (!args.hf.empty()) {
    auto m = hf::LoadHfModel(args.hf);
    if (!m.ok()) { std::fprintf(stderr, "%s\n", m.status().message().c_str()); return 1; }
    owned = std::move(m).value();
  } else {
    ModelConfig mcfg;
    TrainConfig tc;
    Status s = LoadRunConfig(config, sets, &mcfg, &tc);
    if (!s.ok()) { std::fprintf(stderr, "%s\n", s.message().c_str()); return 1; }
    owned = std::make_unique<Model>(mcfg);
    owned->InitWeights(tc.seed);
  }
  if (args.Str("--attention") == "gqa" && owned->config().mla()) {
    // The same model with GQA attention of equal width in place of MLA
    // (GqaAtEqualWidth), random weights: the comparison's other side.
    owned = std::make_unique<Model>(GqaAtEqualWidth(owned->config()));
    owned->InitWeights(1);
  } else if (args.Str("--attention") != "model" && args.Str("--attention") != "gqa") {
    std::fprintf(stderr, "unknown --attention %s (model or gqa)\n", args.Str("--attention").c_str());
    return 2;
  }
  const Model& model = *owned;
  const ModelConfig& mc = model.config();
  const int64_t max_len = std::min<int64_t>(mc.max_seq_len, prompt_len + tokens + 1);
  InferenceSession session(model, max_len, fmt);
  Rng rng(7);
  std::vector<int32_t> prompt(prompt_len);
  for (auto& t : prompt) t = static_cast<int32_t>(rng.Below(mc.vocab_size));
  SamplingParams greedy;
  greedy.temperature = 0;
  // Warm-up pass, then the timed one.
  double best = 1e30;
  for (int rep = 0; rep < 2; ++rep) {
    session.Reset();
    const float* logits = session.Forward(prompt.data(), prompt_len);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < tokens; ++i) {
      int32_t next = SampleToken(logits, mc.vocab_size, greedy, &rng);
      logits = session.Forward(&next, 1);
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double tps = tokens / best;
  const double bw = MeasureReadBandwidthGBs();
  const double bytes = static_cast<double>(session.WeightBytesPerToken());
  nlohmann::json out = {{"tokens_per_s", tps}, {"weights", WeightFormatName(fmt)},
                        {"weight_bytes_per_token", bytes}, {"read_bw_gbs", bw},
                        // The session's KV cache (fp32), and GQA's at equal width for an MLA model.
                        {"kv_bytes_per_token", KvBytesPerToken(mc)},
                        {"gqa_kv_bytes_per_token", KvBytesPerToken(GqaAtEqualWidth(mc))},
                        {"roofline_fraction", bytes * tps / (bw * 1e9)},
                        {"backend", ops::Active()->name()}, {"threads", ops::Active()->num_threads()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
