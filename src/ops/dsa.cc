// DSA kernels (see dsa.h for the math and the layouts).
//
// Every kernel is OpenMP-parallel over independent outputs, so results do
// not depend on the thread count or the schedule (bit for bit):
//   IndexerTopK             in dsa_indexer.cc (sampled threshold, candidates,
//                           exact selection among them; fp32 or int8).
//   SparseAttention         one task per (b, t) (per (b, t, kv head) when
//                           rows are too few, e.g. decode): the selected keys
//                           in blocks of 16, each block's k/v rows gathered
//                           once per kv head and used by the H/Hkv query
//                           heads that share it; online softmax per head.
//   SparseAttentionBackward dq per (b, t) as above; dk/dv per (b, key) from
//                           an inverse index (the entries that selected the
//                           key, in ascending order), recomputing P and dS,
//                           so nothing is scattered and nothing is atomic.
//   IndexerLoss             per query row: p, q, KL, dI, dqi, dwi; dki per
//                           (b, key) through the same inverse index; the
//                           loss is summed over rows in a fixed order.
// The inner products work on blocks of 16 rows (16 dot products reduced by
// a shuffle tree; weighted sums of 16 rows), written with GCC vector
// extensions so that target_clones compiles them for AVX-512, AVX2 and
// baseline x86-64 (picked at load time): this module is built without -m
// flags. Helpers are always_inline so they take the clone's ISA.
#include "ops/dsa.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "backend/cpu/impl/common.h"  // ExpF, ThreadWorkspace
#include "core/check.h"
#include "ops/dsa_simd.h"

