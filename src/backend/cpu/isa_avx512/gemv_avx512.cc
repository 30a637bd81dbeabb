// Decode GEMVs for AVX-512: y[rows, out] = x[rows, in] W[out, in]^T.
// Memory-bound: the weights stream once from DRAM, x stays in L1/L2. One row
// of x: kRows output rows per step share each x load; one accumulator per
// output row (the FMA chains hide the latency, and the row streams keep
// enough loads in flight). Several rows of x (a batch's decode tokens):
// tiles of kTileO output rows x kTileM rows of x, each weight vector loaded
// once for the tile; the kTileO weight rows stay in L1 while the tiles of x
// go by. Tails along `in` use masked loads. Above kSkinnyRows: impl/gemv.h.
// GCC 12 flags _mm512_undefined_*() inside the reduce intrinsics (false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include "backend/cpu/impl/common.h"
#include "backend/cpu/blas.h"
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

// y[m, o] for output rows [o0, o0 + R) and rows of x [m0, m0 + MT): each
// weight vector is loaded (and converted) once for the MT rows of x. Every
// (o, m) has its own accumulator, reduced in the same order whatever R and
// MT, so a row's result does not depend on the batch around it.
template <int R, int MT, typename T>
inline void TileDot(const T* W, const float* x, int64_t in, int64_t out, int64_t o0, int64_t m0, float* y) {
  __m512 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = _mm512_setzero_ps();
  const T* w = W + o0 * in;
  const float* xr = x + m0 * in;
  int64_t i = 0;
  // One 64-byte line of each weight row per iteration (the same sums in the
  // same order as 16 at a time). One row of x (batch-1 decode) prefetches
  // ahead (PrefetchAhead, impl/gemv.h).
  constexpr int U = 64 / (16 * sizeof(T));
  for (int64_t step = 0; i + 16 * U <= in; i += 16 * U, ++step) {
    if constexpr (MT == 1) PrefetchAhead<R>(w, R * in * int64_t{sizeof(T)}, step);
    for (int u = 0; u < U; ++u) {
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = LoadW(w + r * in, i + 16 * u);
      for (int m = 0; m < MT; ++m) {
        const __m512 xv = _mm512_loadu_ps(xr + m * in + i + 16 * u);
        for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
      }
    }
  }
  for (; i + 16 <= in; i += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW(w + r * in, i);
    for (int m = 0; m < MT; ++m) {
      const __m512 xv = _mm512_loadu_ps(xr + m * in + i);
      for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  if (i < in) {
    const __mmask16 k = TailMask16(in - i);
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW(w + r * in, i, k);
    for (int m = 0; m < MT; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(k, xr + m * in + i);
      for (int r = 0; r < R; ++r) acc[r][m] = _mm512_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) y[(m0 + m) * out + o0 + r] = _mm512_reduce_add_ps(acc[r][m]);
}

constexpr int kTileO = 4, kTileM = 4;  // rows > 1: 16 accumulators, 4 weight vectors

// Every row of x against output rows [o0, o0 + R).
template <int R, typename T>
inline void AllRows(const T* W, const float* x, int64_t rows, int64_t in, int64_t out, int64_t o0, float* y) {
  int64_t m = 0;
  for (; m + kTileM <= rows; m += kTileM) TileDot<R, kTileM>(W, x, in, out, o0, m, y);
  switch (rows - m) {
    case 3: TileDot<R, 3>(W, x, in, out, o0, m, y); break;
    case 2: TileDot<R, 2>(W, x, in, out, o0, m, y); break;
    case 1: TileDot<R, 1>(W, x, in, out, o0, m, y); break;
    default: break;
  }
}

template <typename T>
void Gemv(const T* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  if (rows == 1) {
    const int64_t groups = (out + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t o = g * kRows;
      if (o + kRows <= out) {
        TileDot<kRows, 1>(W, x, in, out, o, 0, y);
      } else {
        for (int64_t r = o; r < out; ++r) TileDot<1, 1>(W, x, in, out, r, 0, y);
      }
    }
    return;
  }
  const int64_t groups = (out + kTileO - 1) / kTileO;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = g * kTileO;
    if (o + kTileO <= out) {
      AllRows<kTileO>(W, x, rows, in, out, o, y);
    } else {
      for (int64_t r = o; r < out; ++r) AllRows<1>(W, x, rows, in, out, r, y);
    }
  }
}

// int32 dots of output rows [o0, o0+R) of Wq with rows [m0, m0+MT) of the
// quantised x (each row zero-padded to `ld`, a multiple of 64).
// vpdpbusd needs an unsigned operand: u = Wq ^ 0x80 = Wq + 128, so
// sum u*xq = sum Wq*xq + 128 * sum xq; corr[m] holds the second term.
template <int R, int MT>
inline void TileDotQ8(const int8_t* Wq, const int8_t* xq, int64_t ld, int64_t in, int64_t out, int64_t o0,
                      int64_t m0, const int32_t* corr, const float* scale, const float* sx, float* y) {
  __m512i acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = _mm512_setzero_si512();
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  const int8_t* w = Wq + o0 * in;
  const int8_t* xr = xq + m0 * ld;
  int64_t i = 0;
  for (int64_t step = 0; i + 64 <= in; i += 64, ++step) {
    if constexpr (MT == 1) PrefetchAhead<R>(w, R * in, step);
    __m512i u[R];
    for (int r = 0; r < R; ++r) u[r] = _mm512_xor_si512(_mm512_loadu_si512(w + r * in + i), flip);
    for (int m = 0; m < MT; ++m) {
      const __m512i xv = _mm512_loadu_si512(xr + m * ld + i);
      for (int r = 0; r < R; ++r) acc[r][m] = _mm512_dpbusd_epi32(acc[r][m], u[r], xv);
    }
  }
  if (i < in) {
    const __mmask64 k = (__mmask64)((~0ull) >> (64 - (in - i)));
    __m512i u[R];
    for (int r = 0; r < R; ++r) u[r] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, w + r * in + i), flip);
    for (int m = 0; m < MT; ++m) {
      const __m512i xv = _mm512_loadu_si512(xr + m * ld + i);  // zero past `in`
      for (int r = 0; r < R; ++r) acc[r][m] = _mm512_dpbusd_epi32(acc[r][m], u[r], xv);
    }
  }
  if constexpr (R == 8 && MT == 1) {
    // The 8 dots at once: the same integers, then the same double products
    // lane by lane as the scalar form below, so bit-identical to it. With
    // the scalar form the batch-1 GEMV over 768-wide rows took about 10%
    // longer (Zen 4, 50257 x 768 from DRAM: 22.6 -> 24.3-25.2 GB/s, as fast
    // as the same loop with no scaling at all).
    __m256i h[8];
    for (int r = 0; r < 8; ++r)
      h[r] = _mm256_add_epi32(_mm512_castsi512_si256(acc[r][0]), _mm512_extracti64x4_epi64(acc[r][0], 1));
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(h[0], h[1]), _mm256_hadd_epi32(h[2], h[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(h[4], h[5]), _mm256_hadd_epi32(h[6], h[7]));
    // a's 128-bit halves hold partial sums of rows 0-3 (b: 4-7) in order.
    const __m256i dots = _mm256_sub_epi32(
        _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31)),
        _mm256_set1_epi32(corr[m0]));
    const __m512d prod = _mm512_mul_pd(_mm512_mul_pd(_mm512_cvtepi32_pd(dots), _mm512_cvtps_pd(_mm256_loadu_ps(scale + o0))),
                                       _mm512_set1_pd((double)sx[m0]));
    _mm256_storeu_ps(y + m0 * out + o0, _mm512_cvtpd_ps(prod));
  } else {
    for (int m = 0; m < MT; ++m)
      for (int r = 0; r < R; ++r) {
        const int32_t dot = _mm512_reduce_add_epi32(acc[r][m]) - corr[m0 + m];
        y[(m0 + m) * out + o0 + r] = (float)((double)dot * scale[o0 + r] * sx[m0 + m]);
      }
  }
}

