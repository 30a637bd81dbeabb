// Decode GEMVs y[rows, out] = x[rows, in] W[out, in]^T (BackendOps::gemv_*):
// the portable kernels, and the large-rows path every ISA shares.
//
// Portable: output rows split statically over threads, four per iteration
// so x is read once per four rows, `omp simd` reductions (fixed order per
// build, so deterministic); several rows of x loop over the GEMV (the scalar
// backend is the reference build, not a fast one).
//
// Above kSkinnyRows (prefill), fp32 goes to BlasSgemm, and fp16 / int8
// weights are converted to fp32 a block of output rows at a time into a
// scratch tile that stays in cache (ConvertGemm), then BlasSgemm multiplies
// the block: reduced-precision prefill runs at fp32 GEMM speed instead of
// one GEMV per row.
#pragma once

#include <immintrin.h>

#include "backend/backend.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/impl/common.h"

namespace myriad::cpu {
namespace {

// Batch-1 decode GEMVs (the ISA kernels with one row of x), while a tile of
// R contiguous weight rows (tile_bytes) streams in: the bytes at least
// kAheadBytes and at least one tile ahead are prefetched into L2 in address
// order, R lines per step of `step` (one 64-byte line of each row per
// step). Consecutive tiles' windows are adjacent, so DRAM sees one
// sequential stream rather than R short ones that the hardware prefetchers
// ramp up on too late (a row of 768 int8 weights is 12 lines).
// On an AMD EPYC Zen 4 (2 threads, GPT-2-shaped decode matrices from DRAM,
// 32 MB L3, 33 GB/s read), AVX-512 kernels against no software prefetch:
// fp32 24 -> 31-32 GB/s, fp16 16 -> 26-28 (the per-row L1 prefetch 512 B ahead
// that this replaced: 14), int8 14 -> 28; one tile ahead rather than 16 KB
// left the int8 head (50257 x 768, 6 KB tiles) at 19-22 GB/s against 25.
// bench/README.md has the decode figures.
constexpr int64_t kAheadBytes = 16384;
template <int R>
inline void PrefetchAhead(const void* tile, int64_t tile_bytes, int64_t step) {
  const int64_t ahead = tile_bytes > kAheadBytes ? tile_bytes : kAheadBytes;
  const char* p = static_cast<const char*>(tile) + ahead + step * R * 64;
  for (int r = 0; r < R; ++r) _mm_prefetch(p + r * 64, _MM_HINT_T1);
}

// Floats of the converted weight tile of ConvertGemm (2 MiB: in L2/L3, and
// wide enough that BlasSgemm runs near its peak).
constexpr int64_t kConvertTileFloats = int64_t{1} << 19;

// y[rows, out] = x[rows, in] @ Wf^T, where deq(o, dst) writes row o of W in
// fp32 (dst [in]). Blocks of output rows are converted, then multiplied.
template <typename Deq>
inline void ConvertGemm(const float* x, int64_t rows, int64_t out, int64_t in, float* y, Deq deq) {
  int64_t ob = kConvertTileFloats / in / 64 * 64;
  ob = MinI(out, MaxI(ob, 64));
  Scratch<float> wf(ob * in);
  for (int64_t o0 = 0; o0 < out; o0 += ob) {
    const int64_t n = MinI(ob, out - o0);
#pragma omp parallel for schedule(static) if (n * in >= kMinParallelGemvElems)
    for (int64_t o = 0; o < n; ++o) deq(o0 + o, wf.p + o * in);
    BlasSgemm(Trans::kNo, Trans::kYes, rows, n, in, 1.f, x, in, wf.p, in, 0.f, y + o0, out);
  }
}

inline void ConvertGemmF16(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in,
                           float* y) {
  ConvertGemm(x, rows, out, in, y, [&](int64_t o, float* dst) {
    const uint16_t* w = W + o * in;
    int64_t i = 0;
#if defined(__F16C__)  // the AVX2 and AVX-512 builds
    for (; i + 8 <= in; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i))));
#endif
    for (; i < in; ++i) dst[i] = HalfToFloatF(w[i]);
  });
}

