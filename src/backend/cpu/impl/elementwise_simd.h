// Explicit-SIMD versions of the exp-heavy element-wise ops (SwiGLU and the
// fused softmax cross-entropy), templated on vector traits V
// (isa_avx512/vec.h, isa_avx2/vec.h) so that exp is vectorised on every ISA
// (the compiler's auto-vectorisation of ExpF is not reliable). Same
// contracts and parallel decomposition as impl/elementwise.h; tails along the
// row use the scalar ExpF (same algorithm, same accuracy).
#pragma once

#include "backend/cpu/impl/common.h"
#include "backend/cpu/impl/elementwise.h"

namespace myriad::cpu {
namespace {

template <class V>
struct ElementwiseSimd {
  using Reg = typename V::R;
  static constexpr int W = V::W;

  // gu [N, 2F] = [gate | up] per row; out [N, F]. Work items are (row,
  // column chunk) pairs as in SwigluFwdK.
  static void SwigluFwd(const float* gu, int64_t N, int64_t F, float* out) {
    const int64_t nc = (F + kSwigluCol - 1) / kSwigluCol;
#pragma omp parallel for schedule(static) if (N * F >= kMinParallelElems)
    for (int64_t t = 0; t < N * nc; ++t) {
      const int64_t n = t / nc, f0 = (t % nc) * kSwigluCol, f1 = MinI(F, f0 + kSwigluCol);
      const float* gate = gu + n * 2 * F;
      const float* up = gate + F;
      float* o = out + n * F;
      const Reg one = V::set1(1.f);
      int64_t f = f0;
      for (; f + W <= f1; f += W) {
        Reg g = V::load(gate + f);
        V::store(o + f, V::mul(V::mul(g, V::div(one, V::add(one, V::exp(V::sub(V::zero(), g))))),
                               V::load(up + f)));
      }
      for (; f < f1; ++f) o[f] = gate[f] / (1.f + ExpF(-gate[f])) * up[f];
    }
  }

  // dout [N, F]; gu, dgu [N, 2F] = [gate | up], [dgate | dup] per row.
  static void SwigluBwd(const float* dout, const float* gu, int64_t N, int64_t F, float* dgu) {
    const int64_t nc = (F + kSwigluCol - 1) / kSwigluCol;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N * nc; ++t) {
      const int64_t n = t / nc, f0 = (t % nc) * kSwigluCol, f1 = MinI(F, f0 + kSwigluCol);
      const float* gate = gu + n * 2 * F;
      const float* up = gate + F;
      const float* dr = dout + n * F;
      float* dgate = dgu + n * 2 * F;
      float* dup = dgate + F;
      const Reg one = V::set1(1.f);
      int64_t f = f0;
      for (; f + W <= f1; f += W) {
        Reg g = V::load(gate + f), d = V::load(dr + f), u = V::load(up + f);
        Reg s = V::div(one, V::add(one, V::exp(V::sub(V::zero(), g))));
        // dgate = d u s (1 + g (1 - s)); dup = d g s
        V::store(dgate + f, V::mul(V::mul(V::mul(d, u), s), V::fma(g, V::sub(one, s), one)));
        V::store(dup + f, V::mul(V::mul(d, g), s));
      }
      for (; f < f1; ++f) {
        float g = gate[f], d = dr[f], u = up[f];
        float s = 1.f / (1.f + ExpF(-g));
        dgate[f] = d * u * s * (1.f + g * (1.f - s));
        dup[f] = d * g * s;
      }
    }
  }

  // Sum of exp(l[j] - m) for j in [j0, j1), vectorised, fixed order.
  static float SumExp(const float* l, int64_t j0, int64_t j1, float m) {
    Reg acc = V::zero();
    const Reg mb = V::set1(m);
    int64_t j = j0;
    for (; j + W <= j1; j += W) acc = V::add(acc, V::exp(V::sub(V::load(l + j), mb)));
    float s = V::hsum(acc);
    for (; j < j1; ++j) s += ExpF(l[j] - m);
    return s;
  }
  static float MaxOf(const float* l, int64_t j0, int64_t j1) {
    Reg mx = V::set1(-INFINITY);
    int64_t j = j0;
    for (; j + W <= j1; j += W) mx = V::max(mx, V::load(l + j));
    float m = V::hmax(mx);
    for (; j < j1; ++j) m = MaxF(m, l[j]);
    return m;
  }

  // logits, dlogits [N, V] (may alias). Pass 1 keeps a running (max, sum)
  // per block of kXentBlock (rescaling the sum when the max grows); pass 2
  // writes the gradient.
  static void SoftmaxXent(const float* logits, const int32_t* targets, int64_t N, int64_t Vn,
                          float grad_scale, float* losses, float* dlogits) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* l = logits + n * Vn;
      const int32_t t = targets[n];
      float m = -INFINITY, sum = 0.f;
      for (int64_t j0 = 0; j0 < Vn; j0 += kXentBlock) {
        const int64_t j1 = MinI(Vn, j0 + kXentBlock);
        const float bm = MaxOf(l, j0, j1);
        if (bm > m) {
          sum *= ExpF(m - bm);
          m = bm;
        }
        sum += SumExp(l, j0, j1, m);
      }
      const float lse = m + std::log(sum);
      losses[n] = t < 0 ? 0.f : lse - l[t];
      if (!dlogits) continue;
      float* d = dlogits + n * Vn;
      if (t < 0) {
        std::memset(d, 0, Vn * sizeof(float));
        continue;
      }
      const float lt = l[t];  // read before d (which may alias l) overwrites it
      const Reg lb = V::set1(lse), gs = V::set1(grad_scale);
      int64_t j = 0;
      for (; j + W <= Vn; j += W) V::store(d + j, V::mul(V::exp(V::sub(V::load(l + j), lb)), gs));
      for (; j < Vn; ++j) d[j] = ExpF(l[j] - lse) * grad_scale;
      d[t] = (ExpF(lt - lse) - 1.f) * grad_scale;
    }
  }
};

}  // namespace
}  // namespace myriad::cpu