template <int R>
inline void AllRowsQ8(const int8_t* Wq, const int8_t* xq, int64_t ld, int64_t rows, int64_t in, int64_t out,
                      int64_t o0, const int32_t* corr, const float* scale, const float* sx, float* y) {
  int64_t m = 0;
  for (; m + kTileM <= rows; m += kTileM) TileDotQ8<R, kTileM>(Wq, xq, ld, in, out, o0, m, corr, scale, sx, y);
  switch (rows - m) {
    case 3: TileDotQ8<R, 3>(Wq, xq, ld, in, out, o0, m, corr, scale, sx, y); break;
    case 2: TileDotQ8<R, 2>(Wq, xq, ld, in, out, o0, m, corr, scale, sx, y); break;
    case 1: TileDotQ8<R, 1>(Wq, xq, ld, in, out, o0, m, corr, scale, sx, y); break;
    default: break;
  }
}

}  // namespace

void GemvF32Avx512(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  if (rows > kSkinnyRows) {
    BlasSgemm(Trans::kNo, Trans::kYes, rows, out, in, 1.f, x, in, W, in, 0.f, y, out);
    return;
  }
  Gemv(W, x, rows, out, in, y);
}
void GemvF16Avx512(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  if (rows > kSkinnyRows) return ConvertGemmF16(W, x, rows, out, in, y);
  Gemv(W, x, rows, out, in, y);
}

void GemvQ8Avx512Vnni(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out,
                      int64_t in, float* y) {
  if (rows > kSkinnyRows) return ConvertGemmQ8(Wq, scale, x, rows, out, in, y);
  const int64_t ld = (in + 63) / 64 * 64;
  Scratch<int8_t> xq(rows * ld);
  Scratch<int32_t> corr(rows);
  Scratch<float> sx(rows);
  for (int64_t m = 0; m < rows; ++m) {
    int8_t* q = xq.p + m * ld;
    sx[m] = QuantizeXQ8(x + m * in, in, q);
    int32_t sum = 0;
    for (int64_t i = 0; i < in; ++i) sum += q[i];
    for (int64_t i = in; i < ld; ++i) q[i] = 0;
    corr[m] = 128 * sum;
  }
  if (rows == 1) {
    const int64_t groups = (out + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t o = g * kRows;
      if (o + kRows <= out) {
        TileDotQ8<kRows, 1>(Wq, xq.p, ld, in, out, o, 0, corr.p, scale, sx.p, y);
      } else {
        for (int64_t r = o; r < out; ++r) TileDotQ8<1, 1>(Wq, xq.p, ld, in, out, r, 0, corr.p, scale, sx.p, y);
      }
    }
    return;
  }
  const int64_t groups = (out + kTileO - 1) / kTileO;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = g * kTileO;
    if (o + kTileO <= out) {
      AllRowsQ8<kTileO>(Wq, xq.p, ld, rows, in, out, o, corr.p, scale, sx.p, y);
    } else {
      for (int64_t r = o; r < out; ++r) AllRowsQ8<1>(Wq, xq.p, ld, rows, in, out, r, corr.p, scale, sx.p, y);
    }
  }
}

}  // namespace myriad::cpu
