// The device self-test on this machine's backend, the same self-test against
// deliberately broken backends (a wrong GEMM, a NaN from attention, a GEMM
// that is not deterministic), its comparison helpers, and the straggler rule.
#include "train/supervise/health.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace myriad::supervise {
namespace {

// ------------------------------------------------ broken backends ----

// The active backend with some op slots replaced.
class PatchedBackend : public Backend {
 public:
  explicit PatchedBackend(Backend* inner) : inner_(inner), ops_(inner->ops()) {
    ops_.gemm_bf16 = nullptr;  // every ops::Gemm goes through ops_.gemm
  }
  std::string name() const override { return "patched-" + inner_->name(); }
  const BackendOps& ops() const override { return ops_; }
  int num_threads() const override { return inner_->num_threads(); }
  BackendOps& mutable_ops() { return ops_; }

 private:
  Backend* inner_;
  BackendOps ops_;
};

// Installs a PatchedBackend for the scope of a test and restores the
// previous backend after it.
class ScopedPatch {
 public:
  ScopedPatch() : prev_(ops::Active()), patched_(prev_) {
    real_ = prev_->ops();
    ops::SetActive(&patched_);
  }
  ~ScopedPatch() { ops::SetActive(prev_); }
  BackendOps& ops() { return patched_.mutable_ops(); }
  static const BackendOps& real() { return real_; }

 private:
  Backend* prev_;
  PatchedBackend patched_;
  static inline BackendOps real_{};
};

// Options for tests about something other than the square GEMM: a small one
// keeps them fast on a busy machine.
HealthOptions Small() {
  HealthOptions o;
  o.gemm_n = 64;
  return o;
}

// C[0] off by 1% plus 0.1: wrong in a way only a comparison can see.
void WrongGemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  ScopedPatch::real().gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  C[0] = C[0] * 1.01f + 0.1f;
}

// Each call XORs a different pattern into the low 8 mantissa bits of C[0]:
// accurate to ~1e-5 but never the same bits twice.
int g_flaky_calls = 0;
void FlakyGemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  ScopedPatch::real().gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  uint32_t u;
  std::memcpy(&u, &C[0], 4);
  u ^= static_cast<uint32_t>(++g_flaky_calls & 0xff);
  std::memcpy(&C[0], &u, 4);
}

void NanAttention(const AttentionParams& p) {
  ScopedPatch::real().attention_fwd(p);
  p.out[0] = std::numeric_limits<float>::quiet_NaN();
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ------------------------------------------------------ self-test ----

TEST(HealthCheck, PassesOnThisMachineWithDefaults) {
  ASSERT_EQ(ops::GetGemmPrecision(), ops::GemmPrecision::kFp32);
  HealthReport r = RunHealthCheck(HealthOptions{});
  EXPECT_TRUE(r.ok) << r.failure;
  EXPECT_EQ(r.failure, "");
  EXPECT_EQ(r.gemm_precision, "fp32");
  EXPECT_EQ(r.gemm_tolerance, kGemmToleranceFp32);
  EXPECT_EQ(r.attention_tolerance, kAttentionTolerance);
  EXPECT_EQ(r.gemm_n, 192);
  EXPECT_EQ(r.backend, ops::Active()->name());
  EXPECT_TRUE(std::isfinite(r.gemm_max_rel_err));
  EXPECT_TRUE(std::isfinite(r.attention_max_rel_err));
  EXPECT_LT(r.gemm_max_rel_err, kGemmToleranceFp32);
  EXPECT_LT(r.attention_max_rel_err, kAttentionTolerance);
  // Not exact: the comparison saw real rounding (the errors are not vacuous).
  EXPECT_GT(r.gemm_max_rel_err, 0);
  EXPECT_GT(r.attention_max_rel_err, 0);
  EXPECT_GT(r.gemm_gflops, 0);
  EXPECT_GT(r.seconds, 0);
  std::printf("health: %s\n", r.ToJson().dump().c_str());

  nlohmann::json j = r.ToJson();
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["gemm_precision"], "fp32");
  EXPECT_DOUBLE_EQ(j["gemm_gflops"].get<double>(), r.gemm_gflops);
  EXPECT_DOUBLE_EQ(j["gemm_max_rel_err"].get<double>(), r.gemm_max_rel_err);
}

TEST(HealthCheck, PassesAtOtherSizesIncludingSampledRows) {
  for (int64_t n : {1, 17, 260}) {  // 260 > 256: the reference checks 64 sampled rows
    HealthOptions o;
    o.gemm_n = n;
    o.seed = 42;
    HealthReport r = RunHealthCheck(o);
    EXPECT_TRUE(r.ok) << "n=" << n << ": " << r.failure;
    EXPECT_EQ(r.gemm_n, n);
    EXPECT_GT(r.gemm_gflops, 0) << n;
  }
}

