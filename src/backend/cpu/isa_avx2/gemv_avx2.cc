// Decode GEMVs for AVX2 + FMA + F16C: y[out] = W[out, in] x[in]. Same shape
// as the AVX-512 version (4 rows per step, one accumulator per row); tails
// along `in` run scalar.
#include <immintrin.h>

#include "backend/cpu/impl/common.h"
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

inline __m256 LoadW(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 LoadW(const uint16_t* w) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
}
inline float ScalarW(float w) { return w; }
inline float ScalarW(uint16_t w) { return HalfToFloatF(w); }

template <int ROWS, typename T>
inline void RowsDot(const T* W, const float* x, int64_t in, int64_t o0, float* y) {
  __m256 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
  const T* w = W + o0 * in;
  int64_t i = 0;
  for (; i + 8 <= in; i += 8) {
    __m256 xv = _mm256_loadu_ps(x + i);
    for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_fmadd_ps(LoadW(w + r * in + i), xv, acc[r]);
  }
  for (int r = 0; r < ROWS; ++r) {
    float s = Hsum(acc[r]);
    for (int64_t k = i; k < in; ++k) s += ScalarW(w[r * in + k]) * x[k];
    y[o0 + r] = s;
  }
}

template <typename T>
void Gemv(const T* W, const float* x, int64_t out, int64_t in, float* y) {
  const int64_t groups = (out + 3) / 4;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = g * 4;
    if (o + 4 <= out) {
      RowsDot<4>(W, x, in, o, y);
    } else {
      for (int64_t r = o; r < out; ++r) RowsDot<1>(W, x, in, r, y);
    }
  }
}

// int8 x int8 -> int32 through vpmaddwd on sign-extended 16-bit lanes
// (vpmaddubsw would saturate for 255 x 127 pairs). xq is zero-padded to 16.
template <int ROWS>
inline void RowsDotQ8(const int8_t* Wq, const int16_t* xq, int64_t in, int64_t o0, const float* scale,
                      float sx, float* y) {
  __m256i acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_si256();
  const int8_t* w = Wq + o0 * in;
  int64_t i = 0;
  for (; i + 16 <= in; i += 16) {
    __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + i));
    for (int r = 0; r < ROWS; ++r) {
      __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * in + i)));
      acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(wv, xv));
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    int32_t dot = HsumI(acc[r]);
    for (int64_t k = i; k < in; ++k) dot += (int32_t)w[r * in + k] * xq[k];
    y[o0 + r] = (float)((double)dot * scale[o0 + r] * sx);
  }
}

}  // namespace

void GemvF32Avx2(const float* W, const float* x, int64_t out, int64_t in, float* y) { Gemv(W, x, out, in, y); }
void GemvF16Avx2(const uint16_t* W, const float* x, int64_t out, int64_t in, float* y) {
  Gemv(W, x, out, in, y);
}

void GemvQ8Avx2(const int8_t* Wq, const float* scale, const float* x, int64_t out, int64_t in, float* y) {
  Scratch<int8_t> q8(in);
  Scratch<int16_t> xq(in);
  const float sx = QuantizeXQ8(x, in, q8.p);
  for (int64_t i = 0; i < in; ++i) xq[i] = q8[i];
  const int64_t groups = (out + 3) / 4;
#pragma omp parallel for schedule(static) if (out * in >= kMinParallelGemvElems)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t o = g * 4;
    if (o + 4 <= out) {
      RowsDotQ8<4>(Wq, xq.p, in, o, scale, sx, y);
    } else {
      for (int64_t r = o; r < out; ++r) RowsDotQ8<1>(Wq, xq.p, in, r, scale, sx, y);
    }
  }
}

}  // namespace myriad::cpu
