// Dense SGEMM through Debian's OpenBLAS, loaded at run time with dlopen().
//
// Why dlopen: Debian's OpenBLAS 0.3.21 does not recognise recent CPUs and
// silently falls back to its generic SSE3 ("Prescott") kernels, 5-10x slower.
// OpenBLAS reads OPENBLAS_CORETYPE once, when it initialises, so we set it
// (if the user has not) from cpuid *before* loading the library:
// AVX512F+BW+VL+DQ -> "SkylakeX", AVX2+FMA -> "Haswell".
// Search order: openblas-openmp (shares our OpenMP pool), openblas-pthread,
// libopenblas.so.0, libblas.so.3. Without any, an own blocked GEMM runs.
//
// Thread-safety: the library is loaded on the first call of any function
// here (guarded by a function-local static); afterwards all are thread-safe
// to call. Caveat: if another library already linked OpenBLAS into the
// process, it initialised before us; GetBlasInfo().fast_kernel tells.
#pragma once

#include <cstdint>
#include <string>

#include "backend/backend.h"

namespace myriad {

struct BlasInfo {
  std::string library;       // path that was loaded, or "builtin" (own GEMM)
  std::string corename;      // openblas_get_corename(), e.g. "SkylakeX"; "" if n/a
  std::string config;        // openblas_get_config()
  std::string coretype_env;  // OPENBLAS_CORETYPE as seen at load ("" if unset)
  bool coretype_set_by_us = false;  // we chose OPENBLAS_CORETYPE from cpuid
  bool fast_kernel = false;  // false for prescott/generic/core2/unknown or builtin
  std::string note;          // human-readable remark (why slow, why builtin)
};

// Loads the library on first use; never fails (falls back to builtin GEMM).
const BlasInfo& GetBlasInfo();

// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major (the BackendOps::gemm
// contract). Deterministic for a fixed thread count.
void BlasSgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
               float* C, int64_t ldc);

// The fallback GEMM (cache-blocked, OpenMP), exposed for tests and benchmarks.
void BuiltinSgemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                  float* C, int64_t ldc);

}  // namespace myriad