TEST(HealthCheck, Bf16PrecisionUsesItsOwnTolerance) {
  if (!ops::HasBf16Gemm()) GTEST_SKIP() << "backend has no gemm_bf16";
  ops::SetGemmPrecision(ops::GemmPrecision::kBf16);
  HealthReport r = RunHealthCheck(HealthOptions{});
  ops::SetGemmPrecision(ops::GemmPrecision::kFp32);
  EXPECT_TRUE(r.ok) << r.failure;
  EXPECT_EQ(r.gemm_precision, "bf16");
  EXPECT_EQ(r.gemm_tolerance, kGemmToleranceBf16);
  EXPECT_LT(r.gemm_max_rel_err, kGemmToleranceBf16);
  // bf16 errors are far above the fp32 tolerance: an fp32 run that silently
  // computed in bf16 would fail.
  EXPECT_GT(r.gemm_max_rel_err, kGemmToleranceFp32);
  std::printf("health bf16: gemm_max_rel_err %.2e\n", r.gemm_max_rel_err);
}

TEST(HealthCheck, InjectedFailureFailsWithThatReason) {
  HealthOptions o = Small();
  o.inject_failure = "drill: simulated ECC error on device 3";
  HealthReport r = RunHealthCheck(o);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failure, "drill: simulated ECC error on device 3");
  EXPECT_GT(r.gemm_gflops, 0);  // the checks still ran
  EXPECT_EQ(r.ToJson()["ok"], false);
  EXPECT_EQ(r.ToJson()["failure"], o.inject_failure);
}

TEST(HealthCheck, AbsurdThroughputFloorFailsNamingBothFigures) {
  HealthOptions o;
  o.min_gflops = 1e12;
  HealthReport r = RunHealthCheck(o);
  EXPECT_FALSE(r.ok);
  EXPECT_GT(r.gemm_gflops, 0);
  char measured[32];
  std::snprintf(measured, sizeof measured, "%.3g GFLOP/s", r.gemm_gflops);
  EXPECT_TRUE(Contains(r.failure, "throughput: ")) << r.failure;
  EXPECT_TRUE(Contains(r.failure, measured)) << r.failure << " vs " << measured;
  EXPECT_TRUE(Contains(r.failure, "required 1e+12 GFLOP/s")) << r.failure;
  EXPECT_TRUE(Contains(r.failure, "n=192")) << r.failure;
  // The correctness checks passed; only the floor failed.
  EXPECT_LT(r.gemm_max_rel_err, kGemmToleranceFp32);

  o = Small();
  o.min_gflops = 1e-6;  // any working device clears this
  EXPECT_TRUE(RunHealthCheck(o).ok);
}

TEST(HealthCheck, BadOptionsFailWithTheirValue) {
  HealthOptions o;
  o.gemm_n = 0;
  HealthReport r = RunHealthCheck(o);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failure, "options: gemm_n=0 is outside [1, 8192]");
  o.gemm_n = 192;
  o.min_gflops = -1;
  r = RunHealthCheck(o);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.failure, "options: min_gflops=-1 must be a finite number >= 0");
}

TEST(HealthCheck, WrongGemmCannotPass) {
  ScopedPatch patch;
  patch.ops().gemm = WrongGemm;
  HealthReport r = RunHealthCheck(Small());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.failure, "gemm: max relative error ")) << r.failure;
  EXPECT_TRUE(Contains(r.failure, "> 1e-04 (fp32, NN M=37 N=53 K=71)")) << r.failure;
  EXPECT_GT(r.gemm_max_rel_err, kGemmToleranceFp32);
  EXPECT_LT(r.attention_max_rel_err, kAttentionTolerance);  // attention itself was fine
}

TEST(HealthCheck, NonDeterministicGemmCannotPass) {
  ScopedPatch patch;
  patch.ops().gemm = FlakyGemm;
  HealthReport r = RunHealthCheck(Small());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.failure, "gemm: repeat run differs from the first at C[0,0]")) << r.failure;
  EXPECT_LT(r.gemm_max_rel_err, kGemmToleranceFp32);  // each result alone was accurate
}

TEST(HealthCheck, NanFromAttentionCannotPass) {
  ScopedPatch patch;
  patch.ops().attention_fwd = NanAttention;
  HealthReport r = RunHealthCheck(Small());
  EXPECT_FALSE(r.ok);
  EXPECT_TRUE(Contains(r.failure, "attention: non-finite out nan at index 0 of ")) << r.failure;
  EXPECT_TRUE(Contains(r.failure, "(B=2 Tq=19 Tk=19 H=4 Hkv=2 D=16)")) << r.failure;
  EXPECT_TRUE(std::isinf(r.attention_max_rel_err));
  EXPECT_TRUE(r.ToJson()["attention_max_rel_err"].is_null());
}