namespace myriad::ops::dsa {
namespace {

using namespace simd;

using cpu::ExpF;
using cpu::ThreadWorkspace;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Below this many multiply-adds an op runs on the calling thread: a
// fork/join would cost more than it saves (decode, small tests).
constexpr int64_t kMinParallelWork = int64_t{1} << 20;

// Thread workspace slots (grow-only, per thread; see backend/cpu/impl/common.h).
enum Slot { kSlotWork = 2, kSlotKeys, kSlotU };
// Prefetch strides (floats): the row kernel requests every cache line of
// the next block's rows (they come from L3 or DRAM); the blocked kernel,
// whose rows mostly sit in L2 already, only each row's first line (measured:
// 1.12 s instead of 1.24 s at T = 16K, where all lines cost the row kernel
// nothing and saved it 25%).
constexpr int kPrefetchAllLines = 16, kPrefetchFirstLine = 1 << 20;

// Row pointers of a block: rows[j] = base + keys[min(j, bk - 1)] * ld, so
// the lanes past bk repeat a valid row (their weights are set to 0).
DSA_INLINE void BlockRows(const float* base, int64_t ld, const int32_t* keys, int bk,
                          const float** rows) {
  for (int j = 0; j < kLanes; ++j) rows[j] = base + keys[j < bk ? j : bk - 1] * ld;
}


// The valid (>= 0) entries of a selection row: keys[i] = sel[slot[i]].
inline int Compact(const int32_t* sel, int K, int32_t* keys, int32_t* slot) {
  int n = 0;
  for (int j = 0; j < K; ++j)
    if (sel[j] >= 0) {
      keys[n] = sel[j];
      if (slot) slot[n] = j;
      ++n;
    }
  return n;
}

void CheckIndexer(const char* op, const IndexerParams& p) {
  DSA_CHECK(op, p.B > 0 && p.Tq > 0 && p.Tk >= p.Tq && p.Hi > 0 && p.Di > 0 && p.K > 0);
  DSA_CHECK(op, p.qi && p.ki && p.wi && p.idx);
}

void CheckAttn(const char* op, const SparseAttentionParams& p) {
  DSA_CHECK(op, p.B > 0 && p.Tq > 0 && p.Tk >= p.Tq && p.H > 0 && p.Hkv > 0 && p.H % p.Hkv == 0 &&
                    p.D > 0 && p.K > 0);
  DSA_CHECK(op, p.q && p.k && p.idx);
}

// ---------------------------------------------------------------- attention

// One batch element of the attention tensors.
struct AttnView {
  const float *q, *k, *v, *dout, *lse, *drow;  // lse [H, Tq], drow [Tq, H]
  int Tq, H, Hkv, D, g;
  int64_t ldq, ldkv;
  float scale;
};

AttnView ViewOf(const SparseAttentionParams& p, int b) {
  AttnView a;
  a.q = p.q + b * p.q_batch_stride;
  a.k = p.k + b * p.kv_batch_stride;
  a.v = p.v ? p.v + b * p.kv_batch_stride : nullptr;
  a.dout = nullptr;
  a.lse = p.lse ? p.lse + (int64_t)b * p.H * p.Tq : nullptr;
  a.drow = nullptr;
  a.Tq = p.Tq, a.H = p.H, a.Hkv = p.Hkv, a.D = p.D, a.g = p.H / p.Hkv;
  a.ldq = (int64_t)p.H * p.D, a.ldkv = (int64_t)p.Hkv * p.D;
  a.scale = p.scale;
  return a;
}

// Rows and kv-head chunks of the attention tasks: one task per (b, t) and
// chunk; several chunks (one kv head each) only when rows alone would not
// keep the threads busy (decode). Per-head results do not depend on it.
int KvChunks(int64_t rows, int Hkv) { return rows >= 4 * (int64_t)omp_get_max_threads() ? 1 : Hkv; }

// Online-softmax update of one head with a block's scores s (lanes >= bk
// ignored): s becomes the block's weights exp(s - m_new), m and l are
// updated; returns the factor the accumulator is rescaled by.
DSA_INLINE float OnlineSoftmax(float* s, int bk, float* m, float* l) {
  const V16 sv = Masked(LoadV(s), bk, kNegInf);
  const float mx = std::max(*m, HMax(sv));
  const V16 e = ExpV(sv - mx);  // 0 in the masked lanes
  StoreV(s, e);
  const float alpha = ExpF(*m - mx);  // 0 while m = -inf
  *m = mx;
  *l = *l * alpha + HSum(e);
  return alpha;
}

// One block of bk (<= 16) selected keys for the g query heads of kv head
// hk: scores, online softmax, weighted sum of the values. qs/acc/m/l point
// at the group's first head. Shared by the row and the blocked kernels, so
// both do the same operations in the same order (bit-identical results).
// FwdKeyBlock for two query heads per kv head (the common grouped-query
// case), D a multiple of 16 up to 128: each gathered k and v row is loaded
// once for both heads. Scores in two halves of 8 keys (16 accumulators: 8
// keys x 2 heads, one reduction tree for both), the weighted sums of both
// heads in registers across the 16 rows.
DSA_INLINE void FwdKeyBlockPair(const float* const* kr, const float* const* vr, int bk, int D,
                                const float* qs, float* acc, float* m, float* l) {
  alignas(64) float s0[kLanes], s1[kLanes], r[kLanes];
  for (int half = 0; half < kLanes; half += 8) {
    V16 sums[kLanes] = {};  // [0, 8): head 0's keys, [8, 16): head 1's
    for (int c = 0; c < D; c += kLanes) {
      const V16 q0 = LoadV(qs + c), q1 = LoadV(qs + D + c);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const V16 kv = LoadV(kr[half + j] + c);
        sums[j] += q0 * kv;
        sums[8 + j] += q1 * kv;
      }
    }
    StoreV(r, Reduce16(sums));
    std::memcpy(s0 + half, r, 8 * sizeof(float));
    std::memcpy(s1 + half, r + 8, 8 * sizeof(float));
  }
  const float alpha0 = OnlineSoftmax(s0, bk, m, l), alpha1 = OnlineSoftmax(s1, bk, m + 1, l + 1);
  const int nv = D / kLanes;
  V16 o0[8] = {}, o1[8] = {};  // lanes v >= nv stay unused
#pragma GCC unroll 8
  for (int v = 0; v < 8; ++v)
    if (v < nv) o0[v] = LoadV(acc + v * kLanes) * alpha0, o1[v] = LoadV(acc + D + v * kLanes) * alpha1;
  for (int j = 0; j < kLanes; ++j) {
    const V16 w0 = SplatV(s0[j]), w1 = SplatV(s1[j]);
    const float* row = vr[j];
#pragma GCC unroll 8
    for (int v = 0; v < 8; ++v)
      if (v < nv) {
        const V16 x = LoadV(row + v * kLanes);
        o0[v] += w0 * x;
        o1[v] += w1 * x;
      }
  }
#pragma GCC unroll 8
  for (int v = 0; v < 8; ++v)
    if (v < nv) StoreV(acc + v * kLanes, o0[v]), StoreV(acc + D + v * kLanes, o1[v]);
}

DSA_INLINE void FwdKeyBlock(const AttnView& a, int hk, const int32_t* keys, int bk, int ahead,
                            int pf_stride, const float* qs, float* acc, float* m, float* l) {
  const int D = a.D;
  // The next block's k/v rows (keys[bk .. bk + ahead)) are requested now:
  // they sit at unpredictable addresses the hardware prefetcher cannot guess.
  for (int j = bk; j < bk + ahead; ++j)
    for (int d = 0; d < D; d += pf_stride) {
      __builtin_prefetch(a.k + keys[j] * a.ldkv + (int64_t)hk * D + d);
      __builtin_prefetch(a.v + keys[j] * a.ldkv + (int64_t)hk * D + d);
    }
  const float* kr[kLanes];
  const float* vr[kLanes];
  alignas(64) float s[kLanes];
  BlockRows(a.k + (int64_t)hk * D, a.ldkv, keys, bk, kr);
  BlockRows(a.v + (int64_t)hk * D, a.ldkv, keys, bk, vr);
  if (a.g == 2 && D % kLanes == 0 && D <= 8 * kLanes) {
    FwdKeyBlockPair(kr, vr, bk, D, qs, acc, m, l);
    return;
  }
  for (int h = 0; h < a.g; ++h) {
    Dots16(qs + (int64_t)h * D, kr, D, s);
    const float alpha = OnlineSoftmax(s, bk, m + h, l + h);
    float* ah = acc + (int64_t)h * D;
    if (alpha != 1.f) ScaleRow(ah, alpha, D);
    AccumRows16(ah, vr, s, D);
  }
}

// out and lse of nh heads from the online-softmax state.
DSA_INLINE void FwdFinish(const AttnView& a, const float* acc, const float* m, const float* l,
                          int nh, float* out, float* lse, int64_t lse_stride) {
  for (int h = 0; h < nh; ++h) {
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    const float* ah = acc + (int64_t)h * a.D;
    float* o = out + (int64_t)h * a.D;
#pragma omp simd
    for (int d = 0; d < a.D; ++d) o[d] = ah[d] * inv;
    if (lse) lse[h * lse_stride] = l[h] > 0.f ? m[h] + std::log(l[h]) : kNegInf;
  }
}

// Forward of row t, kv heads [hk0, hk1): keys[0..n) the valid selection.
// Each block of 16 keys is gathered once per kv head (row pointers) and
// used by the g query heads of its group.
DSA_MULTIVERSION void AttnFwdTask(const AttnView& a, int t, const int32_t* keys, int n, int hk0,
                                  int hk1, float* ws, float* out_row, float* lse_t) {
  const int D = a.D, g = a.g, h0 = hk0 * g, nh = (hk1 - hk0) * g;
  float* qs = ws;
  float* acc = qs + (int64_t)nh * D;
  float* m = acc + (int64_t)nh * D;
  float* l = m + nh;
  const float* q = a.q + t * a.ldq + (int64_t)h0 * D;
  for (int64_t x = 0; x < (int64_t)nh * D; ++x) qs[x] = q[x] * a.scale, acc[x] = 0.f;
  for (int h = 0; h < nh; ++h) m[h] = kNegInf, l[h] = 0.f;
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const int bk = std::min(kLanes, n - j0);
    for (int hk = hk0; hk < hk1; ++hk) {
      const int64_t o = (int64_t)(hk - hk0) * g;
      FwdKeyBlock(a, hk, keys + j0, bk, std::min(kLanes, n - j0 - bk), kPrefetchAllLines, qs + o * D,
                  acc + o * D, m + o, l + o);
    }
  }
  FwdFinish(a, acc, m, l, nh, out_row + (int64_t)h0 * D, lse_t ? lse_t + (int64_t)h0 * a.Tq : nullptr,
            a.Tq);
}