inline void ConvertGemmQ8(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out,
                          int64_t in, float* y) {
  ConvertGemm(x, rows, out, in, y, [&](int64_t o, float* dst) {
    const int8_t* w = Wq + o * in;
    const float s = scale[o];
#pragma omp simd
    for (int64_t i = 0; i < in; ++i) dst[i] = (float)w[i] * s;
  });
}

inline void GemvF32Row(const float* W, const float* x, int64_t out, int64_t in, float* y) {
  int64_t groups = (out + 3) / 4;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    int64_t o = g * 4;
    if (o + 4 <= out) {
      const float *w0 = W + o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
      float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
      for (int64_t i = 0; i < in; ++i) {
        a0 += w0[i] * x[i];
        a1 += w1[i] * x[i];
        a2 += w2[i] * x[i];
        a3 += w3[i] * x[i];
      }
      y[o] = a0, y[o + 1] = a1, y[o + 2] = a2, y[o + 3] = a3;
    } else {
      for (; o < out; ++o) {
        const float* w = W + o * in;
        float a = 0;
#pragma omp simd reduction(+ : a)
        for (int64_t i = 0; i < in; ++i) a += w[i] * x[i];
        y[o] = a;
      }
    }
  }
}

inline void GemvF32K(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  if (rows > kSkinnyRows) {
    BlasSgemm(Trans::kNo, Trans::kYes, rows, out, in, 1.f, x, in, W, in, 0.f, y, out);
    return;
  }
  for (int64_t m = 0; m < rows; ++m) GemvF32Row(W, x + m * in, out, in, y + m * out);
}

inline void GemvF16K(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  if (rows > kSkinnyRows) return ConvertGemmF16(W, x, rows, out, in, y);
  for (int64_t m = 0; m < rows; ++m) {
    const float* xr = x + m * in;
    float* yr = y + m * out;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
    for (int64_t o = 0; o < out; ++o) {
      const uint16_t* w = W + o * in;
      float a = 0;
#pragma omp simd reduction(+ : a)
      for (int64_t i = 0; i < in; ++i) a += HalfToFloatF(w[i]) * xr[i];
      yr[o] = a;
    }
  }
}

// Quantises x [in] to int8 with one absmax scale, the contract shared by all
// q8 kernels and the reference: xq = nearbyint(x * (127/absmax)) (round half
// to even), returned scale sx = absmax/127 (0 for an all-zero x).
inline float QuantizeXQ8(const float* x, int64_t in, int8_t* xq) {
  float amax = 0.f;
#pragma omp simd reduction(max : amax)
  for (int64_t i = 0; i < in; ++i) amax = MaxF(amax, std::fabs(x[i]));
  float inv = amax > 0 ? 127.f / amax : 0.f;
  for (int64_t i = 0; i < in; ++i) xq[i] = (int8_t)std::nearbyint(x[i] * inv);
  return amax / 127.f;
}

inline void GemvQ8K(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out,
                    int64_t in, float* y) {
  if (rows > kSkinnyRows) return ConvertGemmQ8(Wq, scale, x, rows, out, in, y);
  Scratch<int8_t> xq(in);
  for (int64_t m = 0; m < rows; ++m) {
    float sx = QuantizeXQ8(x + m * in, in, xq.p);
    const int8_t* xs = xq.p;
    float* yr = y + m * out;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
    for (int64_t o = 0; o < out; ++o) {
      const int8_t* w = Wq + o * in;
      int32_t a = 0;
#pragma omp simd reduction(+ : a)
      for (int64_t i = 0; i < in; ++i) a += (int32_t)w[i] * (int32_t)xs[i];
      yr[o] = (float)((double)a * scale[o] * sx);
    }
  }
}

}  // namespace
}  // namespace myriad::cpu