// ---------------------------------------------------- comparisons ----

TEST(HealthCompare, PerturbedGemmResultIsCaught) {
  const int64_t M = 29, N = 41, K = 67;
  Rng rng(5);
  std::vector<float> A(M * K), B(N * K), C(M * N, 0.f);
  for (auto& x : A) x = rng.Normal();
  for (auto& x : B) x = rng.Normal();
  ops::Gemm(Trans::kNo, Trans::kYes, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, C.data(), N);
  std::vector<double> want;
  ReferenceGemm(false, true, M, N, K, 1.0, A.data(), K, B.data(), K, 0.0, C.data(), N, {}, &want);
  ASSERT_EQ(want.size(), C.size());
  const double ok_err = MaxRelError(C.data(), want.data(), M * N);
  EXPECT_LT(ok_err, kGemmToleranceFp32);

  double scale = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  // One element off by 1e-3 of the largest magnitude: caught, with its size.
  std::vector<float> bad = C;
  bad[M * N / 2] += static_cast<float>(1e-3 * scale);
  const double err = MaxRelError(bad.data(), want.data(), M * N);
  EXPECT_NEAR(err, 1e-3, 1e-5);
  EXPECT_GT(err, kGemmToleranceFp32);
  // A swapped pair of rows (a wrong index, every value plausible): caught.
  bad = C;
  for (int64_t j = 0; j < N; ++j) std::swap(bad[j], bad[N + j]);
  EXPECT_GT(MaxRelError(bad.data(), want.data(), M * N), 0.1);
  // NaN can never pass.
  bad = C;
  bad[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isinf(MaxRelError(bad.data(), want.data(), M * N)));

  // The row subset of the reference matches the full one.
  std::vector<double> rows;
  ReferenceGemm(false, true, M, N, K, 1.0, A.data(), K, B.data(), K, 0.0, C.data(), N, {3, 28}, &rows);
  ASSERT_EQ(rows.size(), static_cast<size_t>(2 * N));
  EXPECT_EQ(rows[0], want[3 * N]);
  EXPECT_EQ(rows[N + 5], want[28 * N + 5]);
}

TEST(HealthCompare, ReferenceGemmHonoursTransAlphaBeta) {
  // A = [[1,2],[3,4]], B = [[5,6],[7,8]], C0 = [[1,1],[1,1]].
  const float A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8}, C0[] = {1, 1, 1, 1};
  std::vector<double> w;
  ReferenceGemm(false, false, 2, 2, 2, 1.0, A, 2, B, 2, 0.0, C0, 2, {}, &w);
  EXPECT_EQ(w, (std::vector<double>{19, 22, 43, 50}));
  ReferenceGemm(true, false, 2, 2, 2, 1.0, A, 2, B, 2, 0.0, C0, 2, {}, &w);  // A^T B
  EXPECT_EQ(w, (std::vector<double>{26, 30, 38, 44}));
  ReferenceGemm(false, true, 2, 2, 2, 1.0, A, 2, B, 2, 0.0, C0, 2, {}, &w);  // A B^T
  EXPECT_EQ(w, (std::vector<double>{17, 23, 39, 53}));
  ReferenceGemm(true, true, 2, 2, 2, 2.0, A, 2, B, 2, -1.0, C0, 2, {}, &w);  // 2 A^T B^T - C0
  EXPECT_EQ(w, (std::vector<double>{45, 61, 67, 91}));
}

TEST(HealthCompare, MaxRelErrorOfZeroReference) {
  const float got[] = {0.f, 1e-3f};
  const double want[] = {0.0, 0.0};
  EXPECT_DOUBLE_EQ(MaxRelError(got, want, 2), static_cast<double>(1e-3f));
  EXPECT_EQ(MaxRelError(got, want, 1), 0.0);
}