// Blocked forward: rows [t0, t1) of one batch element, kv head hk. The keys
// are walked in chunks of `chunk` positions; in each chunk every row of the
// block takes its next blocks of 16 selected keys whose first key lies in
// the chunk, so a chunk's k/v rows are read from DRAM once and reused from
// cache by every row of the block that selected them. Each row still runs
// its blocks 0, 16, 32 ... in order: results are bit-identical to the row
// kernel's. ws holds the rows' state; cur/nv two ints per row.
DSA_MULTIVERSION void AttnFwdBlockTask(const AttnView& a, const int32_t* idx, int K, int t0, int t1,
                                       int hk, int chunk, float* ws, int32_t* nv, int32_t* cur,
                                       int32_t* spare, float* out, float* lse) {
  const int D = a.D, g = a.g, h0 = hk * g, nr = t1 - t0;
  const int64_t stride = ((int64_t)2 * g * D + 2 * g + 15) / 16 * 16;
  for (int r = 0; r < nr; ++r) {
    const int t = t0 + r;
    const int32_t* sel = idx + (int64_t)t * K;
    nv[r] = RegularPrefix(sel, K);
    cur[r] = 0;
    float* st = ws + r * stride;
    if (nv[r] < 0) {  // not an ascending prefix: the row kernel, on its own
      const int n = Compact(sel, K, spare, nullptr);
      AttnFwdTask(a, t, spare, n, hk, hk + 1, st, out + (int64_t)t * a.ldq,
                  lse ? lse + t : nullptr);
      continue;
    }
    const float* q = a.q + t * a.ldq + (int64_t)h0 * D;
    for (int64_t x = 0; x < (int64_t)g * D; ++x) st[x] = q[x] * a.scale, st[g * D + x] = 0.f;
    for (int h = 0; h < g; ++h) st[2 * g * D + h] = kNegInf, st[2 * g * D + g + h] = 0.f;
  }
  for (int64_t end = chunk;; end += chunk) {
    bool more = false;
    for (int r = 0; r < nr; ++r) {
      const int n = nv[r];
      int j = cur[r];
      if (j >= n) continue;
      const int32_t* keys = idx + (int64_t)(t0 + r) * K;
      float* st = ws + r * stride;
      for (; j < n && keys[j] < end; j += kLanes)
        FwdKeyBlock(a, hk, keys + j, std::min(kLanes, n - j), std::clamp(n - j - kLanes, 0, kLanes),
                    kPrefetchFirstLine, st, st + g * D, st + 2 * g * D, st + 2 * g * D + g);
      cur[r] = j;
      more |= j < n;
    }
    if (!more) break;
  }
  for (int r = 0; r < nr; ++r) {
    if (nv[r] < 0) continue;
    const int t = t0 + r;
    const float* st = ws + r * stride;
    FwdFinish(a, st + g * D, st + 2 * g * D, st + 2 * g * D + g, g,
              out + (int64_t)t * a.ldq + (int64_t)h0 * D,
              lse ? lse + (int64_t)h0 * a.Tq + t : nullptr, a.Tq);
  }
}

