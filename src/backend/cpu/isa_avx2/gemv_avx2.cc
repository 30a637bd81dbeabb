// Decode GEMVs for AVX2 + FMA + F16C: y[rows, out] = x[rows, in] W[out, in]^T.
// Same shape as the AVX-512 version (4 output rows per step, one accumulator
// per output row and row of x, tiles of 4 x 2 for several rows of x); tails
// along `in` run scalar. int8 with one row of x: RowDotQ8 (vpmaddubsw).
// Above kSkinnyRows: impl/gemv.h.
#include <immintrin.h>

#include "backend/cpu/impl/common.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/impl/gemv.h"
#include "backend/cpu/kernels.h"

namespace myriad::cpu {
namespace {

inline float Hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline int32_t HsumI(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Weight rows are read once, from DRAM. With one row of x the tile's rows
// ahead are prefetched into L2 (PrefetchAhead, impl/gemv.h); with several,
// each row's stream is prefetched this far ahead (a few lines; the hardware
// prefetchers alone keep too few lines in flight for rows read 16 bytes at
// a time).
constexpr int64_t kPrefetchBytes = 1024;
template <typename T>
inline void Prefetch(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

inline __m256 LoadW(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 LoadW(const uint16_t* w) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}
inline float ScalarW(float w) { return w; }
inline float ScalarW(uint16_t w) { return HalfToFloatF(w); }

// y[m, o] for output rows [o0, o0 + R) and rows of x [m0, m0 + MT): each
// weight vector is loaded (and converted) once for the MT rows of x; every
// (o, m) is reduced in the same order whatever R and MT (batch-invariant).
template <int R, int MT, typename T>
inline void TileDot(const T* W, const float* x, int64_t in, int64_t out, int64_t o0, int64_t m0, float* y) {
  __m256 acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_setzero_ps();
  const T* w = W + o0 * in;
  const float* xr = x + m0 * in;
  int64_t i = 0;
  // One 64-byte line of each weight row per iteration, prefetched (the same
  // sums in the same order as 8 at a time).
  constexpr int U = 64 / (8 * sizeof(T));
  for (int64_t step = 0; i + 8 * U <= in; i += 8 * U, ++step) {
    if constexpr (MT == 1) {
      PrefetchAhead<R>(w, R * in * int64_t{sizeof(T)}, step);
    } else {
      for (int r = 0; r < R; ++r) Prefetch(w + r * in + i);
    }
    for (int u = 0; u < U; ++u) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = LoadW(w + r * in + i + 8 * u);
      for (int m = 0; m < MT; ++m) {
        const __m256 xv = _mm256_loadu_ps(xr + m * in + i + 8 * u);
        for (int r = 0; r < R; ++r) acc[r][m] = _mm256_fmadd_ps(wv[r], xv, acc[r][m]);
      }
    }
  }
  for (; i + 8 <= in; i += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadW(w + r * in + i);
    for (int m = 0; m < MT; ++m) {
      const __m256 xv = _mm256_loadu_ps(xr + m * in + i);
      for (int r = 0; r < R; ++r) acc[r][m] = _mm256_fmadd_ps(wv[r], xv, acc[r][m]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      float s = Hsum(acc[r][m]);
      for (int64_t k = i; k < in; ++k) s += ScalarW(w[r * in + k]) * xr[m * in + k];
      y[(m0 + m) * out + o0 + r] = s;
    }
}

// rows > 1: tiles of 4 output rows x 2 rows of x (8 accumulators, 4 weight
// vectors: 13 of the 16 ymm registers).
constexpr int kTileO = 4, kTileM = 2;

template <int R, typename T>
inline void AllRows(const T* W, const float* x, int64_t rows, int64_t in, int64_t out, int64_t o0, float* y) {
  int64_t m = 0;
  for (; m + kTileM <= rows; m += kTileM) TileDot<R, kTileM>(W, x, in, out, o0, m, y);
  if (m < rows) TileDot<R, 1>(W, x, in, out, o0, m, y);
}

template <typename T>
void Gemv(const T* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
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

// int8 x int8 -> int32 through vpmaddwd on sign-extended 16-bit lanes
// (vpmaddubsw would saturate for 255 x 127 pairs). xq [rows, in] in int16.
template <int R, int MT>
inline void TileDotQ8(const int8_t* Wq, const int16_t* xq, int64_t in, int64_t out, int64_t o0, int64_t m0,
                      const float* scale, const float* sx, float* y) {
  __m256i acc[R][MT];
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = _mm256_setzero_si256();
  const int8_t* w = Wq + o0 * in;
  const int16_t* xr = xq + m0 * in;
  int64_t i = 0;
  for (; i + 64 <= in; i += 64) {  // a line of each row per iteration, prefetched
    for (int r = 0; r < R; ++r) Prefetch(w + r * in + i);
    for (int u = 0; u < 64; u += 16) {
      __m256i wv[R];
      for (int r = 0; r < R; ++r)
        wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * in + i + u)));
      for (int m = 0; m < MT; ++m) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + m * in + i + u));
        for (int r = 0; r < R; ++r) acc[r][m] = _mm256_add_epi32(acc[r][m], _mm256_madd_epi16(wv[r], xv));
      }
    }
  }
  for (; i + 16 <= in; i += 16) {
    __m256i wv[R];
    for (int r = 0; r < R; ++r)
      wv[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * in + i)));
    for (int m = 0; m < MT; ++m) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + m * in + i));
      for (int r = 0; r < R; ++r) acc[r][m] = _mm256_add_epi32(acc[r][m], _mm256_madd_epi16(wv[r], xv));
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < R; ++r) {
      int32_t dot = HsumI(acc[r][m]);
      for (int64_t k = i; k < in; ++k) dot += (int32_t)w[r * in + k] * xr[m * in + k];
      y[(m0 + m) * out + o0 + r] = (float)((double)dot * scale[o0 + r] * sx[m0 + m]);
    }
}

