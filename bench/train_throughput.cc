// Myriad's side of bench/train_throughput.py: trains a config on random
// tokens (same shapes as the PyTorch peer) and prints one JSON line with
// tokens/s, the median step time and the SGEMM peak measured in this process.
//
//   bench_train_throughput --config FILE [--set k=v ...] [--steps N] [--warmup W] [--precision fp32|bf16|auto]
//   bench_train_throughput --hf HF_DIR --batch B --seq T [...]   (an imported model, its own weights)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_args.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/kernel_bench.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "train/precision.h"
#include "model/flops.h"
#include "model/hf/hf_model.h"
#include "train/comm/local_comm.h"
#include "train/dist_train.h"
#include "train/trainer.h"

using namespace myriad;

int main(int argc, char** argv) {
  BenchArgs args;
  args.opts = {{"--steps", "5"}, {"--warmup", "2"}, {"--precision", "fp32"}, {"--batch", "8"}, {"--seq", "256"}};
  if (!args.Parse(argc, argv)) return 2;
  const std::string& config = args.config;
  const std::vector<std::string>& sets = args.sets;
  const int steps = args.Int("--steps"), warmup = args.Int("--warmup");
  const std::string precision = args.Str("--precision");
  ModelConfig mc;
  TrainConfig tc;
  std::unique_ptr<Model> imported;
  if (!args.hf.empty()) {
    hf::HfModelInfo info;
    auto m = hf::LoadHfModel(args.hf, &info);
    if (!m.ok()) { std::fprintf(stderr, "%s\n", m.status().message().c_str()); return 1; }
    imported = std::move(m).value();
    mc = info.config;
    tc.batch_size = args.Int("--batch");
    tc.seq_len = args.Int("--seq");
  } else {
    Status s = LoadRunConfig(config, sets, &mc, &tc);
    if (!s.ok()) { std::fprintf(stderr, "%s\n", s.message().c_str()); return 1; }
  }
  const int B = static_cast<int>(tc.batch_size), T = static_cast<int>(tc.seq_len);
  auto choice = ChoosePrecision(precision, mc, static_cast<int64_t>(B) * T);
  if (!choice.ok()) { std::fprintf(stderr, "%s\n", choice.status().message().c_str()); return 1; }
  ops::SetGemmPrecision(choice->precision);
  std::fprintf(stderr, "precision: %s\n", choice->reason.c_str());
  // `myriad train`'s step on one rank, over one micro-batch of B sequences.
  tc.grad_accum = 1;
  std::unique_ptr<comm::Comm> world = comm::MakeSelfComm();
  auto trainer = DistTrainer::Create(world.get(), mc, tc);
  if (!trainer.ok()) { std::fprintf(stderr, "%s\n", trainer.status().message().c_str()); return 1; }
  DistTrainer& dtr = **trainer;
  if (imported) {  // start from the folder's weights (routing as the model routes)
    const std::vector<float> w = imported->ParamsToHost();
    dtr.model().ParamsFromHost(w.data(), 0, static_cast<int64_t>(w.size()));
    dtr.model().biases() = imported->biases();
  }
  Rng rng(42);
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));
  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    for (auto& t : tokens) t = static_cast<int32_t>(rng.Below(mc.vocab_size));
    auto t0 = std::chrono::steady_clock::now();
    dtr.Step(tokens.data(), 1, B, T, i + 1);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) times.push_back(dt);
  }
  std::sort(times.begin(), times.end());
  const double med = times[times.size() / 2];
  ops::SetGemmPrecision(ops::GemmPrecision::kFp32);  // the peak is the fp32 SGEMM peak
  const double peak = MeasureSgemmPeakGflops(1024);
  const double tps = B * T / med;
  nlohmann::json out = {{"tokens_per_s", tps}, {"step_ms_median", med * 1e3},
                        {"sgemm_peak_gflops", peak}, {"flops_per_token", TrainFlopsPerToken(mc, T)},
                        {"mfu", TrainFlopsPerToken(mc, T) * tps / (peak * 1e9)},
                        {"params", dtr.model().layout().total()},
                        {"precision", choice->precision == ops::GemmPrecision::kBf16 ? "bf16" : "fp32"}, {"backend", ops::Active()->name()},
                        {"blas_core", GetBlasInfo().corename}, {"threads", ops::Active()->num_threads()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