TEST(HealthFinite, FindsNanAndInfAtTheirIndex) {
  std::vector<float> x(10, 1.f);
  int64_t bad = 99;
  EXPECT_TRUE(AllFinite(x.data(), 10, &bad));
  EXPECT_EQ(bad, -1);
  EXPECT_TRUE(AllFinite(x.data(), 10));
  EXPECT_TRUE(AllFinite(nullptr, 0, &bad));

  x[6] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(AllFinite(x.data(), 10, &bad));
  EXPECT_EQ(bad, 6);
  EXPECT_TRUE(AllFinite(x.data(), 6, &bad));  // n is honoured

  x[3] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(AllFinite(x.data(), 10, &bad));
  EXPECT_EQ(bad, 3);  // the first bad one
  x[3] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(AllFinite(x.data(), 10, &bad));
  EXPECT_EQ(bad, 3);
  EXPECT_FALSE(AllFinite(x.data(), 10));

  x[3] = std::numeric_limits<float>::max();  // large but finite
  x[6] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(AllFinite(x.data(), 10, &bad));
}

// ------------------------------------------------------ stragglers ----

// Eight steady step times with median exactly `s`.
std::vector<double> Steady(double s) {
  return {0.9 * s, 1.1 * s, s, s, 0.95 * s, 1.05 * s, s, s};
}

TEST(Straggler, ReportsARankAtTwiceTheMedian) {
  std::vector<std::vector<double>> t = {Steady(1.0), Steady(1.0), Steady(2.0), Steady(1.0)};
  std::vector<Straggler> s = FindStragglers(t);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 2);
  EXPECT_DOUBLE_EQ(s[0].rank_median_s, 2.0);
  EXPECT_DOUBLE_EQ(s[0].all_median_s, 1.0);
  EXPECT_DOUBLE_EQ(s[0].ratio, 2.0);
}

TEST(Straggler, DoesNotReportOnePointFourTimes) {
  std::vector<std::vector<double>> t = {Steady(1.0), Steady(1.4), Steady(1.0), Steady(1.0)};
  EXPECT_TRUE(FindStragglers(t).empty());
  // ... but a stricter factor does.
  std::vector<Straggler> s = FindStragglers(t, 1.3);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_NEAR(s[0].ratio, 1.4, 1e-12);
}

TEST(Straggler, TooFewSamplesAreNotJudged) {
  std::vector<double> short_slow(7, 3.0);  // one short of the window
  std::vector<std::vector<double>> t = {Steady(1.0), short_slow, Steady(1.0), Steady(1.0)};
  EXPECT_TRUE(FindStragglers(t).empty());
  // Nor counted in the median over ranks: ranks 0 and 3 judged at 1.0, 2 at 2.0.
  t = {Steady(1.0), {}, Steady(2.0), Steady(1.0)};
  std::vector<Straggler> s = FindStragglers(t);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 2);
  EXPECT_DOUBLE_EQ(s[0].all_median_s, 1.0);
  // Nobody judged: nothing reported.
  EXPECT_TRUE(FindStragglers({{1.0, 1.0}, {5.0, 5.0}}).empty());
  EXPECT_TRUE(FindStragglers({}).empty());
  EXPECT_TRUE(FindStragglers(t, 1.5, 0).empty());
  // A shorter window judges them.
  s = FindStragglers({{1.0, 1.0}, {5.0, 5.0}, {1.0, 1.0}}, 1.5, 2);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1);
  EXPECT_DOUBLE_EQ(s[0].ratio, 5.0);
}

TEST(Straggler, WindowUsesTheNewestSamples) {
  // Rank 1 was slow for 12 steps long ago and has recovered: not reported.
  std::vector<double> recovered(12, 5.0);
  for (double x : Steady(1.0)) recovered.push_back(x);
  std::vector<std::vector<double>> t = {Steady(1.0), recovered, Steady(1.0), Steady(1.0)};
  EXPECT_TRUE(FindStragglers(t).empty());
  // Rank 3 was fast and has just become slow: reported.
  std::vector<double> degraded(12, 1.0);
  for (double x : Steady(2.5)) degraded.push_back(x);
  t = {Steady(1.0), recovered, Steady(1.0), degraded};
  std::vector<Straggler> s = FindStragglers(t);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 3);
  EXPECT_DOUBLE_EQ(s[0].ratio, 2.5);
}

TEST(Straggler, NonFiniteTimesAreNotJudgedAndResultIsInRankOrder) {
  std::vector<double> broken = Steady(9.0);
  broken[7] = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::vector<double>> t = {Steady(3.0), Steady(1.0), broken, Steady(1.0), Steady(1.0),
                                        Steady(2.0)};
  std::vector<Straggler> s = FindStragglers(t);
  ASSERT_EQ(s.size(), 2u);  // median over ranks {3,1,1,1,2} = 1
  EXPECT_EQ(s[0].rank, 0);
  EXPECT_DOUBLE_EQ(s[0].ratio, 3.0);
  EXPECT_EQ(s[1].rank, 5);
  EXPECT_DOUBLE_EQ(s[1].ratio, 2.0);
}

}  // namespace
}  // namespace myriad::supervise
