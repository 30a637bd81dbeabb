#include "backend/cpu/blas.h"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <vector>

#include "backend/cpu/cpu_info.h"
#include "core/log.h"

namespace myriad {
namespace {

// CBLAS enums (values fixed by the CBLAS standard).
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                         int, float, float*, int);
using CharFn = char* (*)();
using SetThreadsFn = void (*)(int);

struct Blas {
  BlasInfo info;
  SgemmFn sgemm = nullptr;
  SetThreadsFn set_threads = nullptr;
};

bool IsSlowCore(std::string core) {
  for (auto& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const char* kSlow[] = {"prescott", "generic", "core2",   "penryn",  "dunnington",
                                "nehalem",  "atom",    "katmai",  "coppermine", "northwood",
                                "banias",   "opteron", "barcelona", "unknown", "athlon"};
  if (core.empty()) return true;
  for (const char* s : kSlow)
    if (core.find(s) != std::string::npos) return true;
  return false;
}

Blas Load() {
  Blas b;
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env == nullptr || *env == '\0') {
    const CpuInfo& cpu = GetCpuInfo();
    const char* pick = nullptr;
    if (cpu.has_avx512_kernels()) pick = "SkylakeX";
    else if (cpu.avx2 && cpu.fma) pick = "Haswell";
    if (pick) {
      setenv("OPENBLAS_CORETYPE", pick, /*overwrite=*/0);
      b.info.coretype_set_by_us = true;
    }
  }
  // A value the user (or the environment) set is respected: some
  // environments set one because other kernels misbehave on their CPUs.
  // When it leaves speed unused, a warning below says so.
  env = std::getenv("OPENBLAS_CORETYPE");
  b.info.coretype_env = env ? env : "";

  static const char* kCandidates[] = {
      "/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
      "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
      "libopenblas.so.0",
      "libblas.so.3",
  };
  for (const char* path : kCandidates) {
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    auto sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
    if (!sgemm) {
      dlclose(h);
      continue;
    }
    b.sgemm = sgemm;
    b.set_threads = reinterpret_cast<SetThreadsFn>(dlsym(h, "openblas_set_num_threads"));
    b.info.library = path;
    if (auto f = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_corename"))) b.info.corename = f();
    if (auto f = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_config"))) b.info.config = f();
    break;
  }
  if (!b.sgemm) {
    b.info.library = "builtin";
    b.info.fast_kernel = false;
    b.info.note = "no BLAS library could be loaded (hint: apt-get install libopenblas0-openmp); "
                  "using Myriad's own blocked GEMM";
    LOG_WARN("[blas] %s", b.info.note.c_str());
    return b;
  }
  if (b.info.corename.empty()) {
    // A reference BLAS (libblas.so.3 without OpenBLAS) cannot tell; assume slow.
    b.info.fast_kernel = false;
    b.info.note = "BLAS at " + b.info.library + " does not report its kernel; assume slow";
  } else {
    b.info.fast_kernel = !IsSlowCore(b.info.corename);
    if (!b.info.fast_kernel)
      b.info.note = "OpenBLAS runs its generic '" + b.info.corename + "' kernel";
  }
  // A user-set coretype is respected, but say so when it leaves speed unused.
  if (b.info.fast_kernel && !b.info.coretype_set_by_us && GetCpuInfo().has_avx512_kernels()) {
    std::string core = b.info.corename;
    for (auto& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (core.find("haswell") != std::string::npos || core.find("zen") != std::string::npos ||
        core.find("sandybridge") != std::string::npos) {
      b.info.note = "OPENBLAS_CORETYPE='" + b.info.coretype_env + "' selects the AVX2 kernel '" +
                    b.info.corename + "' on a CPU with AVX-512, where SkylakeX runs about 2x faster "
                    "(hint: unset OPENBLAS_CORETYPE or set it to SkylakeX)";
      LOG_WARN("[blas] %s", b.info.note.c_str());
    }
  }
  if (!b.info.fast_kernel) {
    LOG_WARN("[blas] ***** SLOW GEMM: %s (library %s, OPENBLAS_CORETYPE='%s'). GEMM will run "
             "3-10x below this CPU's peak (hint: set OPENBLAS_CORETYPE=SkylakeX or Haswell "
             "before anything loads OpenBLAS) *****",
             b.info.note.c_str(), b.info.library.c_str(), b.info.coretype_env.c_str());
  } else {
    LOG_DEBUG("[blas] %s kernel=%s", b.info.library.c_str(), b.info.corename.c_str());
  }
  return b;
}

Blas& GetBlas() {
  static Blas blas = Load();
  return blas;
}

}  // namespace

const BlasInfo& GetBlasInfo() { return GetBlas().info; }

void BlasSgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  Blas& b = GetBlas();
  constexpr int64_t kIntMax = 0x7fffffff;
  bool fits = M <= kIntMax && N <= kIntMax && K <= kIntMax && lda <= kIntMax && ldb <= kIntMax &&
              ldc <= kIntMax;
  if (!b.sgemm || !fits || K <= 0) {
    BuiltinSgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  b.sgemm(kCblasRowMajor, ta == Trans::kYes ? kCblasTrans : kCblasNoTrans,
          tb == Trans::kYes ? kCblasTrans : kCblasNoTrans, static_cast<int>(M),
          static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
          static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

// Builtin GEMM: C = beta*C first, then per block of rows of C (one OpenMP
// task each, so rows never race and the summation order is fixed), K and N
// blocked to keep the B panel in L2. op(A)[i,k] and op(B)[k,j] are read
// through the transpose flags; B is packed per (k, j) block into a
// contiguous [kb, nb] panel so the inner loop is a unit-stride axpy.
void BuiltinSgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                  float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  constexpr int64_t kMb = 32, kNb = 512, kKb = 256;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    float* c = C + i * ldc;
    if (beta == 0.f) std::fill(c, c + N, 0.f);
    else if (beta != 1.f)
      for (int64_t j = 0; j < N; ++j) c[j] *= beta;
  }
  if (K <= 0 || alpha == 0.f) return;
  int64_t row_blocks = (M + kMb - 1) / kMb;
#pragma omp parallel
  {
    std::vector<float> panel(kKb * kNb);
#pragma omp for schedule(static)
    for (int64_t rb = 0; rb < row_blocks; ++rb) {
      int64_t i0 = rb * kMb, i1 = std::min(M, i0 + kMb);
      for (int64_t j0 = 0; j0 < N; j0 += kNb) {
        int64_t nb = std::min(kNb, N - j0);
        for (int64_t k0 = 0; k0 < K; k0 += kKb) {
          int64_t kb = std::min(kKb, K - k0);
          for (int64_t k = 0; k < kb; ++k)
            for (int64_t j = 0; j < nb; ++j)
              panel[k * nb + j] =
                  tb == Trans::kNo ? B[(k0 + k) * ldb + j0 + j] : B[(j0 + j) * ldb + k0 + k];
          for (int64_t i = i0; i < i1; ++i) {
            float* c = C + i * ldc + j0;
            for (int64_t k = 0; k < kb; ++k) {
              float a = alpha * (ta == Trans::kNo ? A[i * lda + k0 + k] : A[(k0 + k) * lda + i]);
              const float* p = panel.data() + k * nb;
              for (int64_t j = 0; j < nb; ++j) c[j] += a * p[j];
            }
          }
        }
      }
    }
  }
}

}  // namespace myriad