// Backward, dq of row t for kv heads [hk0, hk1): P from the saved lse,
// dS = P (dout . v - drow), dq = scale sum dS k.
DSA_MULTIVERSION void AttnBwdDqTask(const AttnView& a, int t, const int32_t* keys, int n, int hk0,
                                    int hk1, float* ws, float* dq_row) {
  const int D = a.D, g = a.g, h0 = hk0 * g, nh = (hk1 - hk0) * g;
  float* qs = ws;
  float* acc = qs + (int64_t)nh * D;
  const float* q = a.q + t * a.ldq + (int64_t)h0 * D;
  for (int64_t x = 0; x < (int64_t)nh * D; ++x) qs[x] = q[x] * a.scale, acc[x] = 0.f;
  const float* kr[kLanes];
  const float* vr[kLanes];
  alignas(64) float s[kLanes];
  alignas(64) float dp[kLanes];
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const int bk = std::min(kLanes, n - j0);
    for (int hk = hk0; hk < hk1; ++hk) {
      BlockRows(a.k + (int64_t)hk * D, a.ldkv, keys + j0, bk, kr);
      BlockRows(a.v + (int64_t)hk * D, a.ldkv, keys + j0, bk, vr);
      for (int h = (hk - hk0) * g; h < (hk - hk0 + 1) * g; ++h) {
        const int hh = h0 + h;
        const float lse = a.lse[(int64_t)hh * a.Tq + t], dr = a.drow[(int64_t)t * a.H + hh];
        Dots16(qs + (int64_t)h * D, kr, D, s);
        Dots16(a.dout + t * a.ldq + (int64_t)hh * D, vr, D, dp);
        const V16 pr = Masked(ExpV(LoadV(s) - lse), bk, 0.f);
        StoreV(s, pr * (LoadV(dp) - dr));
        AccumRows16(acc + (int64_t)h * D, kr, s, D);
      }
    }
  }
  for (int64_t x = 0; x < (int64_t)nh * D; ++x) dq_row[(int64_t)h0 * D + x] = acc[x] * a.scale;
}

// drow[h] = dout[h] . out[h] for the H heads of one row.
DSA_MULTIVERSION void RowDots(const float* x, const float* y, int H, int D, float* r) {
  for (int h = 0; h < H; ++h) r[h] = DotN(x + (int64_t)h * D, y + (int64_t)h * D, D);
}

// Backward, dk and dv of key s (all kv heads): ents[0..n) are the entries
// t*K + slot that selected it (ascending). Per block of 16 entries and
// query head, P and dS are recomputed from q, dout, lse and drow; the
// gathered q and dout rows are weighted into dk and dv. Writes the rows.
DSA_MULTIVERSION void AttnBwdKvTask(const AttnView& a, int s, const int32_t* ents, int n, int K,
                                    float* dk_row, float* dv_row) {
  const int D = a.D, g = a.g, H = a.H;
  Zero(dk_row, (int64_t)a.Hkv * D);
  Zero(dv_row, (int64_t)a.Hkv * D);
  const float* krow = a.k + s * a.ldkv;
  const float* vrow = a.v + s * a.ldkv;
  const float* qr[kLanes];
  const float* dr[kLanes];
  int32_t ts[kLanes];
  alignas(64) float sc[kLanes];
  alignas(64) float dp[kLanes];
  alignas(64) float lse[kLanes];
  alignas(64) float drw[kLanes];
  for (int e0 = 0; e0 < n; e0 += kLanes) {
    const int bk = std::min(kLanes, n - e0);
    for (int j = 0; j < kLanes; ++j) ts[j] = ents[e0 + (j < bk ? j : bk - 1)] / K;
    for (int h = 0; h < H; ++h) {
      const int hk = h / g;
      for (int j = 0; j < kLanes; ++j) {
        qr[j] = a.q + ts[j] * a.ldq + (int64_t)h * D;
        dr[j] = a.dout + ts[j] * a.ldq + (int64_t)h * D;
        lse[j] = a.lse[(int64_t)h * a.Tq + ts[j]];
        drw[j] = a.drow[(int64_t)ts[j] * H + h];
      }
      Dots16(krow + (int64_t)hk * D, qr, D, sc);
      Dots16(vrow + (int64_t)hk * D, dr, D, dp);
      const V16 pr = Masked(ExpV(LoadV(sc) * a.scale - LoadV(lse)), bk, 0.f);
      StoreV(sc, pr);
      StoreV(dp, pr * (LoadV(dp) - LoadV(drw)));
      AccumRows16(dv_row + (int64_t)hk * D, dr, sc, D);
      AccumRows16(dk_row + (int64_t)hk * D, qr, dp, D);
    }
  }
  ScaleRow(dk_row, a.scale, a.Hkv * D);
}

