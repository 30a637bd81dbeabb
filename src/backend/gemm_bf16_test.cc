// gemm_bf16 (AVX512-BF16, fp32 accumulation) against the cpu/ref oracle,
// which rounds the inputs to bf16 the same way and accumulates in double.
// Skips where the slot is null (no AVX512-BF16). Also a disabled benchmark
// against the fp32 gemm (OpenBLAS) on the training shapes:
//   myriad_backend_test --gtest_also_run_disabled_tests --gtest_filter='GemmBf16*'
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/rng.h"

namespace myriad {
namespace {

using Vec = std::vector<float>;

Vec Randn(size_t n, Rng& rng) {
  Vec v(n);
  for (auto& x : v) x = rng.Normal();
  return v;
}

float Bf16(float x) {  // RNE, for the tolerance only
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

const BackendOps* Bf16Ops() {
  Backend* be = CpuBackend("avx512");
  return be && be->supports("gemm_bf16") ? &be->ops() : nullptr;
}

struct Case {
  int64_t M, N, K;
  Trans ta, tb;
  float alpha, beta;
};

std::string Name(const Case& c) {
  return "M" + std::to_string(c.M) + " N" + std::to_string(c.N) + " K" + std::to_string(c.K) +
         " ta" + std::to_string((int)c.ta) + " tb" + std::to_string((int)c.tb) + " alpha" +
         std::to_string(c.alpha) + " beta" + std::to_string(c.beta);
}

// Runs one case through `ops` and the oracle; the error bound is 1e-5 of the
// sum of |alpha a b| plus |beta c| (fp32 accumulation vs double).
void Check(const BackendOps& ops, const Case& c, Rng& rng) {
  const int64_t lda = (c.ta == Trans::kNo ? c.K : c.M) + 3;
  const int64_t ldb = (c.tb == Trans::kNo ? c.N : c.K) + 1, ldc = c.N + 2;
  const int64_t arows = c.ta == Trans::kNo ? c.M : c.K, brows = c.tb == Trans::kNo ? c.K : c.N;
  Vec A = Randn(arows * lda, rng), B = Randn(brows * ldb, rng), C0 = Randn(c.M * ldc, rng);
  Vec C = C0, Cr = C0;
  if (c.beta == 0.f)  // beta = 0 must not read C
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) C[i * ldc + j] = std::numeric_limits<float>::quiet_NaN();
  ops.gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(),
                ldc);
  RefOps().gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta,
                     Cr.data(), ldc);
  size_t bad = 0;
  double worst = 0;
  int64_t wi = 0, wj = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        float a = c.ta == Trans::kNo ? A[i * lda + k] : A[k * lda + i];
        float b = c.tb == Trans::kNo ? B[k * ldb + j] : B[j * ldb + k];
        mag += std::fabs((double)Bf16(a) * Bf16(b));
      }
      mag = std::fabs(c.alpha) * mag + std::fabs(c.beta * C0[i * ldc + j]);
      double err = std::fabs((double)C[i * ldc + j] - Cr[i * ldc + j]);
      if (!(err <= 1e-5 * mag + 1e-30)) {
        ++bad;
        if (!(err <= worst)) worst = err, wi = i, wj = j;
      }
    }
  EXPECT_EQ(bad, 0u) << Name(c) << ": worst at [" << wi << "," << wj << "] got "
                     << C[wi * ldc + wj] << " want " << Cr[wi * ldc + wj];
  // Padding beyond N in each row of C is untouched.
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]) << Name(c);
}

TEST(GemmBf16, MatchesRefOnRaggedShapes) {
  const BackendOps* ops = Bf16Ops();
  if (!ops) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  Rng rng(11);
  struct S { int64_t M, N, K; };
  for (S s : {S{1, 1, 1}, S{1, 37, 33}, S{5, 1, 64}, S{5, 37, 33}, S{67, 24, 64}, S{33, 67, 5},
              S{130, 17, 129}, S{13, 33, 2}, S{25, 48, 31}})
    for (Trans ta : {Trans::kNo, Trans::kYes})
      for (Trans tb : {Trans::kNo, Trans::kYes})
        for (float beta : {0.f, 1.f, 0.5f})
          for (float alpha : {1.f, -0.75f}) Check(*ops, {s.M, s.N, s.K, ta, tb, alpha, beta}, rng);
}

