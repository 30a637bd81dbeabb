#include "train/perf.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "ops/ops.h"

namespace myriad {

double MeasureSgemmGflops(int n) {
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(static_cast<size_t>(n) * n, 0.25f),
      c(static_cast<size_t>(n) * n, 0.f);
  ops::Gemm(Trans::kNo, Trans::kNo, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    ops::Gemm(Trans::kNo, Trans::kNo, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

}  // namespace myriad
