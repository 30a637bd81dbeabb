// Decode GEMVs for AVX-512: y[out] = W[out, in] x[in]. Memory-bound: the
// weights stream once from DRAM, x stays in L1. kRows rows per step share
// each x load; one accumulator per row (the FMA chains of the rows hide the
// latency, and the row streams keep enough loads in flight); tails along
// `in` use masked loads.
// GCC 12 flags _mm512_undefined_*() inside the reduce intrinsics (false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include "backend/cpu/impl/common.h"
#include "backend/cpu/impl/gemv.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {
namespace {

constexpr int kRows = 8;  // rows per step: 8 independent load streams and FMA chains

inline __mmask16 TailMask16(int64_t n) { return (__mmask16)((1u << n) - 1); }

// Loads 16 weights at w[i] as floats (f32 or f16), masked.
inline __m512 LoadW(const float* w, int64_t i, __mmask16 m) { return _mm512_maskz_loadu_ps(m, w + i); }
inline __m512 LoadW(const uint16_t* w, int64_t i, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i));
}
inline __m512 LoadW(const float* w, int64_t i) { return _mm512_loadu_ps(w + i); }
inline __m512 LoadW(const uint16_t* w, int64_t i) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i)));
}

// y[o] for rows [o0, o0 + ROWS).
template <int ROWS, typename T>
inline void RowsDot(const T* W, const float* x, int64_t in, int64_t o0, float* y) {
  __m512 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_ps();
  const T* w = W + o0 * in;
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    __m512 xv = _mm512_loadu_ps(x + i);
    for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_fmadd_ps(LoadW(w + r * in, i), xv, acc[r]);
  }
  if (i < in) {
    __mmask16 m = TailMask16(in - i);
    __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
    for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_fmadd_ps(LoadW(w + r * in, i, m), xv, acc[r]);
  }
  for (int r = 0; r < ROWS; ++r) y[o0 + r] = _mm512_reduce_add_ps(acc[r]);
}

template <typename T>
void Gemv(const T* W, const float* x, int64_t out, int64_t in, float* y) {
  const int64_t groups = (out + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = g * kRows;
    if (o + kRows <= out) {
      RowsDot<kRows>(W, x, in, o, y);
    } else {
      for (int64_t r = o; r < out; ++r) RowsDot<1>(W, x, in, r, y);
    }
  }
}

// int32 dot of rows [o0, o0+ROWS) of Wq with the padded xq (64-byte steps).
// vpdpbusd needs an unsigned operand: u = Wq ^ 0x80 = Wq + 128, so
// sum u*xq = sum Wq*xq + 128 * sum xq; the caller subtracts the second term.
template <int ROWS>
inline void RowsDotQ8(const int8_t* Wq, const int8_t* xq, int64_t in, int64_t o0, int32_t corr,
                      const float* scale, float sx, float* y) {
  __m512i acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const int8_t* w = Wq + o0 * in;
  int64_t i = 0;
  for (; i + 64 <= in; i += 64) {
    __m512i xv = _mm512_loadu_si512(xq + i);
    for (int r = 0; r < ROWS; ++r) {
      __m512i u = _mm512_xor_si512(_mm512_loadu_si512(w + r * in + i), flip);
      acc[r] = _mm512_dpbusd_epi32(acc[r], u, xv);
    }
  }
  if (i < in) {
    __mmask64 m = (__mmask64)((~0ull) >> (64 - (in - i)));
    __m512i xv = _mm512_loadu_si512(xq + i);  // xq is zero-padded to a multiple of 64
    for (int r = 0; r < ROWS; ++r) {
      __m512i u = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w + r * in + i), flip);
      acc[r] = _mm512_dpbusd_epi32(acc[r], u, xv);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    int32_t dot = _mm512_reduce_add_epi32(acc[r]) - corr;
    y[o0 + r] = (float)((double)dot * scale[o0 + r] * sx);
  }
}

}  // namespace

void GemvF32Avx512(const float* W, const float* x, int64_t out, int64_t in, float* y) { Gemv(W, x, out, in, y); }
void GemvF16Avx512(const uint16_t* W, const float* x, int64_t out, int64_t in, float* y) {
  Gemv(W, x, out, in, y);
}

void GemvQ8Avx512Vnni(const int8_t* Wq, const float* scale, const float* x, int64_t out, int64_t in,
                      float* y) {
  const int64_t padded = (in + 63) / 64 * 64;
  Scratch<int8_t> xq(padded);
  const float sx = QuantizeXQ8(x, in, xq.p);
  int32_t sum = 0;
  for (int64_t i = 0; i < in; ++i) sum += xq[i];
  for (int64_t i = in; i < padded; ++i) xq[i] = 0;
  const int32_t corr = 128 * sum;
  const int64_t groups = (out + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = g * kRows;
    if (o + kRows <= out) {
      RowsDotQ8<kRows>(Wq, xq.p, in, o, corr, scale, sx, y);
    } else {
      for (int64_t r = o; r < out; ++r) RowsDotQ8<1>(Wq, xq.p, in, r, corr, scale, sx, y);
    }
  }
}

}  // namespace myriad::cpu
