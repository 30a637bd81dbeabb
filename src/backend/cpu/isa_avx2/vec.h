// 8-lane fp32 vector traits for the templated kernels of impl/ (AVX2+FMA).
// Include only from TUs compiled with the isa_avx2 (or isa_avx512) flags.
#pragma once

#include <immintrin.h>

namespace myriad::cpu {
namespace {

struct VecAvx2 {
  static constexpr int W = 8;
  using R = __m256;
  static R zero() { return _mm256_setzero_ps(); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R x) { _mm256_storeu_ps(p, x); }
  static R set1(float a) { return _mm256_set1_ps(a); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static float hsum(R x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float hmax(R x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static R keep_first(R x, int n, float fill) {
    if (n >= W) return x;
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx));
    return _mm256_blendv_ps(_mm256_set1_ps(fill), x, keep);
  }
  static R keep_range(R x, int lo, int hi) {
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i ge_lo = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32(lo - 1));
    __m256i lt_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx);
    return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_and_si256(ge_lo, lt_hi)));
  }
  // Same algorithm as VecAvx512::exp; 2^n through the exponent bits.
  static R exp(R x) {
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
    R xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
    R n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    R f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), xc);
    f = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), f);
    R p = _mm256_set1_ps(1.f / 5040.f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 720.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 120.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 24.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f / 6.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    R y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(tiny, y);
  }
};

}  // namespace
}  // namespace myriad::cpu