// Shapes that span several KC, MC and NC blocks.
TEST(GemmBf16, MatchesRefAcrossCacheBlocks) {
  const BackendOps* ops = Bf16Ops();
  if (!ops) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  Rng rng(12);
  for (Trans ta : {Trans::kNo, Trans::kYes})
    for (Trans tb : {Trans::kNo, Trans::kYes}) {
      Check(*ops, {203, 70, 1131, ta, tb, 1.f, 1.f}, rng);
      Check(*ops, {29, 3203, 517, ta, tb, 0.5f, 0.f}, rng);
    }
}

TEST(GemmBf16, NullOnlyWithoutAvx512Bf16) {
  Backend* be = CpuBackend("avx512");
  if (!be) GTEST_SKIP() << "no AVX-512";
  EXPECT_TRUE(be->supports("gemm") && RefOps().gemm_bf16 != nullptr);
  for (const char* isa : {"scalar", "avx2"}) {
    if (Backend* s = CpuBackend(isa)) {
      EXPECT_FALSE(s->supports("gemm_bf16")) << isa;
    }
  }
}

// Same bits with 1 and 2 threads, and when called inside a parallel region.
TEST(GemmBf16, DeterministicAcrossThreadCounts) {
  const BackendOps* ops = Bf16Ops();
  if (!ops) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  Rng rng(13);
  const int64_t M = 300, N = 200, K = 1100;
  Vec A = Randn(M * K, rng), B = Randn(N * K, rng);
  auto run = [&](int threads) {
    Vec C(M * N);
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    ops->gemm_bf16(Trans::kNo, Trans::kYes, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f,
                   C.data(), N);
    omp_set_num_threads(saved);
    return C;
  };
  Vec c1 = run(1), c2 = run(2), c3 = run(3);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(c1.data(), c3.data(), c1.size() * 4), 0);
  Vec cp[2] = {Vec(M * N), Vec(M * N)};
#pragma omp parallel num_threads(2)
  {
    int t = omp_get_thread_num();
    ops->gemm_bf16(Trans::kNo, Trans::kYes, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f,
                   cp[t].data(), N);
  }
  EXPECT_EQ(std::memcmp(c1.data(), cp[0].data(), c1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(c1.data(), cp[1].data(), c1.size() * 4), 0);
}

// GFLOP/s of gemm_bf16 vs the fp32 gemm (OpenBLAS) on the training shapes,
// wall clock, best of several repeats, all OpenMP threads.
TEST(GemmBf16, DISABLED_BenchVsSgemm) {
  Backend* be = CpuBackend("avx512");
  if (!be || !be->supports("gemm_bf16")) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const BackendOps& o = be->ops();
  struct S { int64_t M, N, K; Trans ta, tb; float beta; const char* tag; };
  const Trans n = Trans::kNo, y = Trans::kYes;
  const S shapes[] = {{2048, 512, 256, n, y, 0.f, "NT"},   {2048, 256, 512, n, n, 0.f, "NN"},
                      {512, 256, 2048, y, n, 1.f, "TN"},   {2048, 2048, 256, n, y, 0.f, "NT"},
                      {2048, 256, 1024, n, n, 0.f, "NN"},  {1024, 50257, 768, n, y, 0.f, "NT"},
                      {1024, 768, 3072, n, n, 0.f, "NN"},  {768, 3072, 1024, y, n, 1.f, "TN"}};
  std::printf("threads %d\n%-22s %10s %10s %6s\n", omp_get_max_threads(), "shape (M,N,K)",
              "sgemm", "bf16", "ratio");
  for (const S& s : shapes) {
    Rng rng(5);
    const int64_t lda = s.ta == n ? s.K : s.M, ldb = s.tb == n ? s.N : s.K;
    Vec A = Randn(s.M * s.K, rng), B = Randn(s.K * s.N, rng), C(s.M * s.N, 0.f);
    const double flops = 2.0 * s.M * s.N * s.K;
    // Many repeats for the small shapes: on a shared machine the best of
    // many is the one that ran undisturbed.
    const int reps = std::max(5, (int)std::min(60.0, 1e11 / flops));
    auto time = [&](auto fn) {
      fn();
      double best = 1e30;
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return flops / best * 1e-9;
    };
    double g32 = time([&] {
      o.gemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, s.beta, C.data(), s.N);
    });
    double g16 = time([&] {
      o.gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, s.beta, C.data(),
                  s.N);
    });
    char shape[64];
    std::snprintf(shape, sizeof shape, "(%ld,%ld,%ld) %s", (long)s.M, (long)s.N, (long)s.K, s.tag);
    std::printf("%-22s %10.1f %10.1f %6.2f\n", shape, g32, g16, g16 / g32);
    EXPECT_TRUE(std::isfinite(C[0]));
  }
}

}  // namespace
}  // namespace myriad
