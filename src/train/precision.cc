#include "train/precision.h"

#include "core/timing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace myriad {
namespace {

// Best-of-3 seconds for the forward and weight-gradient GEMMs of one
// [M, K] x [K, N] layer, under the current GEMM precision.
double TimeLayer(int64_t M, int64_t N, int64_t K) {
  std::vector<float> x(M * K, 0.5f), w(N * K, 0.25f), y(M * N), dw(N * K, 0.f);
  return BestSeconds(3, [&] {
    ops::Linear(x.data(), w.data(), M, K, N, y.data());
    ops::LinearBackward(y.data(), x.data(), w.data(), M, K, N, nullptr, false, dw.data());
  });
}

}  // namespace

Result<PrecisionChoice> ChoosePrecision(const std::string& setting, const ModelConfig& model,
                                        int64_t tokens) {
  PrecisionChoice c;
  if (setting == "fp32") {
    c.reason = "fp32 (train.precision)";
    return c;
  }
  if (setting != "bf16" && setting != "auto")
    return Status::Error("train.precision=\"" + setting + "\" is not known (hint: \"auto\", \"fp32\" or \"bf16\")");
  if (!ops::HasBf16Gemm()) {
    if (setting == "bf16")
      return Status::Error("train.precision=\"bf16\" needs a backend with a bf16 GEMM (AVX512-BF16 on CPU); "
                           "this one has none (hint: use \"auto\" or \"fp32\")");
    c.reason = "fp32 (auto: no bf16 GEMM on " + ops::Active()->name() + ")";
    return c;
  }
  if (setting == "bf16") {
    c.precision = ops::GemmPrecision::kBf16;
    c.reason = "bf16 GEMM inputs, fp32 accumulation (train.precision)";
    return c;
  }
  // auto: a layer of the run's width, both ways.
  const int64_t M = std::min<int64_t>(tokens, 2048);
  const int64_t K = model.d_model;
  const int64_t N = std::max<int64_t>(model.d_model, 2 * std::max(model.d_ff, model.d_expert));
  const ops::GemmPrecision saved = ops::GetGemmPrecision();
  ops::SetGemmPrecision(ops::GemmPrecision::kFp32);
  double t32 = TimeLayer(M, N, K);
  ops::SetGemmPrecision(ops::GemmPrecision::kBf16);
  double t16 = TimeLayer(M, N, K);
  ops::SetGemmPrecision(saved);
  char buf[160];
  const bool faster = t16 * 1.1 < t32;
  std::snprintf(buf, sizeof buf, "%s (auto: bf16 GEMM %.2fx the speed of fp32 on a %lldx%lldx%lld layer)",
                faster ? "bf16 GEMM inputs, fp32 accumulation" : "fp32", t32 / t16, (long long)M,
                (long long)N, (long long)K);
  c.reason = buf;
  c.precision = faster ? ops::GemmPrecision::kBf16 : ops::GemmPrecision::kFp32;
  return c;
}

}  // namespace myriad