// Inverse index of a selection, per batch element: the entries
// e = t*K + slot (ascending) whose idx is key s are
// ents[base[b] + off[b*(Tk+1) + s] .. base[b] + off[b*(Tk+1) + s + 1]).
struct InverseIndex {
  std::vector<int64_t> off, base;
  std::vector<int32_t> ents;
  const int32_t* Entries(int b, int Tk, int s, int* n) const {
    const int64_t* o = off.data() + (int64_t)b * (Tk + 1);
    *n = (int)(o[s + 1] - o[s]);
    return ents.data() + base[b] + o[s];
  }
};

InverseIndex BuildInverse(const int32_t* idx, int64_t idx_stride, int B, int Tq, int Tk, int K,
                          bool parallel) {
  InverseIndex inv;
  inv.off.assign((size_t)B * (Tk + 1), 0);
  inv.base.assign(B, 0);
  const int64_t E = (int64_t)Tq * K;
#pragma omp parallel for schedule(static) if (parallel && B > 1)
  for (int b = 0; b < B; ++b) {
    int64_t* o = inv.off.data() + (int64_t)b * (Tk + 1);
    const int32_t* ib = idx + b * idx_stride;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t s = ib[e];
      if (s >= 0 && s < Tk) ++o[s + 1];
    }
    for (int s = 0; s < Tk; ++s) o[s + 1] += o[s];
  }
  int64_t total = 0;
  for (int b = 0; b < B; ++b) {
    inv.base[b] = total;
    total += inv.off[(size_t)b * (Tk + 1) + Tk];
  }
  inv.ents.resize((size_t)std::max<int64_t>(total, 1));
#pragma omp parallel for schedule(static) if (parallel && B > 1)
  for (int b = 0; b < B; ++b) {
    const int64_t* o = inv.off.data() + (int64_t)b * (Tk + 1);
    std::vector<int64_t> fill(o, o + Tk);
    int32_t* eb = inv.ents.data() + inv.base[b];
    const int32_t* ib = idx + b * idx_stride;
    for (int64_t e = 0; e < E; ++e) {
      const int32_t s = ib[e];
      if (s >= 0 && s < Tk) eb[fill[s]++] = (int32_t)e;
    }
  }
  return inv;
}

// ---------------------------------------------------------------- indexer loss

// p[i] = (1/H) sum_h exp(scale q[t,h] . k[keys[i], h/g] - lse[h, t]).
DSA_MULTIVERSION void MainProbsRow(const AttnView& a, int t, const int32_t* keys, int n, float* p) {
  const int D = a.D, g = a.g;
  const float* kr[kLanes];
  alignas(64) float s[kLanes];
  Zero(p, n);
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const int bk = std::min(kLanes, n - j0);
    for (int hk = 0; hk < a.Hkv; ++hk) {
      BlockRows(a.k + (int64_t)hk * D, a.ldkv, keys + j0, bk, kr);
      for (int h = hk * g; h < (hk + 1) * g; ++h) {
        Dots16(a.q + t * a.ldq + (int64_t)h * D, kr, D, s);
        const float lse = a.lse[(int64_t)h * a.Tq + t];
        StoreV(s, ExpV(LoadV(s) * a.scale - lse));
        for (int j = 0; j < bk; ++j) p[j0 + j] += s[j];
      }
    }
  }
  ScaleRow(p, 1.f / a.H, n);
}

// u[j*n + i] = qi[j] . ki[keys[i]]; I[i] = sum_j w[j] relu(u). u and I
// hold n rounded up to 16 floats.
DSA_MULTIVERSION void IndexerScoresSel(const float* qi, const float* w, const float* ki,
                                       const int32_t* keys, int n, int Hi, int Di, float* u,
                                       float* I) {
  const int ldu = (n + kLanes - 1) / kLanes * kLanes;
  const float* kr[kLanes];
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const int bk = std::min(kLanes, n - j0);
    BlockRows(ki, Di, keys + j0, bk, kr);
    V16 acc = {};
    for (int j = 0; j < Hi; ++j) {
      float* uj = u + (int64_t)j * ldu + j0;
      Dots16(qi + (int64_t)j * Di, kr, Di, uj);
      acc += w[j] * Relu(LoadV(uj));
    }
    StoreV(I + j0, acc);
  }
}

// dwi[j] = sum_i dI[i] relu(u_ji); dqi[j] = sum_i dI[i] w_j [u_ji > 0] ki[keys[i]]
// (writes; either may be null). dI is zero past n (16-rounded like u).
DSA_MULTIVERSION void IndexerRowGrads(const float* w, const float* ki, const int32_t* keys, int n,
                                      int Hi, int Di, const float* u, const float* dI, float* dqi,
                                      float* dwi, float* dw) {
  const int ldu = (n + kLanes - 1) / kLanes * kLanes;
  const float* kr[kLanes];
  alignas(64) float c[kLanes];
  if (dqi) Zero(dqi, (int64_t)Hi * Di);
  Zero(dw, Hi);
  for (int j0 = 0; j0 < n; j0 += kLanes) {
    const int bk = std::min(kLanes, n - j0);
    BlockRows(ki, Di, keys + j0, bk, kr);
    const V16 g = LoadV(dI + j0);
    for (int j = 0; j < Hi; ++j) {
      const V16 uj = LoadV(u + (int64_t)j * ldu + j0);
      dw[j] += HSum(g * Relu(uj));
      if (!dqi) continue;
      StoreV(c, uj > V16{} ? g * w[j] : V16{});
      AccumRows16(dqi + (int64_t)j * Di, kr, c, Di);
    }
  }
  if (dwi)
    for (int j = 0; j < Hi; ++j) dwi[j] = dw[j];
}

