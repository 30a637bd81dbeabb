// Per-ISA op tables of the CPU backend (internal to src/backend/cpu).
// Each Fill*Ops lives in a TU compiled for its ISA; call it only when
// GetCpuInfo() reports that ISA (cpu_backend.cc does the check).
#pragma once

#include "backend/backend.h"

namespace myriad::cpu {

void FillGenericOps(BackendOps* ops);  // baseline x86-64 (SSE2), no -m flags
void FillAvx2Ops(BackendOps* ops);     // needs AVX2 + FMA + F16C
void FillAvx512Ops(BackendOps* ops);   // needs AVX-512 F/BW/VL/DQ (VNNI optional)
// Device memory slots on host memory (host_memory.cc); every table uses them.
void FillHostMemoryOps(BackendOps* ops);

}  // namespace myriad::cpu

namespace myriad::cpu {

// Decode GEMVs with intrinsics (BackendOps::gemv_* contracts), for 1 to
// kSkinnyRows rows of x reading the weights once. Output rows are split
// statically over OpenMP threads, 4-8 per step; each (row of x, output row)
// is reduced in a fixed order, so results depend neither on the thread count
// nor on the other rows of the batch.
void GemvF32Avx512(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
void GemvF16Avx512(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
// Needs AVX512-VNNI (vpdpbusd).
void GemvQ8Avx512Vnni(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out,
                      int64_t in, float* y);
// BackendOps::gemm_bf16 (gemm_bf16.cc); needs AVX512-BF16.
void GemmBf16Avx512(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc);
void GemvF32Avx2(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
void GemvF16Avx2(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y);
// vpmaddwd on sign-extended int8 (no VNNI needed).
void GemvQ8Avx2(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out, int64_t in,
                float* y);

}  // namespace myriad::cpu
