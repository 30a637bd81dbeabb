// The one way Myriad times a short piece of work in-process (for choosing
// kernels and precisions, and for MFU peaks): one untimed warm-up run, then
// the best of `reps` wall-clock runs, in seconds.
#pragma once

#include <algorithm>
#include <chrono>

namespace myriad {

template <typename Fn>
double BestSeconds(int reps, Fn&& fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace myriad
