// 16-lane fp32 vector traits for the templated kernels of impl/ (AVX-512F).
// Include only from TUs compiled with the isa_avx512 flags. Anonymous
// namespace: see impl/common.h (no cross-ISA COMDAT sharing).
#pragma once

#include <immintrin.h>

namespace myriad::cpu {
namespace {

struct VecAvx512 {
  static constexpr int W = 16;
  using R = __m512;
  static R zero() { return _mm512_setzero_ps(); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R x) { _mm512_storeu_ps(p, x); }
  static R set1(float a) { return _mm512_set1_ps(a); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static float hsum(R x) { return _mm512_reduce_add_ps(x); }
  static float hmax(R x) { return _mm512_reduce_max_ps(x); }
  // Lanes with index >= n replaced by fill (n <= 0: all, n >= W: none).
  static R keep_first(R x, int n, float fill) {
    if (n >= W) return x;
    __mmask16 m = n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    return _mm512_mask_blend_ps(m, _mm512_set1_ps(fill), x);
  }
  // Lanes with index outside [lo, hi) set to 0.
  static R keep_range(R x, int lo, int hi) {
    unsigned up = hi >= W ? 0xffffu : hi <= 0 ? 0u : (1u << hi) - 1;
    unsigned down = lo <= 0 ? 0u : lo >= W ? 0xffffu : (1u << lo) - 1;
    return _mm512_maskz_mov_ps((__mmask16)(up & ~down), x);
  }
  // exp(x): Cody-Waite reduction, degree-7 Taylor, 2^n by vscalefps;
  // about 2 ulp; 0 for x < -87.3 (and -inf), x > 88.7 clamps.
  static R exp(R x) {
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
    R xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    R n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    R f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), xc);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), f);
    R p = _mm512_set1_ps(1.f / 5040.f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 720.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_maskz_scalef_ps((__mmask16)~tiny, p, n);
  }
};

}  // namespace
}  // namespace myriad::cpu
