// The BLAS loader and CPU probe: what `myriad doctor` prints must be sane,
// and when Myriad picks OPENBLAS_CORETYPE itself, OpenBLAS must really run
// that kernel (the "OpenBLAS trap" of BENCHMARKS.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

#include "backend/cpu/blas.h"
#include "backend/cpu/cpu_info.h"

namespace myriad {
namespace {

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

TEST(CpuInfo, ReportsThisMachine) {
  const CpuInfo& cpu = GetCpuInfo();
  EXPECT_GE(cpu.logical_cores, 1);
  EXPECT_GT(cpu.mem_total_bytes, 0u);
  EXPECT_LE(cpu.mem_available_bytes, cpu.mem_total_bytes);
  EXPECT_FALSE(cpu.vendor.empty());
  EXPECT_FALSE(cpu.model_name.empty());
  // Implications that hold on every real x86 CPU.
  if (cpu.avx512bw || cpu.avx512vl || cpu.avx512dq) {
    EXPECT_TRUE(cpu.avx512f);
  }
  if (cpu.avx512f) {
    EXPECT_TRUE(cpu.avx2);
  }
  if (cpu.has_avx512_kernels()) {
    EXPECT_NE(cpu.FeatureString().find("avx512f"), std::string::npos);
  }
}

TEST(Blas, LoadsAndReportsItsKernel) {
  const BlasInfo& info = GetBlasInfo();
  ASSERT_FALSE(info.library.empty());
  if (info.library == "builtin") {
    EXPECT_FALSE(info.fast_kernel);
    EXPECT_FALSE(info.note.empty());
    return;
  }
  if (info.coretype_set_by_us) {
    // We chose the kernel from cpuid: OpenBLAS must have taken it.
    EXPECT_EQ(Lower(info.corename), Lower(info.coretype_env)) << info.config;
    EXPECT_TRUE(info.fast_kernel);
  }
  if (!info.fast_kernel) {
    EXPECT_FALSE(info.note.empty());
  }
}

TEST(Blas, BuiltinGemmMatchesBlasPath) {
  const int64_t M = 37, N = 29, K = 67;
  std::vector<float> A(M * K), B(K * N), C1(M * N, 1.f), C2(M * N, 1.f);
  for (size_t i = 0; i < A.size(); ++i) A[i] = (float)((i * 37) % 11) - 5.f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = (float)((i * 13) % 7) - 3.f;
  BlasSgemm(Trans::kNo, Trans::kNo, M, N, K, 1.f, A.data(), K, B.data(), N, 0.5f, C1.data(), N);
  BuiltinSgemm(Trans::kNo, Trans::kNo, M, N, K, 1.f, A.data(), K, B.data(), N, 0.5f, C2.data(), N);
  // Small integers: both paths are exact.
  for (size_t i = 0; i < C1.size(); ++i) ASSERT_EQ(C1[i], C2[i]) << i;
}

}  // namespace
}  // namespace myriad