// dki[s] = sum over entries e = t*K + slot that selected s of
// sum_j dI[e] w[t,j] [qi[t,j] . ki[s] > 0] qi[t,j] (writes). qi, wi and dI
// at batch b's row 0.
DSA_MULTIVERSION void IndexerKeyGrad(const float* qi, const float* wi, const float* kis,
                                     const int32_t* ents, int n, int K, int Hi, int Di,
                                     const float* dI, float* dki) {
  Zero(dki, Di);
  const float* qr[kLanes];
  int32_t ts[kLanes];
  alignas(64) float gr[kLanes];
  alignas(64) float u[kLanes];
  for (int e0 = 0; e0 < n; e0 += kLanes) {
    const int bk = std::min(kLanes, n - e0);
    for (int i = 0; i < kLanes; ++i) {
      const int32_t e = ents[e0 + (i < bk ? i : bk - 1)];
      ts[i] = e / K;
      gr[i] = i < bk ? dI[e] : 0.f;
    }
    for (int j = 0; j < Hi; ++j) {
      for (int i = 0; i < kLanes; ++i) qr[i] = qi + ((int64_t)ts[i] * Hi + j) * Di;
      Dots16(kis, qr, Di, u);
      for (int i = 0; i < kLanes; ++i)
        u[i] = u[i] > 0.f ? gr[i] * wi[(int64_t)ts[i] * Hi + j] : 0.f;
      AccumRows16(dki, qr, u, Di);
    }
  }
}

}  // namespace

// ================================================================ SparseAttention

namespace {
std::function<SparseAttentionSchedule(const SparseAttentionParams&)>& ScheduleLookup() {
  static std::function<SparseAttentionSchedule(const SparseAttentionParams&)> fn;
  return fn;
}
}  // namespace

void SetSparseAttentionScheduleLookup(
    std::function<SparseAttentionSchedule(const SparseAttentionParams&)> lookup) {
  ScheduleLookup() = std::move(lookup);
}

SparseAttentionSchedule DefaultSparseAttentionSchedule(const SparseAttentionParams& p) {
  // Prefill where the selection is a quarter of the keys or more: masked
  // dense attention (GEMM speed beats gathering at that density).
  if (p.Tq == p.Tk && p.Tq >= 256 && p.Tk <= 4 * p.K) return {0, 0, 256};
  // Below a few blocks of keys per row there is little to reuse.
  if ((int64_t)p.B * p.Tq < 64 || p.Tk <= 2 * p.K) return {1, 0, 0};
  // Blocked: enough rows per block that each key is selected by ~32 of them
  // on average (K / Tk of the rows select a given key), short chunks. The
  // lab's winners: q_block 256 / chunk 128 at T = 16K, K = 2048; measured
  // by hand at 64K, q_block 1024 / chunk 256 (5.8 s against 7.2 s with the
  // 16K schedule).
  const int64_t ratio = std::max<int64_t>(1, p.Tk / std::max(1, p.K));
  const int q_block = (int)std::clamp<int64_t>(32 * ratio, 64, 2048) / 64 * 64;
  return {q_block, ratio <= 8 ? 128 : 256, 0};
}

SparseAttentionSchedule ResolveSparseAttentionSchedule(const SparseAttentionParams& p) {
  SparseAttentionSchedule s{p.q_block, p.key_chunk, p.dense_tile};
  if (s.q_block == 0 && s.dense_tile == 0) {
    const auto& fn = ScheduleLookup();
    s = fn ? fn(p) : SparseAttentionSchedule{};
    if (s.q_block == 0 && s.dense_tile == 0) s = DefaultSparseAttentionSchedule(p);
  }
  if (s.dense_tile > 0) return {0, 0, s.dense_tile};
  if (s.q_block > 1 && s.key_chunk <= 0) s.key_chunk = DefaultSparseAttentionSchedule(p).key_chunk;
  if (s.q_block > 1 && s.key_chunk <= 0) s.key_chunk = 512;
  return s;
}

