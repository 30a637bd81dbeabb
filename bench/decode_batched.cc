// Myriad's side of bench/decode_batched.py: batched greedy decode through the
// serving runner (serve::BatchRunner over a KvPool) on random weights, with
// dense attention either reading the paged KV blocks in place (the
// paged_attention op) or through the former per-sequence gather. Prints one
// JSON line: decode tokens/s of the whole batch (per wall and per CPU
// second), prefill tokens/s, the weight bytes one decode step reads and the
// DRAM read bandwidth measured in this process (the step's roofline).
//
//   bench_decode_batched --config FILE [--set k=v ...] [--batch 16] [--prompt-len 128]
//                        [--tokens 64] [--attention paged|gather] [--weights fp32|fp16|int8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_args.h"
#include "backend/cpu/kernel_bench.h"
#include "core/rng.h"
#include "model/sampler.h"
#include "ops/ops.h"
#include "serve/kv_pool.h"
#include "serve/runner.h"
#include "train/trainer.h"

using namespace myriad;

int main(int argc, char** argv) {
  BenchArgs args;
  args.opts = {{"--batch", "16"}, {"--prompt-len", "128"}, {"--tokens", "64"}, {"--attention", "paged"}, {"--weights", "fp32"}};
  if (!args.Parse(argc, argv)) return 2;
  const int B = args.Int("--batch"), P = args.Int("--prompt-len"), steps = args.Int("--tokens");
  const std::string path_name = args.Str("--attention");
  if (path_name != "paged" && path_name != "gather") {
    std::fprintf(stderr, "unknown --attention %s (paged or gather)\n", path_name.c_str());
    return 2;
  }
  const serve::AttentionPath path = path_name == "paged" ? serve::AttentionPath::kPaged : serve::AttentionPath::kGather;
  WeightFormat fmt;
  if (!ParseWeightFormat(args.Str("--weights"), &fmt)) {
    std::fprintf(stderr, "unknown --weights %s (fp32, fp16 or int8)\n", args.Str("--weights").c_str());
    return 2;
  }
  ModelConfig mc;
  TrainConfig tc;
  Status s = LoadRunConfig(args.config, args.sets, &mc, &tc);
  if (!s.ok()) { std::fprintf(stderr, "%s\n", s.message().c_str()); return 1; }
  const int warm = 2;  // untimed decode steps
  if (B < 1 || P < 1 || steps < 1 || P + warm + steps > mc.max_seq_len) {
    std::fprintf(stderr, "need batch, prompt-len, tokens >= 1 and prompt-len + tokens + %d <= max_seq_len %lld\n",
                 warm, static_cast<long long>(mc.max_seq_len));
    return 2;
  }
  Model model(mc);
  model.InitWeights(tc.seed);
  const int64_t per_seq = (P + warm + steps + serve::kBlockTokens - 1) / serve::kBlockTokens;
  serve::KvPool pool(mc, B * per_seq);
  serve::BatchRunner runner(model, &pool, fmt, path);
  // Tables interleaved over the pool, as the engine's lazy allocation leaves them.
  std::vector<std::vector<int32_t>> tok(B), blocks(B);
  for (int64_t k = 0; k < per_seq; ++k)
    for (int i = 0; i < B; ++i) blocks[i].push_back(pool.Allocate());
  Rng rng(7);
  for (int i = 0; i < B; ++i)
    for (int t = 0; t < P; ++t) tok[i].push_back(static_cast<int32_t>(rng.Below(mc.vocab_size)));
  auto chunk = [&](int i, int64_t start, int64_t n) {
    return serve::SeqChunk{tok[i].data() + start, n, start, blocks[i].data(), static_cast<int64_t>(blocks[i].size())};
  };
  SamplingParams greedy;
  greedy.temperature = 0;
  using Clock = std::chrono::steady_clock;
  // CPU seconds of the process: on a shared machine less noisy than wall time
  // (a preempted thread does not count), and equal to it on an idle one with
  // one thread.
  auto cpu_s = [] {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
  };
  auto t0 = Clock::now();
  std::vector<const float*> last(B);
  for (int i = 0; i < B; ++i) {
    const float* logits = runner.Forward({chunk(i, 0, P)});
    tok[i].push_back(SampleToken(logits, mc.vocab_size, greedy, &rng));
  }
  const double prefill_s = std::chrono::duration<double>(Clock::now() - t0).count();
  double decode_s = 0, decode_cpu_s = 0;
  for (int st = 0; st < warm + steps; ++st) {
    std::vector<serve::SeqChunk> cs;
    const int64_t pos = static_cast<int64_t>(tok[0].size()) - 1;
    for (int i = 0; i < B; ++i) cs.push_back(chunk(i, pos, 1));
    t0 = Clock::now();
    const double c0 = cpu_s();
    const float* logits = runner.Forward(cs);
    if (st >= warm) {
      decode_s += std::chrono::duration<double>(Clock::now() - t0).count();
      decode_cpu_s += cpu_s() - c0;
    }
    for (int i = 0; i < B; ++i) tok[i].push_back(SampleToken(logits + i * mc.vocab_size, mc.vocab_size, greedy, &rng));
  }
  // A step reads every weight once (dense; MoE: the experts its rows pick,
  // at most all of them) whatever the batch: WeightBytesPerToken counts the
  // top-k experts of one token, the floor of what a step reads.
  const double step_bytes = static_cast<double>(runner.weights().WeightBytesPerToken());
  const double bw = MeasureReadBandwidthGBs();
  const double steps_per_s = steps / decode_s;
  nlohmann::json out = {{"tokens_per_s", B * steps / decode_s}, {"tokens_per_cpu_s", B * steps / decode_cpu_s},
                        {"weights", WeightFormatName(fmt)}, {"step_weight_bytes", step_bytes}, {"read_bw_gbs", bw},
                        {"roofline_fraction", step_bytes * steps_per_s / (bw * 1e9)},
                        {"prefill_tokens_per_s", B * P / prefill_s},
                        {"attention", path_name}, {"batch", B}, {"prompt_len", P}, {"tokens", steps},
                        {"backend", ops::Active()->name()}, {"threads", ops::Active()->num_threads()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
