// Data movement and reductions between the model's ops (BackendOps
// copy_rows, add_scaled, embedding_bwd, sum): rows in parallel above
// kMinParallelElems, every reduction in a fixed order.
#pragma once

#include <cstdint>
#include <cmath>
#include <cstring>

#include "backend/cpu/impl/common.h"
#include "backend/cpu/impl/elementwise.h"  // BlockedSum

namespace myriad::cpu {
namespace {

inline void CopyRowsK(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows,
                      int64_t width, float scale) {
  if (rows <= 0 || width <= 0) return;
  if (scale == 1.f && ld_src == width && ld_dst == width) {  // one contiguous block
    std::memcpy(dst, src, static_cast<size_t>(rows * width) * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static) if (rows * width >= kMinParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld_src;
    float* d = dst + r * ld_dst;
    if (scale == 1.f) {
      std::memcpy(d, s, static_cast<size_t>(width) * sizeof(float));
    } else {
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) d[c] = scale * s[c];
    }
  }
}

inline void AddScaledK(const float* x, const float* y, float alpha, int64_t n, float* out) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelElems)
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + alpha * y[i];
}

// Serial over rows (tokens repeat), parallel over 16-column strips.
inline void EmbeddingBwdK(const float* dout, const int32_t* tok, int64_t N, int64_t C, float* dtable) {
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelElems)
  for (int64_t c0 = 0; c0 < C; c0 += 16) {
    const int64_t c1 = MinI(C, c0 + 16);
    for (int64_t n = 0; n < N; ++n) {
      float* g = dtable + static_cast<int64_t>(tok[n]) * C;
      const float* d = dout + n * C;
      for (int64_t c = c0; c < c1; ++c) g[c] += d[c];
    }
  }
}

inline double SumK(const float* x, int64_t n) {
  return BlockedSum(x, n, [](float v) { return (double)v; });
}

// (b, h) pairs in parallel; each row's merge is elementwise over D.
inline void AttentionMergeK(float* out, int64_t out_batch_stride, float* lse, int64_t lse_stride,
                            const float* out_b, const float* lse_b, int B, int rows, int H, int D) {
#pragma omp parallel for collapse(2) schedule(static) if ((int64_t)B * rows * H * D >= kMinParallelElems)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < rows; ++i) {
        float& l = lse[((int64_t)b * H + h) * lse_stride + i];
        const float lb = lse_b[((int64_t)b * H + h) * rows + i];
        if (lb == -INFINITY) continue;  // no visible key in this block
        const float hi = l > lb ? l : lb, lo = l > lb ? lb : l;
        const float merged = hi + std::log1p(std::exp(lo - hi));
        const float wa = std::exp(l - merged), wb = std::exp(lb - merged);
        float* o = out + b * out_batch_stride + ((int64_t)i * H + h) * D;
        const float* ob = out_b + (((int64_t)b * rows + i) * H + h) * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) o[d] = wa * o[d] + wb * ob[d];
        l = merged;
      }
}

}  // namespace
}  // namespace myriad::cpu