void SparseAttention(const SparseAttentionParams& p) {
  CheckAttn("dsa_sparse_attention", p);
  DSA_CHECK("dsa_sparse_attention",
            p.v && p.out && p.q_block >= 0 && p.key_chunk >= 0 && p.dense_tile >= 0);
  const int Tq = p.Tq, H = p.H, Hkv = p.Hkv, D = p.D, K = p.K;
  const int64_t rows = (int64_t)p.B * Tq;
  const bool par = rows * K * H * D >= kMinParallelWork;
  SparseAttentionSchedule sched = ResolveSparseAttentionSchedule(p);
  if (sched.dense_tile > 0) {
    if (MaskedDenseAttention(p, sched.dense_tile)) return;
    sched = {1, 0, 0};  // a selection in another form: the row kernel
  }
  if (sched.q_block > 1) {
    const int qb = std::min(sched.q_block, Tq), g = H / Hkv;
    const int64_t blocks = (Tq + qb - 1) / qb, tasks = (int64_t)p.B * blocks * Hkv;
    const int64_t stride = ((int64_t)2 * g * D + 2 * g + 15) / 16 * 16;
    // Later blocks (more keys) first: the dynamic schedule then ends evenly.
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t rev = tasks - 1 - task;
      const int hk = (int)(rev % Hkv);
      const int64_t bb = rev / Hkv;
      const int b = (int)(bb / blocks), t0 = (int)(bb % blocks) * qb, t1 = std::min(Tq, t0 + qb);
      float* ws = ThreadWorkspace(kSlotWork, qb * stride);
      int32_t* ints = reinterpret_cast<int32_t*>(ThreadWorkspace(kSlotKeys, 2 * (int64_t)qb + K));
      AttnFwdBlockTask(ViewOf(p, b), p.idx + b * p.idx_batch_stride, K, t0, t1, hk, sched.key_chunk,
                       ws, ints, ints + qb, ints + 2 * qb, p.out + b * p.out_batch_stride,
                       p.lse ? p.lse + (int64_t)b * H * Tq : nullptr);
    }
    return;
  }
  const int chunks = KvChunks(rows, Hkv), per = Hkv / chunks;
#pragma omp parallel for schedule(dynamic, 2) if (par)
  for (int64_t task = 0; task < rows * chunks; ++task) {
    const int64_t r = task / chunks;
    const int b = (int)(r / Tq), t = (int)(r % Tq), hk0 = (int)(task % chunks) * per;
    const int nh = per * (H / Hkv);
    int32_t* keys = reinterpret_cast<int32_t*>(ThreadWorkspace(kSlotKeys, K));
    const int n = Compact(p.idx + b * p.idx_batch_stride + (int64_t)t * K, K, keys, nullptr);
    float* ws = ThreadWorkspace(kSlotWork, 2 * (int64_t)nh * D + 2 * nh);
    AttnFwdTask(ViewOf(p, b), t, keys, n, hk0, hk0 + per, ws,
                p.out + b * p.out_batch_stride + (int64_t)t * H * D,
                p.lse ? p.lse + (int64_t)b * H * Tq + t : nullptr);
  }
}

// ================================================================ backward

void SparseAttentionBackward(const SparseAttentionBackwardParams& bp) {
  const SparseAttentionParams& p = bp.fwd;
  CheckAttn("dsa_sparse_attention_backward", p);
  DSA_CHECK("dsa_sparse_attention_backward",
            p.v && p.out && p.lse && bp.dout && bp.dq && bp.dk && bp.dv);
  const int B = p.B, Tq = p.Tq, Tk = p.Tk, H = p.H, Hkv = p.Hkv, D = p.D, K = p.K;
  const int64_t ldq = (int64_t)H * D, ldkv = (int64_t)Hkv * D, rows = (int64_t)B * Tq;
  const bool par = rows * K * H * D >= kMinParallelWork;

  // drow [B, Tq, H] = rowsum(dout * out).
  std::vector<float> drow((size_t)rows * H);
#pragma omp parallel for schedule(static) if (par)
  for (int64_t r = 0; r < rows; ++r) {
    const int b = (int)(r / Tq), t = (int)(r % Tq);
    const int64_t off = b * p.out_batch_stride + (int64_t)t * ldq;
    RowDots(bp.dout + off, p.out + off, H, D, drow.data() + r * H);
  }
  auto view = [&](int b) {
    AttnView a = ViewOf(p, b);
    a.dout = bp.dout + b * p.out_batch_stride;
    a.drow = drow.data() + (int64_t)b * Tq * H;
    return a;
  };

  // dq per (b, t) and kv-head chunk.
  const int chunks = KvChunks(rows, Hkv), per = Hkv / chunks;
#pragma omp parallel for schedule(dynamic, 2) if (par)
  for (int64_t task = 0; task < rows * chunks; ++task) {
    const int64_t r = task / chunks;
    const int b = (int)(r / Tq), t = (int)(r % Tq), hk0 = (int)(task % chunks) * per;
    const int nh = per * (H / Hkv);
    int32_t* keys = reinterpret_cast<int32_t*>(ThreadWorkspace(kSlotKeys, K));
    const int n = Compact(p.idx + b * p.idx_batch_stride + (int64_t)t * K, K, keys, nullptr);
    float* ws = ThreadWorkspace(kSlotWork, 2 * (int64_t)nh * D);
    AttnBwdDqTask(view(b), t, keys, n, hk0, hk0 + per, ws,
                  bp.dq + b * p.q_batch_stride + (int64_t)t * ldq);
  }

  // dk, dv per (b, key) through the inverse index; every key row is
  // written (zero when never selected).
  const InverseIndex inv = BuildInverse(p.idx, p.idx_batch_stride, B, Tq, Tk, K, par);
#pragma omp parallel for schedule(dynamic, 8) if (par)
  for (int64_t r = 0; r < (int64_t)B * Tk; ++r) {
    const int b = (int)(r / Tk), s = (int)(r % Tk);
    int n = 0;
    const int32_t* ents = inv.Entries(b, Tk, s, &n);
    const int64_t koff = b * p.kv_batch_stride + (int64_t)s * ldkv;
    AttnBwdKvTask(view(b), s, ents, n, K, bp.dk + koff, bp.dv + koff);
  }
}

