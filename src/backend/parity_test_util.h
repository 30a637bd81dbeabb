// Shared by the parity tests (parity_test.cc, parity_moe_test.cc): the
// Parity fixture (one CPU backend per ISA against RefOps()), random data
// and an elementwise tolerance check.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"

namespace myriad::parity {

using Vec = std::vector<float>;

inline Vec Randn(size_t n, Rng& rng, float scale = 1.f) {
  Vec v(n);
  for (auto& x : v) x = rng.Normal() * scale;
  return v;
}

// |got - want| <= atol + rtol |want| elementwise; reports the worst offender.
inline void ExpectClose(const float* got, const float* want, size_t n, double rtol, double atol,
                 const std::string& what) {
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < n; ++i) {
    double err = std::fabs((double)got[i] - want[i]);
    double lim = atol + rtol * std::fabs((double)want[i]);
    if (!(err <= lim)) {
      ++bad;
      double ex = std::isnan(err) ? 1e300 : err - lim;
      if (ex > worst_excess) worst_excess = ex, worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << "/" << n << " out of tolerance; worst at [" << worst
                     << "] got " << got[worst] << " want " << want[worst];
}
inline void ExpectClose(const Vec& got, const Vec& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ExpectClose(got.data(), want.data(), got.size(), rtol, atol, what);
}


class Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    be_ = CpuBackend(GetParam());
    if (!be_) GTEST_SKIP() << "ISA " << GetParam() << " not available on this CPU";
    ops_ = &be_->ops();
  }
  Backend* be_ = nullptr;
  const BackendOps* ops_ = nullptr;
  const BackendOps& ref_ = RefOps();
};


}  // namespace myriad::parity
