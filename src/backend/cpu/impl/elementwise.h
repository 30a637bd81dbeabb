// Row-wise and element-wise kernels (norms, rope, swiglu, softmax-xent, MoE
// permutation, AdamW, sumsq), written as plain loops with `omp simd` so the
// compiler vectorises them for whichever ISA the including TU targets.
// Parallel over rows/chunks with static schedules; no reduction crosses
// threads in an order that depends on timing, and sumsq/dw reductions use a
// fixed decomposition, so results are identical for any thread count.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/impl/common.h"

namespace myriad::cpu {
namespace {

// x, out [N, C]; w [C]; rstd [N].
inline void RmsnormFwdK(const float* x, const float* w, float eps, int64_t N, int64_t C,
                        float* out, float* rstd) {
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelElems)
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    float r = 1.f / std::sqrt(ss / (float)C + eps);
    rstd[n] = r;
    float* o = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = xr[c] * r * w[c];
  }
}

// dx [N, C] += r w g - r^3/C x dot(g w, x); dw [C] += sum_n g x r.
// dw is reduced per column block over rows in order (thread-count independent).
inline void RmsnormBwdK(const float* dout, const float* x, const float* w, const float* rstd,
                        int64_t N, int64_t C, float* dx, float* dw) {
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (int64_t n = 0; n < N; ++n) {
      const float* g = dout + n * C;
      const float* xr = x + n * C;
      float r = rstd[n];
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += g[c] * w[c] * xr[c];
      float k = r * r * r / (float)C * dot;
      float* d = dx + n * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) d[c] += r * w[c] * g[c] - k * xr[c];
    }
    constexpr int64_t kCb = 64;
    int64_t blocks = (C + kCb - 1) / kCb;
#pragma omp for schedule(static)
    for (int64_t cb = 0; cb < blocks; ++cb) {
      int64_t c0 = cb * kCb, c1 = MinI(C, c0 + kCb);
      float acc[kCb] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* g = dout + n * C;
        const float* xr = x + n * C;
        float r = rstd[n];
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += g[c] * xr[c] * r;
      }
      for (int64_t c = c0; c < c1; ++c) dw[c] += acc[c - c0];
    }
  }
}

// x [N, H, head_stride] in place, the first D of each head; tables [max_pos, D/2].
inline void RopeK(float* x, int64_t N, int H, int D, int64_t head_stride, const int32_t* pos,
                  const float* cos_table, const float* sin_table, bool inverse) {
  int half = D / 2;
  float sgn = inverse ? -1.f : 1.f;
#pragma omp parallel for schedule(static) if (N * H * D >= kMinParallelElems)
  for (int64_t n = 0; n < N; ++n) {
    const float* ct = cos_table + (int64_t)pos[n] * half;
    const float* st = sin_table + (int64_t)pos[n] * half;
    for (int h = 0; h < H; ++h) {
      float* a = x + (n * H + h) * head_stride;
      float* b = a + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        float c = ct[i], s = sgn * st[i];
        float x1 = a[i], x2 = b[i];
        a[i] = x1 * c - x2 * s;
        b[i] = x1 * s + x2 * c;
      }
    }
  }
}

constexpr int64_t kElemChunk = 4096;  // elements per OpenMP work item

// SwiGLU work items: (row, column chunk of kSwigluCol) pairs, so a single
// long row (decode: N=1, F=3072) still spreads over threads. Element-wise, so
// the result does not depend on the decomposition or thread count.
constexpr int64_t kSwigluCol = 512;  // multiple of every vector width

// gu [N, 2F] = [gate | up] per row; out [N, F].
inline void SwigluFwdK(const float* gu, int64_t N, int64_t F, float* out) {
  const int64_t nc = (F + kSwigluCol - 1) / kSwigluCol;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N * nc; ++t) {
    const int64_t n = t / nc, f0 = (t % nc) * kSwigluCol, f1 = MinI(F, f0 + kSwigluCol);
    const float* gate = gu + n * 2 * F;
    const float* up = gate + F;
    float* o = out + n * F;
#pragma omp simd
    for (int64_t f = f0; f < f1; ++f) {
      float g = gate[f];
      o[f] = g / (1.f + ExpF(-g)) * up[f];
    }
  }
}

// dout [N, F]; gu, dgu [N, 2F] = [gate | up], [dgate | dup] per row.
inline void SwigluBwdK(const float* dout, const float* gu, int64_t N, int64_t F, float* dgu) {
  const int64_t nc = (F + kSwigluCol - 1) / kSwigluCol;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N * nc; ++t) {
    const int64_t n = t / nc, f0 = (t % nc) * kSwigluCol, f1 = MinI(F, f0 + kSwigluCol);
    const float* gate = gu + n * 2 * F;
    const float* up = gate + F;
    const float* dr = dout + n * F;
    float* dgate = dgu + n * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int64_t f = f0; f < f1; ++f) {
      float g = gate[f], d = dr[f], u = up[f];
      float s = 1.f / (1.f + ExpF(-g));
      dgate[f] = d * u * s * (1.f + g * (1.f - s));
      dup[f] = d * g * s;
    }
  }
}