// ================================================================ IndexerLoss

double IndexerLoss(const IndexerLossParams& lp) {
  const IndexerParams& ip = lp.indexer;
  const SparseAttentionParams& ap = lp.attn;
  CheckIndexer("dsa_indexer_loss", ip);
  CheckAttn("dsa_indexer_loss", ap);
  DSA_CHECK("dsa_indexer_loss",
            ap.lse && ap.B == ip.B && ap.Tq == ip.Tq && ap.Tk == ip.Tk && ap.K == ip.K);
  const int B = ip.B, Tq = ip.Tq, Tk = ip.Tk, Hi = ip.Hi, Di = ip.Di, K = ip.K;
  const bool grads = lp.dqi || lp.dki || lp.dwi;
  const int64_t rows = (int64_t)B * Tq;
  const bool par = rows * K * ((int64_t)ap.H * ap.D + (int64_t)Hi * Di) >= kMinParallelWork;
  const float gscale = (float)((double)lp.grad_scale / (double)rows);
  std::vector<double> kl((size_t)rows, 0.0);
  std::vector<float> dI(lp.dki ? (size_t)rows * K : 0, 0.f);  // [B, Tq, K], 0 at pads

#pragma omp parallel for schedule(dynamic, 2) if (par)
  for (int64_t r = 0; r < rows; ++r) {
    const int b = (int)(r / Tq), t = (int)(r % Tq);
    const float* qi = ip.qi + b * ip.qi_batch_stride + (int64_t)t * Hi * Di;
    const float* wi = ip.wi + b * ip.wi_batch_stride + (int64_t)t * Hi;
    const float* ki = ip.ki + b * ip.ki_batch_stride;
    float* dqi = lp.dqi ? lp.dqi + b * ip.qi_batch_stride + (int64_t)t * Hi * Di : nullptr;
    float* dwi = lp.dwi ? lp.dwi + b * ip.wi_batch_stride + (int64_t)t * Hi : nullptr;
    int32_t* keys = reinterpret_cast<int32_t*>(ThreadWorkspace(kSlotKeys, 2 * (int64_t)K));
    int32_t* slot = keys + K;
    const int n = Compact(ip.idx + b * ip.idx_batch_stride + (int64_t)t * K, K, keys, slot);
    if (n == 0) {
      if (dqi) Zero(dqi, (int64_t)Hi * Di);
      if (dwi) Zero(dwi, Hi);
      continue;
    }
    const int n16 = (n + kLanes - 1) / kLanes * kLanes;
    float* pm = ThreadWorkspace(kSlotWork, 3 * (int64_t)n16 + Hi);  // p, I, dI, then dw
    float* I = pm + n16;
    float* dIr = pm + 2 * n16;
    float* dw = pm + 3 * n16;
    float* u = ThreadWorkspace(kSlotU, (int64_t)Hi * n16);
    MainProbsRow(ViewOf(ap, b), t, keys, n, pm);
    IndexerScoresSel(qi, wi, ki, keys, n, Hi, Di, u, I);
    float mx = kNegInf;
    for (int i = 0; i < n; ++i) mx = std::max(mx, I[i]);
    double z = 0.0;
    for (int i = 0; i < n; ++i) z += (double)ExpF(I[i] - mx);
    const double lse_i = (double)mx + std::log(z);
    double row = 0.0;
    for (int i = 0; i < n; ++i) {
      const double logq = (double)I[i] - lse_i;
      if (pm[i] > 0.f) row += (double)pm[i] * ((double)std::log(pm[i]) - logq);
      dIr[i] = ((float)std::exp(logq) - pm[i]) * gscale;
    }
    for (int i = n; i < n16; ++i) dIr[i] = 0.f;
    kl[r] = row;
    if (!grads) continue;
    if (lp.dki)
      for (int i = 0; i < n; ++i) dI[r * K + slot[i]] = dIr[i];
    if (dqi || dwi) IndexerRowGrads(wi, ki, keys, n, Hi, Di, u, dIr, dqi, dwi, dw);
  }

  if (lp.dki) {
    const InverseIndex inv = BuildInverse(ip.idx, ip.idx_batch_stride, B, Tq, Tk, K, par);
#pragma omp parallel for schedule(dynamic, 16) if (par)
    for (int64_t r = 0; r < (int64_t)B * Tk; ++r) {
      const int b = (int)(r / Tk), s = (int)(r % Tk);
      int n = 0;
      const int32_t* ents = inv.Entries(b, Tk, s, &n);
      IndexerKeyGrad(ip.qi + b * ip.qi_batch_stride, ip.wi + b * ip.wi_batch_stride,
                     ip.ki + b * ip.ki_batch_stride + (int64_t)s * Di, ents, n, K, Hi, Di,
                     dI.data() + (int64_t)b * Tq * K,
                     lp.dki + b * ip.ki_batch_stride + (int64_t)s * Di);
    }
  }

  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) total += kl[r];
  return total / (double)rows;
}

}  // namespace myriad::ops::dsa
