// Tiled ("flash") attention, forward and backward, in portable C++ with
// `omp simd` inner loops; each ISA TU instantiates it under its own flags.
//
// Symbols (per batch b and query head h; the kv head is h / (H / Hkv)):
//   q rows i in [0, Tq) sit at absolute position i + q_off, q_off = Tk - Tq;
//   causal: key j is visible to row i iff j <= i + q_off.
//   S = scale q k^T, P = softmax_row(S), O = P V, lse_i = log sum_j exp(S_ij).
// Forward: per (b, h, query tile of kBq rows), loop over key tiles of kBk
// keys with an online softmax (running max m, sum l, rescaled accumulator);
// only a [kBq, kBk] score block exists at a time.
// Backward (deterministic, no atomics): Drow_i = dot(dO_i, O_i); pass A per
// (b, kv head, key tile) accumulates dK, dV over the group's query heads and
// query tiles; pass B per (b, h, query tile) accumulates dQ over key tiles.
// Both recompute P_ij = exp(S_ij - lse_i) per tile, dS = P (dO V^T - Drow).
#pragma once

#include "backend/backend.h"
#include "backend/cpu/impl/common.h"
#include "core/check.h"

namespace myriad::cpu {
namespace {

constexpr int kBq = 32;  // query rows per tile
constexpr int kBk = 64;  // keys per tile (scores row = 4 zmm / 8 ymm)

struct AttnGeom {
  int B, Tq, Tk, H, Hkv, D, group, q_off;
  bool causal;
  int64_t ldq, ldkv;  // row (token) strides: H*D and Hkv*D
  explicit AttnGeom(const AttentionParams& p)
      : B(p.B), Tq(p.Tq), Tk(p.Tk), H(p.H), Hkv(p.Hkv), D(p.D), group(p.H / p.Hkv),
        q_off(p.Tk - p.Tq), causal(p.causal), ldq((int64_t)p.H * p.D),
        ldkv((int64_t)p.Hkv * p.D) {}
  // Number of keys row i may see (all Tk when not causal).
  int KeyLimit(int i) const {
    return causal ? (int)MinI(Tk, MaxI(0, (int64_t)i + q_off + 1)) : Tk;
  }
};

// kt [D, kBk] = rows j0..j0+bk of src (row stride ld) transposed, zero-padded.
inline void TransposeTile(const float* src, int64_t ld, int bk, int D, float* kt) {
  for (int d = 0; d < D; ++d) {
    float* o = kt + (int64_t)d * kBk;
    for (int j = 0; j < bk; ++j) o[j] = src[j * ld + d];
    for (int j = bk; j < kBk; ++j) o[j] = 0.f;
  }
}

// s [bq, kBk] = a [bq, D] (row stride lda) @ bt [D, kBk].
inline void ScoreTile(const float* a, int64_t lda, int bq, const float* bt, int D, float* s) {
  for (int i = 0; i < bq; ++i) {
    float* srow = s + (int64_t)i * kBk;
    const float* arow = a + i * lda;
#pragma omp simd
    for (int j = 0; j < kBk; ++j) srow[j] = 0.f;
    for (int d = 0; d < D; ++d) {
      float av = arow[d];
      const float* brow = bt + (int64_t)d * kBk;
#pragma omp simd
      for (int j = 0; j < kBk; ++j) srow[j] += av * brow[j];
    }
  }
}

// y[n] += a * x[n]
inline void Axpy(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// One row's online-softmax step over `valid` > 0 new scores srow[0..valid):
// srow becomes exp(srow - m_new), the running max *m and sum *l advance and
// the row's accumulator a[0..D) is rescaled by exp(m_old - m_new); the
// caller then adds srow . V into a.
inline void OnlineSoftmaxRow(float* srow, int valid, float* m, float* l, float* a, int D) {
  float mx = *m;
  for (int j = 0; j < valid; ++j) mx = MaxF(mx, srow[j]);
  const float alpha = ExpF(*m - mx);  // 0 when *m = -inf
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < valid; ++j) {
    float e = ExpF(srow[j] - mx);
    srow[j] = e;
    sum += e;
  }
  *m = mx;
  *l = *l * alpha + sum;
  if (alpha != 1.f) {
#pragma omp simd
    for (int d = 0; d < D; ++d) a[d] *= alpha;
  }
}

inline void AttentionFwdK(const AttentionParams& p) {
  const AttnGeom g(p);
  const int qtiles = (g.Tq + kBq - 1) / kBq;
  const int64_t tasks = (int64_t)g.B * g.H * qtiles;
  const int D = g.D;
#pragma omp parallel
  {
    Scratch<float> qs(kBq * D), kt((int64_t)D * kBk), s(kBq * kBk), acc(kBq * D);
    float m[kBq], l[kBq];
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int qt = (int)(task % qtiles), h = (int)(task / qtiles % g.H), b = (int)(task / qtiles / g.H);
      const int hk = h / g.group, i0 = qt * kBq, bq = (int)MinI(kBq, g.Tq - i0);
      const float* qsrc = p.q + b * p.q_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
      const float* kbase = p.k + b * p.kv_batch_stride + (int64_t)hk * D;
      const float* vbase = p.v + b * p.kv_batch_stride + (int64_t)hk * D;
      for (int i = 0; i < bq; ++i) {
#pragma omp simd
        for (int d = 0; d < D; ++d) qs[i * D + d] = qsrc[i * g.ldq + d] * p.scale;
        m[i] = -INFINITY;
        l[i] = 0.f;
      }
      for (int64_t x = 0; x < (int64_t)bq * D; ++x) acc[x] = 0.f;
      const int kend = g.KeyLimit(i0 + bq - 1);
      for (int j0 = 0; j0 < kend; j0 += kBk) {
        const int bk = (int)MinI(kBk, kend - j0);
        TransposeTile(kbase + (int64_t)j0 * g.ldkv, g.ldkv, bk, D, kt.p);
        ScoreTile(qs.p, D, bq, kt.p, D, s.p);
        for (int i = 0; i < bq; ++i) {
          const int valid = (int)MinI(bk, MaxI(0, g.KeyLimit(i0 + i) - j0));
          if (valid == 0) continue;
          float* srow = s.p + (int64_t)i * kBk;
          float* a = acc.p + (int64_t)i * D;
          OnlineSoftmaxRow(srow, valid, &m[i], &l[i], a, D);
          for (int j = 0; j < valid; ++j) Axpy(srow[j], vbase + (int64_t)(j0 + j) * g.ldkv, a, D);
        }
      }
      float* obase = p.out + b * p.out_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
      for (int i = 0; i < bq; ++i) {
        const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
#pragma omp simd
        for (int d = 0; d < D; ++d) obase[i * g.ldq + d] = acc[(int64_t)i * D + d] * inv;
        if (p.lse) p.lse[((int64_t)b * g.H + h) * g.Tq + i0 + i] = m[i] + std::log(l[i]);
      }
    }
  }
}

// From S already in s [bq, kBk] (scaled scores) and dP in dp [bq, kBk]:
// overwrites s with P and dp with dS, zero outside the visible keys.
inline void ProbsAndDs(const AttnGeom& g, const float* lse_rows, const float* drow, int i0, int bq,
                       int j0, int bk, float* s, float* dp) {
  for (int i = 0; i < bq; ++i) {
    const int valid = (int)MinI(bk, MaxI(0, g.KeyLimit(i0 + i) - j0));
    float* srow = s + (int64_t)i * kBk;
    float* dprow = dp + (int64_t)i * kBk;
    const float lse = lse_rows[i0 + i], dr = drow[i0 + i];
#pragma omp simd
    for (int j = 0; j < kBk; ++j) {
      float pr = j < valid ? ExpF(srow[j] - lse) : 0.f;
      srow[j] = pr;
      dprow[j] = pr * (dprow[j] - dr);
    }
  }
}

inline void AttentionBwdK(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  CHECK_MSG(p.lse != nullptr && p.out != nullptr, "[attention_bwd] needs fwd.out and fwd.lse");
  const AttnGeom g(p);
  const int D = g.D;
  const int qtiles = (g.Tq + kBq - 1) / kBq, ktiles = (g.Tk + kBk - 1) / kBk;
  // Drow [B, H, Tq] = rowsum(dO * O).
  Scratch<float> drow((int64_t)g.B * g.H * g.Tq);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < (int64_t)g.B * g.H * g.Tq; ++r) {
    const int i = (int)(r % g.Tq), h = (int)(r / g.Tq % g.H), b = (int)(r / g.Tq / g.H);
    const int64_t off = b * p.out_batch_stride + (int64_t)i * g.ldq + (int64_t)h * D;
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int d = 0; d < D; ++d) acc += bp.dout[off + d] * p.out[off + d];
    drow[r] = acc;
  }