// One row of x: 32 weights per step through vpmaddubsw, which needs an
// unsigned operand and saturates its pair sums at 16 bits. With |xq| as the
// unsigned side and sign(Wq, xq) as the signed one, each product is
// |xq|*sign(xq)*Wq = xq*Wq and a pair sum is at most 2*127*127 < 2^15, so no
// lane saturates (Wq is in [-127, 127]: BackendOps::gemv_q8); vpmaddwd by 1
// widens the pairs to int32. The same exact integer sums as TileDotQ8 in
// two thirds of the instructions (the single-row decode is then bound by
// the weight read, not by the widening).
template <int R>
inline void RowDotQ8(const int8_t* Wq, const int8_t* xq, const int8_t* xabs, int64_t in, int64_t o0,
                     const float* scale, float sx, float* y) {
  __m256i acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* w = Wq + o0 * in;
  int64_t i = 0;
  for (int64_t step = 0; i + 64 <= in; i += 64, ++step) {
    PrefetchAhead<R>(w, R * in, step);
    for (int u = 0; u < 64; u += 32) {
      const __m256i ax = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xabs + i + u));
      const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i + u));
      for (int r = 0; r < R; ++r) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * in + i + u));
        acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xs)), ones));
      }
    }
  }
  for (; i + 32 <= in; i += 32) {
    const __m256i ax = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xabs + i));
    const __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i));
    for (int r = 0; r < R; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * in + i));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv, xs)), ones));
    }
  }
  for (int r = 0; r < R; ++r) {
    int32_t dot = HsumI(acc[r]);
    for (int64_t k = i; k < in; ++k) dot += (int32_t)w[r * in + k] * xq[k];
    y[o0 + r] = (float)((double)dot * scale[o0 + r] * sx);
  }
}

template <int R>
inline void AllRowsQ8(const int8_t* Wq, const int16_t* xq, int64_t rows, int64_t in, int64_t out, int64_t o0,
                      const float* scale, const float* sx, float* y) {
  int64_t m = 0;
  for (; m + kTileM <= rows; m += kTileM) TileDotQ8<R, kTileM>(Wq, xq, in, out, o0, m, scale, sx, y);
  if (m < rows) TileDotQ8<R, 1>(Wq, xq, in, out, o0, m, scale, sx, y);
}

}  // namespace

void GemvF32Avx2(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  if (rows > kSkinnyRows) {
    BlasSgemm(Trans::kNo, Trans::kYes, rows, out, in, 1.f, x, in, W, in, 0.f, y, out);
    return;
  }
  Gemv(W, x, rows, out, in, y);
}
void GemvF16Avx2(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  if (rows > kSkinnyRows) return ConvertGemmF16(W, x, rows, out, in, y);
  Gemv(W, x, rows, out, in, y);
}

void GemvQ8Avx2(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out, int64_t in,
                float* y) {
  if (rows > kSkinnyRows) return ConvertGemmQ8(Wq, scale, x, rows, out, in, y);
  Scratch<int8_t> q8(in);
  if (rows == 1) {
    Scratch<int8_t> qabs(in);
    const float sx1 = QuantizeXQ8(x, in, q8.p);
    for (int64_t i = 0; i < in; ++i) qabs[i] = (int8_t)(q8[i] < 0 ? -q8[i] : q8[i]);
    const int64_t groups = (out + kTileO - 1) / kTileO;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t o = g * kTileO;
      if (o + kTileO <= out) {
        RowDotQ8<kTileO>(Wq, q8.p, qabs.p, in, o, scale, sx1, y);
      } else {
        for (int64_t r = o; r < out; ++r) RowDotQ8<1>(Wq, q8.p, qabs.p, in, r, scale, sx1, y);
      }
    }
    return;
  }
  Scratch<int16_t> xq(rows * in);
  Scratch<float> sx(rows);
  for (int64_t m = 0; m < rows; ++m) {
    sx[m] = QuantizeXQ8(x + m * in, in, q8.p);
    for (int64_t i = 0; i < in; ++i) xq[m * in + i] = q8[i];
  }
  const int64_t groups = (out + kTileO - 1) / kTileO;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = g * kTileO;
    if (o + kTileO <= out) {
      AllRowsQ8<kTileO>(Wq, xq.p, rows, in, out, o, scale, sx.p, y);
    } else {
      for (int64_t r = o; r < out; ++r) AllRowsQ8<1>(Wq, xq.p, rows, in, out, r, scale, sx.p, y);
    }
  }
}

}  // namespace myriad::cpu
