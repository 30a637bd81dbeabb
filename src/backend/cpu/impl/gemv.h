// Portable decode GEMVs y[out] = W[out, in] x[in]: rows split statically over
// threads, four rows per iteration so x is read once per four rows, `omp simd`
// reductions (fixed order per build, so deterministic).
#pragma once

#include "backend/cpu/impl/common.h"

namespace myriad::cpu {
namespace {

inline void GemvF32K(const float* W, const float* x, int64_t out, int64_t in, float* y) {
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

inline void GemvF16K(const uint16_t* W, const float* x, int64_t out, int64_t in, float* y) {
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const uint16_t* w = W + o * in;
    float a = 0;
#pragma omp simd reduction(+ : a)
    for (int64_t i = 0; i < in; ++i) a += HalfToFloatF(w[i]) * x[i];
    y[o] = a;
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

inline void GemvQ8K(const int8_t* Wq, const float* scale, const float* x, int64_t out, int64_t in,
                    float* y) {
  Scratch<int8_t> xq(in);
  float sx = QuantizeXQ8(x, in, xq.p);
  const int8_t* xs = xq.p;
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    const int8_t* w = Wq + o * in;
    int32_t a = 0;
#pragma omp simd reduction(+ : a)
    for (int64_t i = 0; i < in; ++i) a += (int32_t)w[i] * (int32_t)xs[i];
    y[o] = (float)((double)a * scale[o] * sx);
  }
}

}  // namespace
}  // namespace myriad::cpu