// logits, dlogits [N, V] (may alias); targets, losses [N]. One sweep keeps a
// running (max, sum) per block of kXentBlock, rescaling the sum when the max
// grows; a second sweep writes the gradient.
constexpr int64_t kXentBlock = 256;
inline void SoftmaxXentK(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                         float grad_scale, float* losses, float* dlogits) {
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    int32_t t = targets[n];
    float m = -INFINITY, sum = 0.f;
    for (int64_t j0 = 0; j0 < V; j0 += kXentBlock) {
      int64_t j1 = MinI(V, j0 + kXentBlock);
      float bm = -INFINITY;
#pragma omp simd reduction(max : bm)
      for (int64_t j = j0; j < j1; ++j) bm = MaxF(bm, l[j]);
      if (bm > m) {
        sum *= ExpF(m - bm);
        m = bm;
      }
      float bs = 0.f;
#pragma omp simd reduction(+ : bs)
      for (int64_t j = j0; j < j1; ++j) bs += ExpF(l[j] - m);
      sum += bs;
    }
    float lse = m + std::log(sum);
    losses[n] = t < 0 ? 0.f : lse - l[t];
    if (!dlogits) continue;
    float* d = dlogits + n * V;
    if (t < 0) {
      std::memset(d, 0, V * sizeof(float));
      continue;
    }
    float lt = l[t];  // read before d (which may alias l) overwrites it
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) d[j] = ExpF(l[j] - lse) * grad_scale;
    d[t] = (ExpF(lt - lse) - 1.f) * grad_scale;
  }
}

// dst [M, C] = src[idx[i], :].
inline void MoeGatherK(const float* src, const int32_t* idx, int64_t M, int64_t C, float* dst) {
#pragma omp parallel for schedule(static) if (M * C >= kMinParallelElems)
  for (int64_t i = 0; i < M; ++i) std::memcpy(dst + i * C, src + (int64_t)idx[i] * C, C * sizeof(float));
}

// out [N, C] += sum_k w[t,k] buf[pos[t,k], :]; k summed in order.
inline void MoeCombineK(const float* buf, const int32_t* pos, const float* w, int64_t N,
                        int64_t K, int64_t C, float* out) {
#pragma omp parallel for schedule(static) if (N * K * C >= kMinParallelElems)
  for (int64_t t = 0; t < N; ++t) {
    float* o = out + t * C;
    for (int64_t k = 0; k < K; ++k) {
      const float* b = buf + (int64_t)pos[t * K + k] * C;
      float wk = w ? w[t * K + k] : 1.f;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += wk * b[c];
    }
  }
}

inline void MoeCombineBwdK(const float* dout, const float* buf, const int32_t* pos,
                           const float* w, int64_t N, int64_t K, int64_t C, float* dbuf,
                           float* dw) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    const float* g = dout + t * C;
    for (int64_t k = 0; k < K; ++k) {
      int64_t r = pos[t * K + k];
      float wk = w ? w[t * K + k] : 1.f;
      float* d = dbuf + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) d[c] = wk * g[c];
      if (dw) {
        const float* b = buf + r * C;
        float acc = 0.f;
#pragma omp simd reduction(+ : acc)
        for (int64_t c = 0; c < C; ++c) acc += g[c] * b[c];
        dw[t * K + k] = acc;
      }
    }
  }
}

inline void AdamWK(const AdamWParams& p) {
  const float b1 = p.beta1, b2 = p.beta2;
  const float bc1 = (float)(1.0 - std::pow((double)p.beta1, (double)p.step));
  const float bc2 = (float)(1.0 - std::pow((double)p.beta2, (double)p.step));
  const float step_size = p.lr / bc1, inv_sqrt_bc2 = 1.f / std::sqrt(bc2);
  const float decay = p.lr * p.weight_decay, gs = p.grad_scale, eps = p.eps;
  float* param = p.param;
  float* m = p.m;
  float* v = p.v;
  const float* grad = p.grad;
  int64_t n = p.n;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kElemChunk) {
    int64_t c1 = MinI(n, c0 + kElemChunk);
#pragma omp simd
    for (int64_t i = c0; i < c1; ++i) {
      float g = grad[i] * gs;
      float mi = b1 * m[i] + (1.f - b1) * g;
      float vi = b2 * v[i] + (1.f - b2) * g * g;
      m[i] = mi;
      v[i] = vi;
      float pi = param[i];
      param[i] = pi - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps) - decay * pi;
    }
  }
}

// sum over i < n of term(x[i]) in double: fixed blocks of kElemChunk, then
// the block sums in order (the same bits for any thread count).
template <typename Term>
inline double BlockedSum(const float* x, int64_t n, Term term) {
  if (n <= 0) return 0.0;
  int64_t blocks = (n + kElemChunk - 1) / kElemChunk;
  Scratch<double> part(blocks);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t c0 = b * kElemChunk, c1 = MinI(n, c0 + kElemChunk);
    double acc = 0.0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = c0; i < c1; ++i) acc += term(x[i]);
    part[b] = acc;
  }
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) total += part[b];
  return total;
}

inline double SumsqK(const float* x, int64_t n) {
  return BlockedSum(x, n, [](float v) { return (double)v * (double)v; });
}

}  // namespace
}  // namespace myriad::cpu