#pragma omp parallel
  {
    Scratch<float> qs(kBq * D), kt((int64_t)D * kBk), vt((int64_t)D * kBk), s(kBq * kBk),
        dp(kBq * kBk), dk(kBk * D), dv(kBk * D), dq(kBq * D);
    // Pass A: dK, dV per (b, hk, key tile).
    const int64_t tasks_a = (int64_t)g.B * g.Hkv * ktiles;
#pragma omp for schedule(static) nowait
    for (int64_t task = 0; task < tasks_a; ++task) {
      const int kt_i = (int)(task % ktiles), hk = (int)(task / ktiles % g.Hkv), b = (int)(task / ktiles / g.Hkv);
      const int j0 = kt_i * kBk, bk = (int)MinI(kBk, g.Tk - j0);
      const float* kbase = p.k + b * p.kv_batch_stride + (int64_t)j0 * g.ldkv + (int64_t)hk * D;
      const float* vbase = p.v + b * p.kv_batch_stride + (int64_t)j0 * g.ldkv + (int64_t)hk * D;
      TransposeTile(kbase, g.ldkv, bk, D, kt.p);
      TransposeTile(vbase, g.ldkv, bk, D, vt.p);
      for (int64_t x = 0; x < (int64_t)kBk * D; ++x) dk[x] = dv[x] = 0.f;
      // First query row that sees key j0: i + q_off >= j0.
      const int first_row = g.causal ? (int)MaxI(0, j0 - g.q_off) : 0;
      for (int h = hk * g.group; h < (hk + 1) * g.group; ++h) {
        const float* lse_rows = p.lse + ((int64_t)b * g.H + h) * g.Tq;
        const float* drow_h = drow.p + ((int64_t)b * g.H + h) * g.Tq;
        for (int qt = first_row / kBq; qt < qtiles; ++qt) {
          const int i0 = qt * kBq, bq = (int)MinI(kBq, g.Tq - i0);
          const float* qsrc = p.q + b * p.q_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
          const float* dosrc = bp.dout + b * p.out_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
          for (int i = 0; i < bq; ++i) {
#pragma omp simd
            for (int d = 0; d < D; ++d) qs[i * D + d] = qsrc[i * g.ldq + d] * p.scale;
          }
          ScoreTile(qs.p, D, bq, kt.p, D, s.p);
          ScoreTile(dosrc, g.ldq, bq, vt.p, D, dp.p);
          ProbsAndDs(g, lse_rows, drow_h, i0, bq, j0, bk, s.p, dp.p);
          for (int i = 0; i < bq; ++i) {
            const float* srow = s.p + (int64_t)i * kBk;
            const float* dsrow = dp.p + (int64_t)i * kBk;
            const float* dorow = dosrc + i * g.ldq;
            const float* qrow = qs.p + (int64_t)i * D;
            for (int j = 0; j < bk; ++j) {
              Axpy(srow[j], dorow, dv.p + (int64_t)j * D, D);
              Axpy(dsrow[j], qrow, dk.p + (int64_t)j * D, D);  // qs carries the scale
            }
          }
        }
      }
      float* dkdst = bp.dk + b * p.kv_batch_stride + (int64_t)j0 * g.ldkv + (int64_t)hk * D;
      float* dvdst = bp.dv + b * p.kv_batch_stride + (int64_t)j0 * g.ldkv + (int64_t)hk * D;
      for (int j = 0; j < bk; ++j) {
        std::memcpy(dkdst + j * g.ldkv, dk.p + (int64_t)j * D, D * sizeof(float));
        std::memcpy(dvdst + j * g.ldkv, dv.p + (int64_t)j * D, D * sizeof(float));
      }
    }

    // Pass B: dQ per (b, h, query tile).
    const int64_t tasks_b = (int64_t)g.B * g.H * qtiles;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks_b; ++task) {
      const int qt = (int)(task % qtiles), h = (int)(task / qtiles % g.H), b = (int)(task / qtiles / g.H);
      const int hk = h / g.group, i0 = qt * kBq, bq = (int)MinI(kBq, g.Tq - i0);
      const float* qsrc = p.q + b * p.q_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
      const float* dosrc = bp.dout + b * p.out_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
      const float* kbase = p.k + b * p.kv_batch_stride + (int64_t)hk * D;
      const float* vbase = p.v + b * p.kv_batch_stride + (int64_t)hk * D;
      const float* lse_rows = p.lse + ((int64_t)b * g.H + h) * g.Tq;
      const float* drow_h = drow.p + ((int64_t)b * g.H + h) * g.Tq;
      for (int i = 0; i < bq; ++i) {
#pragma omp simd
        for (int d = 0; d < D; ++d) qs[i * D + d] = qsrc[i * g.ldq + d] * p.scale;
      }
      for (int64_t x = 0; x < (int64_t)bq * D; ++x) dq[x] = 0.f;
      const int kend = g.KeyLimit(i0 + bq - 1);
      for (int j0 = 0; j0 < kend; j0 += kBk) {
        const int bk = (int)MinI(kBk, kend - j0);
        TransposeTile(kbase + (int64_t)j0 * g.ldkv, g.ldkv, bk, D, kt.p);
        TransposeTile(vbase + (int64_t)j0 * g.ldkv, g.ldkv, bk, D, vt.p);
        ScoreTile(qs.p, D, bq, kt.p, D, s.p);
        ScoreTile(dosrc, g.ldq, bq, vt.p, D, dp.p);
        ProbsAndDs(g, lse_rows, drow_h, i0, bq, j0, bk, s.p, dp.p);
        for (int i = 0; i < bq; ++i) {
          const float* dsrow = dp.p + (int64_t)i * kBk;
          float* dqrow = dq.p + (int64_t)i * D;
          for (int j = 0; j < bk; ++j) Axpy(dsrow[j], kbase + (int64_t)(j0 + j) * g.ldkv, dqrow, D);
        }
      }
      float* dqdst = bp.dq + b * p.q_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
      for (int i = 0; i < bq; ++i) {
#pragma omp simd
        for (int d = 0; d < D; ++d) dqdst[i * g.ldq + d] = dq[(int64_t)i * D + d] * p.scale;
      }
    }
  }
}

}  // namespace
}  // namespace myriad::cpu
