// Flash attention forward/backward with explicit SIMD, templated on a vector
// traits type V (isa_avx512/vec.h, isa_avx2/vec.h) and a register row block
// R; each ISA TU instantiates it. Same algorithm and symbols as
// impl/attention.h (read that first); what differs is the blocking:
//
//   W    lanes per vector; BK = 4 W keys per tile (a score row = 4 vectors)
//   BQ   query rows per task (forward, dQ pass)
//   Dp   D rounded up to W; operands are packed once per call (Packed:
//        zero-padded rows [T, Dp] and transposed tiles [D, BK]) so the
//        micro-kernels need no masks along D and no per-tile copies
//   R    query rows per micro-kernel: R x 4 score accumulators, and R x 4
//        output accumulators for P V / dS K (AVX-512: R = 4 -> 16 zmm)
//
// Micro-kernels (all operands in L1-resident scratch):
//   Scores:  s[R, BK]  = a[R, Dp] . bt[D, BK]           (bt: transposed tile)
//   RowsXTile: acc[R, Dp] (*alpha) += p[R, BK] . t[BK, Dp]
// Forward: S = Q K^T then O += P V. Pass B (dQ): S, dP = dO V^T, dQ += dS K.
// Pass A (dK, dV) runs transposed so that R keys keep their dK/dV rows in
// registers: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
// Work items are independent (each writes its own outputs with a fixed
// order of operations), so dynamic scheduling stays deterministic.
#pragma once

#include <cstring>
#include <vector>
#include <immintrin.h>  // AVX: included only by ISA TUs (AVX2 or AVX-512 flags)

#include "backend/backend.h"
#include "backend/cpu/impl/common.h"
#include "backend/cpu/impl/paged_attention.h"
#include "core/check.h"

namespace myriad::cpu {
namespace {

template <class V, int R>
struct FlashSimd {
  using Reg = typename V::R;
  static constexpr int W = V::W, BK = 4 * W, BQ = 64, CH = 4;  // CH: vectors per RowsXTile chunk
  static_assert(BQ % R == 0, "row block must divide the query tile");

  struct Geom {
    int B, Tq, Tk, H, Hkv, D, Dp, group, q_off;
    bool causal;
    int64_t ldq, ldkv;
    explicit Geom(const AttentionParams& p)
        : B(p.B), Tq(p.Tq), Tk(p.Tk), H(p.H), Hkv(p.Hkv), D(p.D), Dp((p.D + W - 1) / W * W),
          group(p.H / p.Hkv), q_off(p.Tk - p.Tq), causal(p.causal), ldq((int64_t)p.H * p.D),
          ldkv((int64_t)p.Hkv * p.D) {}
    int KeyLimit(int i) const { return causal ? (int)MinI(Tk, MaxI(0, (int64_t)i + q_off + 1)) : Tk; }
  };

  // dst [rows_alloc, Dp] = scale * src rows (stride ld), zero-padded in d and rows.
  static void CopyRows(const float* src, int64_t ld, int rows, int rows_alloc, int D, int Dp,
                       float scale, float* dst) {
    const __m256 sc = _mm256_set1_ps(scale);
    for (int r = 0; r < rows_alloc; ++r) {
      float* o = dst + (int64_t)r * Dp;
      int d = 0;
      if (r < rows) {
        const float* sr = src + r * ld;
        for (; d + 8 <= D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(sr + d), sc));
        for (; d < D; ++d) o[d] = sr[d] * scale;
      }
      for (; d < Dp; ++d) o[d] = 0.f;
    }
  }

  // dst [D, BK] = scale * (src rows j < n, stride ld)^T, zero for j >= n;
  // 8 x 8 blocks transposed in registers (AVX), edges scalar.
  static void TransposeTile(const float* src, int64_t ld, int n, int D, float scale, float* dst) {
    const __m256 sc = _mm256_set1_ps(scale);
    const int n8 = n / 8 * 8, d8 = D / 8 * 8;
    for (int j0 = 0; j0 < n8; j0 += 8)
      for (int d0 = 0; d0 < d8; d0 += 8) {
        __m256 r[8];
        for (int a = 0; a < 8; ++a) r[a] = _mm256_mul_ps(_mm256_loadu_ps(src + (j0 + a) * ld + d0), sc);
        __m256 t[8], u[8];
        for (int a = 0; a < 8; a += 2) {
          t[a] = _mm256_unpacklo_ps(r[a], r[a + 1]);
          t[a + 1] = _mm256_unpackhi_ps(r[a], r[a + 1]);
        }
        for (int a = 0; a < 8; a += 4) {
          u[a + 0] = _mm256_shuffle_ps(t[a], t[a + 2], 0x44);
          u[a + 1] = _mm256_shuffle_ps(t[a], t[a + 2], 0xEE);
          u[a + 2] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0x44);
          u[a + 3] = _mm256_shuffle_ps(t[a + 1], t[a + 3], 0xEE);
        }
        for (int a = 0; a < 4; ++a) {
          _mm256_storeu_ps(dst + (int64_t)(d0 + a) * BK + j0, _mm256_permute2f128_ps(u[a], u[a + 4], 0x20));
          _mm256_storeu_ps(dst + (int64_t)(d0 + a + 4) * BK + j0, _mm256_permute2f128_ps(u[a], u[a + 4], 0x31));
        }
      }
    for (int d = 0; d < D; ++d) {
      float* o = dst + (int64_t)d * BK;
      const int jstart = d < d8 ? n8 : 0;  // the 8 x 8 blocks covered j < n8 for d < d8
      for (int j = jstart; j < n; ++j) o[j] = src[j * ld + d] * scale;
      for (int j = n; j < BK; ++j) o[j] = 0.f;
    }
  }

  // s [R, BK] = a [R, lda] . bt [D, BK]
  static void Scores(const float* a, int lda, const float* bt, int D, float* s) {
    Reg acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) acc[r][v] = V::zero();
    for (int d = 0; d < D; ++d) {
      const float* b = bt + (int64_t)d * BK;
      Reg b0 = V::load(b), b1 = V::load(b + W), b2 = V::load(b + 2 * W), b3 = V::load(b + 3 * W);
      for (int r = 0; r < R; ++r) {
        Reg x = V::set1(a[r * lda + d]);
        acc[r][0] = V::fma(x, b0, acc[r][0]);
        acc[r][1] = V::fma(x, b1, acc[r][1]);
        acc[r][2] = V::fma(x, b2, acc[r][2]);
        acc[r][3] = V::fma(x, b3, acc[r][3]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) V::store(s + r * BK + v * W, acc[r][v]);
  }

  // Columns [c, c + NV W) of: acc [R, Dp] = acc * alpha[r] + p [R, BK] . t [BK, Dp].
  // NV is a template argument so the R x NV accumulators stay in registers.
  template <int NV>
  static void RowsXTileChunk(const float* p, const float* t, int bk, int Dp, int c, const float* alpha,
                             float* acc) {
    Reg a[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) {
        a[r][v] = V::load(acc + r * Dp + c + v * W);
        if (alpha) a[r][v] = V::mul(a[r][v], V::set1(alpha[r]));
      }
    for (int j = 0; j < bk; ++j) {
      const float* tj = t + (int64_t)j * Dp + c;
      Reg tv[NV];
      for (int v = 0; v < NV; ++v) tv[v] = V::load(tj + v * W);
      for (int r = 0; r < R; ++r) {
        const Reg x = V::set1(p[r * BK + j]);
        for (int v = 0; v < NV; ++v) a[r][v] = V::fma(x, tv[v], a[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) V::store(acc + r * Dp + c + v * W, a[r][v]);
  }

  // acc [R, Dp] = acc * alpha[r] (alpha may be null) + p [R, BK] . t [BK, Dp], keys j < bk.
  static void RowsXTile(const float* p, const float* t, int bk, int Dp, const float* alpha, float* acc) {
    for (int c = 0; c < Dp; c += CH * W) {
      switch ((int)MinI(CH, (Dp - c) / W)) {
        case 4: RowsXTileChunk<4>(p, t, bk, Dp, c, alpha, acc); break;
        case 3: RowsXTileChunk<3>(p, t, bk, Dp, c, alpha, acc); break;
        case 2: RowsXTileChunk<2>(p, t, bk, Dp, c, alpha, acc); break;
        default: RowsXTileChunk<1>(p, t, bk, Dp, c, alpha, acc); break;
      }
    }
  }

  // Overwrites s [R, BK] with P = exp(s - lse_r) and dp with dS = P (dp - drow_r),
  // zero outside the visible keys (rows >= nrows are zeroed entirely).
  static void ProbsAndDs(const Geom& g, const float* lse, const float* drow, int i, int nrows, int j0,
                         float* s, float* dp) {
    for (int r = 0; r < R; ++r) {
      const int valid = r < nrows ? (int)MinI(BK, g.KeyLimit(i + r) - j0) : 0;
      const Reg l = V::set1(r < nrows ? lse[i + r] : 0.f), dr = V::set1(r < nrows ? drow[i + r] : 0.f);
      for (int v = 0; v < 4; ++v) {
        float* sv = s + r * BK + v * W;
        float* dv = dp + r * BK + v * W;
        Reg pr = V::keep_first(V::exp(V::sub(V::load(sv), l)), valid - v * W, 0.f);
        V::store(sv, pr);
        V::store(dv, V::mul(pr, V::sub(V::load(dv), dr)));
      }
    }
  }

  // Per-call packed copies, one block per (b, head), zero-padded to Tpad
  // rows (a multiple of BQ and BK):
  //   rows:  [B, heads, Tpad, Dp]         (row-major, padded d)
  //   tiles: [B, heads, Tpad/BK, D, BK]   (each BK-row tile transposed)
  // Buffers come from ThreadWorkspace slots `slot` (rows) and `slot + 1` (tiles).
  struct Packed {
    int heads, T, Tpad, D, Dp;
    float *rows, *tiles;
    Packed(int B, int heads_, int T_, int D_, int Dp_, bool want_rows, bool want_tiles, int slot)
        : heads(heads_), T(T_), Tpad((T_ + BQ - 1) / BQ * BQ), D(D_), Dp(Dp_),
          rows(want_rows ? ThreadWorkspace(slot, (int64_t)B * heads_ * Tpad * Dp_) : nullptr),
          tiles(want_tiles ? ThreadWorkspace(slot + 1, (int64_t)B * heads_ * Tpad * D_) : nullptr) {}
    float* Rows(int b, int h) { return rows + ((int64_t)b * heads + h) * Tpad * Dp; }
    float* Tile(int b, int h, int tile) {
      return tiles + (((int64_t)b * heads + h) * (Tpad / BK) + tile) * D * BK;
    }
  };

  // Fills `pk` from src [B, T, heads, D] (batch stride bs), times scale.
  static void Pack(const float* src, int B, int64_t bs, float scale, bool rows, bool tiles, Packed& pk) {
    const int64_t ld = (int64_t)pk.heads * pk.D;
    const int ntiles = pk.Tpad / BK;
#pragma omp parallel for schedule(static)
    for (int64_t x = 0; x < (int64_t)B * pk.heads * ntiles; ++x) {
      const int t = (int)(x % ntiles), h = (int)(x / ntiles % pk.heads), b = (int)(x / ntiles / pk.heads);
      const int j0 = t * BK, n = (int)MaxI(0, MinI(BK, pk.T - j0));
      const float* s = src + b * bs + (int64_t)j0 * ld + (int64_t)h * pk.D;
      if (rows) CopyRows(s, ld, n, BK, pk.D, pk.Dp, scale, pk.Rows(b, h) + (int64_t)j0 * pk.Dp);
      if (tiles) TransposeTile(s, ld, n, pk.D, scale, pk.Tile(b, h, t));
    }
  }

  // Decode path (few query rows per kv head, e.g. Tq = 1 against a KV
  // cache): one task per (b, kv head) serving all group * Tq query rows, so
  // each K/V row is read from memory once and reused from L1; K and V are
  // read in place (no packing), which would cost as much as the attention.
  static constexpr int kMaxDecodeRows = 16;
  static bool UseDecode(const Geom& g) { return g.Tq * g.group <= kMaxDecodeRows && g.D % W == 0; }

  static void Decode(const AttentionParams& p, const Geom& g) {
    const int64_t tasks = (int64_t)g.B * g.Hkv;
#pragma omp parallel if (tasks * g.Tk * g.D * g.group >= kMinParallelElems)
    {
      DecodeScratch w(g.group * g.Tq, g.D);
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        const int hk = (int)(task % g.Hkv), b = (int)(task / g.Hkv);
        DecodeTask(g, hk, p.q + b * p.q_batch_stride, p.scale, p.k + b * p.kv_batch_stride,
                   p.v + b * p.kv_batch_stride, [&](int t) { return (int64_t)t * g.ldkv; },
                   p.out + b * p.out_batch_stride, p.lse ? p.lse + (int64_t)b * g.H * g.Tq : nullptr, w,
                   (int64_t)hk * g.D, g.D);
      }
    }
  }

  static constexpr int kDecodePrefetch = 16;  // keys ahead whose K/V rows are prefetched
  struct DecodeScratch {
    Scratch<float> qs, acc, s;
    DecodeScratch(int rows, int D) : qs((int64_t)rows * D), acc((int64_t)rows * D), s((int64_t)rows * BK) {}
  };

  // One task of the decode path: the group * Tq query rows of kv head hk
  // (row r: query row i = r % Tq of head h = hk * group + r / Tq; q and out
  // [Tq, H, D] from row 0) against keys [0, Tk), causal as g says; key t's
  // head-hk row lies at kbase / vbase + koff(t) + hk * D (contiguous or
  // through a block table). lse, when set, is [H, Tq]. Floats [pf_off,
  // pf_off + pf_len) of each key's K and V rows (from head 0) are
  // prefetched kDecodePrefetch keys ahead.
  template <class KOff>
  static void DecodeTask(const Geom& g, int hk, const float* q, float scale, const float* kbase0,
                         const float* vbase0, KOff koff, float* out, float* lse, DecodeScratch& w,
                         int64_t pf_off, int pf_len) {
    const int D = g.D, NV = D / W, rows = g.group * g.Tq;
    float* qs = w.qs.p;
    float* acc = w.acc.p;
    float* s = w.s.p;
    float m[kMaxDecodeRows], l[kMaxDecodeRows];
    for (int r = 0; r < rows; ++r) {
      const int h = hk * g.group + r / g.Tq, i = r % g.Tq;
      const float* src = q + (int64_t)i * g.ldq + (int64_t)h * D;
      for (int d = 0; d < D; ++d) qs[(int64_t)r * D + d] = src[d] * scale, acc[(int64_t)r * D + d] = 0.f;
      m[r] = -INFINITY, l[r] = 0.f;
    }
    const float* kbase = kbase0 + (int64_t)hk * D;
    const float* vbase = vbase0 + (int64_t)hk * D;
    const int kend = g.KeyLimit(g.Tq - 1);
    for (int j0 = 0; j0 < kend; j0 += BK) {
      const int bk = (int)MinI(BK, kend - j0);
      for (int j = 0; j < bk; ++j) {  // s[r, j] = q_r . k_j
        if (pf_len && j0 + j + kDecodePrefetch < kend) {  // rows ahead (scattered blocks defeat the prefetcher)
          const int64_t o = koff(j0 + j + kDecodePrefetch) + pf_off;
          for (int d = 0; d < pf_len; d += 16) __builtin_prefetch(kbase0 + o + d), __builtin_prefetch(vbase0 + o + d);
        }
        const float* kj = kbase + koff(j0 + j);
        for (int r = 0; r < rows; ++r) {
          Reg a = V::zero();
          for (int v = 0; v < NV; ++v) a = V::fma(V::load(qs + (int64_t)r * D + v * W), V::load(kj + v * W), a);
          s[(int64_t)r * BK + j] = V::hsum(a);
        }
      }
      for (int r = 0; r < rows; ++r) {  // online softmax; s row becomes P
        float* sr = s + (int64_t)r * BK;
        const int valid = (int)MinI(bk, g.KeyLimit(r % g.Tq) - j0);
        if (valid <= 0) {
          for (int j = 0; j < BK; ++j) sr[j] = 0.f;
          continue;
        }
        Reg sv[4];
        Reg mx = V::set1(m[r]);
        for (int v = 0; v < 4; ++v) {
          sv[v] = V::keep_first(V::load(sr + v * W), valid - v * W, -INFINITY);
          mx = V::max(mx, sv[v]);
        }
        const float mnew = V::hmax(mx);
        Reg sum = V::zero();
        for (int v = 0; v < 4; ++v) {
          Reg e = V::exp(V::sub(sv[v], V::set1(mnew)));
          V::store(sr + v * W, e);
          sum = V::add(sum, e);
        }
        const float alpha = ExpF(m[r] - mnew);
        l[r] = l[r] * alpha + V::hsum(sum);
        m[r] = mnew;
        if (alpha != 1.f)
          for (int v = 0; v < NV; ++v) {
            float* a = acc + (int64_t)r * D + v * W;
            V::store(a, V::mul(V::load(a), V::set1(alpha)));
          }
      }
      for (int j = 0; j < bk; ++j) {  // acc_r += P[r, j] v_j
        const float* vj = vbase + koff(j0 + j);
        for (int v = 0; v < NV; ++v) {
          const Reg vv = V::load(vj + v * W);
          for (int r = 0; r < rows; ++r) {
            float* a = acc + (int64_t)r * D + v * W;
            V::store(a, V::fma(V::set1(s[(int64_t)r * BK + j]), vv, V::load(a)));
          }
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      const int h = hk * g.group + r / g.Tq, i = r % g.Tq;
      float* dst = out + (int64_t)i * g.ldq + (int64_t)h * D;
      const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
      for (int d = 0; d < D; ++d) dst[d] = acc[(int64_t)r * D + d] * inv;
      if (lse) lse[(int64_t)h * g.Tq + i] = m[r] + std::log(l[r]);
    }
  }


  static void Forward(const AttentionParams& p) {
    const Geom g(p);
    if (UseDecode(g)) {
      Decode(p, g);
      return;
    }
    const int D = g.D, Dp = g.Dp;
    Packed kp(g.B, g.Hkv, g.Tk, D, Dp, false, true, 0), vp(g.B, g.Hkv, g.Tk, D, Dp, true, false, 2);
    Pack(p.k, g.B, p.kv_batch_stride, 1.f, false, true, kp);
    Pack(p.v, g.B, p.kv_batch_stride, 1.f, true, false, vp);
    AttendPacked(p, g, kp, vp);
  }

  // Paged attention (BackendOps::paged_attention): decode sequences (few
  // rows per kv head) through DecodeTask reading K/V rows in place through
  // the block table; longer prefill chunks through the tiled kernel; the
  // sparse mode (and head dims the vectors do not divide) through the
  // portable paged kernel (paged_attention.h).
  static void Paged(const PagedAttentionParams& pp) {
    const int group = pp.H / pp.Hkv;
    if (pp.sel || pp.D % W) {
      PagedAttentionK(pp);
      return;
    }
    const int max_rows = kMaxDecodeRows / group;
    // The decode sequences: one task per (sequence, kv head), K/V rows read
    // in place through the block table.
    std::vector<int> dec;
    int64_t work = 0, max_kv = 1;
    for (int s = 0; s < pp.n_seq; ++s) {
      const int n = pp.q_start[s + 1] - pp.q_start[s];
      if (n == 0 || n > max_rows) continue;
      dec.push_back(s);
      work += (int64_t)pp.kv_len[s] * n;
      max_kv = MaxI(max_kv, pp.kv_len[s]);
    }
    // One task per sequence when there are enough to go round (its kv heads
    // one after another, the rows hot in cache), else per (sequence, head).
    const int64_t threads = omp_get_max_threads();
    const int per = (int64_t)dec.size() >= 2 * threads ? pp.Hkv : 1;
    const int64_t tasks = (int64_t)dec.size() * (pp.Hkv / per);
#pragma omp parallel if (work * pp.H * pp.D >= kMinParallelElems)
    {
      DecodeScratch w(max_rows * group, pp.D);
      Scratch<int64_t> off(max_kv);
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        const int s = dec[task / (pp.Hkv / per)], hk0 = (int)(task % (pp.Hkv / per)) * per;
        PagedRowOffsets(pp, pp.blocks + (int64_t)s * pp.max_blocks, pp.kv_len[s], off.p);
        const Geom g(SequenceParams(pp, s));
        const int64_t row0 = (int64_t)pp.q_start[s] * pp.H * pp.D;
        // The first head's pass prefetches whole key rows (every head), so
        // the other heads' passes find them in cache.
        for (int hk = hk0; hk < hk0 + per; ++hk)
          DecodeTask(g, hk, pp.q + row0, pp.scale, pp.k, pp.v, [&](int t) { return off[t]; }, pp.out + row0,
                     nullptr, w, per > 1 ? 0 : (int64_t)hk * pp.D, per > 1 ? (hk == hk0 ? pp.Hkv * pp.D : 0) : pp.D);
      }
    }
    // Each longer prefill chunk: this kernel's tiles, packed straight from
    // the pool's blocks through the block table (as Forward packs
    // contiguous K/V), one sequence at a time.
    for (int s = 0; s < pp.n_seq; ++s) {
      if (pp.q_start[s + 1] - pp.q_start[s] <= max_rows) continue;
      const AttentionParams a = SequenceParams(pp, s);
      const Geom g(a);
      Packed kp(1, g.Hkv, g.Tk, g.D, g.Dp, false, true, 0), vp(1, g.Hkv, g.Tk, g.D, g.Dp, true, false, 2);
      PackPaged(pp, s, kp, vp);
      AttendPacked(a, g, kp, vp);
    }
  }

  // Sequence s of a paged batch as one causal attention (B = 1; k, v unset).
  static AttentionParams SequenceParams(const PagedAttentionParams& pp, int s) {
    const int n = pp.q_start[s + 1] - pp.q_start[s];
    AttentionParams a;
    a.B = 1, a.Tq = n, a.Tk = pp.kv_len[s], a.H = pp.H, a.Hkv = pp.Hkv, a.D = pp.D;
    a.scale = pp.scale, a.causal = true;
    a.q_batch_stride = a.out_batch_stride = (int64_t)n * pp.H * pp.D;
    a.q = pp.q + (int64_t)pp.q_start[s] * pp.H * pp.D;
    a.out = pp.out + (int64_t)pp.q_start[s] * pp.H * pp.D;
    return a;
  }

  // Fills kp's tiles and vp's rows from sequence s's keys and values in the
  // pool: each BK-key tile's rows are staged (per thread, in cache) through
  // the block table, then packed as Pack does.
  static void PackPaged(const PagedAttentionParams& pp, int s, Packed& kp, Packed& vp) {
    const int ntiles = kp.Tpad / BK, D = kp.D;
    const int32_t* table = pp.blocks + (int64_t)s * pp.max_blocks;
#pragma omp parallel for schedule(static)
    for (int64_t x = 0; x < (int64_t)kp.heads * ntiles; ++x) {
      const int t = (int)(x % ntiles), h = (int)(x / ntiles);
      const int j0 = t * BK, n = (int)MaxI(0, MinI(BK, kp.T - j0));
      float* kst = ThreadWorkspace(8, (int64_t)BK * D);
      float* vst = ThreadWorkspace(9, (int64_t)BK * D);
      for (int j = 0; j < n; ++j) {
        const int key = j0 + j;
        const int64_t off = table[key / pp.block_tokens] * pp.block_stride +
                            (int64_t)(key % pp.block_tokens) * pp.token_stride + (int64_t)h * D;
        std::memcpy(kst + (int64_t)j * D, pp.k + off, D * sizeof(float));
        std::memcpy(vst + (int64_t)j * D, pp.v + off, D * sizeof(float));
      }
      TransposeTile(kst, D, n, D, 1.f, kp.Tile(0, h, t));
      CopyRows(vst, D, n, BK, D, vp.Dp, 1.f, vp.Rows(0, h) + (int64_t)j0 * vp.Dp);
    }
  }

  // The query tiles of p against packed K (tiles) and V (rows).
  static void AttendPacked(const AttentionParams& p, const Geom& g, Packed& kp, Packed& vp) {
    const int D = g.D, Dp = g.Dp;
    const int qtiles = (g.Tq + BQ - 1) / BQ;
    const int64_t tasks = (int64_t)g.B * g.H * qtiles;
#pragma omp parallel
    {
      Scratch<float> qs(BQ * Dp), acc(BQ * Dp), s(R * BK);
      float m[BQ], l[BQ], alpha[R];
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        // Heaviest (last) query tiles first for load balance.
        const int qt = qtiles - 1 - (int)(task % qtiles), h = (int)(task / qtiles % g.H),
                  b = (int)(task / qtiles / g.H);
        const int hk = h / g.group, i0 = qt * BQ, bq = (int)MinI(BQ, g.Tq - i0);
        CopyRows(p.q + b * p.q_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D, g.ldq, bq, BQ, D, Dp,
                 p.scale, qs.p);
        for (int x = 0; x < BQ * Dp; ++x) acc[x] = 0.f;
        for (int i = 0; i < BQ; ++i) m[i] = -INFINITY, l[i] = 0.f;
        const float* vrows = vp.Rows(b, hk);
        const int kend = g.KeyLimit(i0 + bq - 1);
        for (int j0 = 0; j0 < kend; j0 += BK) {
          const int bk = (int)MinI(BK, kend - j0);
          const float* kt = kp.Tile(b, hk, j0 / BK);
          for (int i = 0; i < bq; i += R) {
            Scores(qs.p + (int64_t)i * Dp, Dp, kt, D, s.p);
            for (int r = 0; r < R; ++r) {
              float* sr = s.p + r * BK;
              const int valid = i + r < bq ? (int)MinI(bk, g.KeyLimit(i0 + i + r) - j0) : 0;
              if (valid <= 0) {  // row sees no key of this tile
                for (int j = 0; j < BK; ++j) sr[j] = 0.f;
                alpha[r] = 1.f;
                continue;
              }
              Reg sv[4];
              Reg mx = V::set1(m[i + r]);
              for (int v = 0; v < 4; ++v) {
                sv[v] = V::keep_first(V::load(sr + v * W), valid - v * W, -INFINITY);
                mx = V::max(mx, sv[v]);
              }
              const float mnew = V::hmax(mx);
              const Reg mb = V::set1(mnew);
              Reg sum = V::zero();
              for (int v = 0; v < 4; ++v) {
                Reg e = V::exp(V::sub(sv[v], mb));
                V::store(sr + v * W, e);
                sum = V::add(sum, e);
              }
              alpha[r] = ExpF(m[i + r] - mnew);
              l[i + r] = l[i + r] * alpha[r] + V::hsum(sum);
              m[i + r] = mnew;
            }
            RowsXTile(s.p, vrows + (int64_t)j0 * Dp, bk, Dp, alpha, acc.p + (int64_t)i * Dp);
          }
        }
        float* obase = p.out + b * p.out_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
        for (int i = 0; i < bq; ++i) {
          const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
          for (int d = 0; d < D; ++d) obase[i * g.ldq + d] = acc[(int64_t)i * Dp + d] * inv;
          if (p.lse) p.lse[((int64_t)b * g.H + h) * g.Tq + i0 + i] = m[i] + std::log(l[i]);
        }
      }
    }
  }

  // Transposed form for pass A: sT/dpT [R keys, BK queries] for keys
  // j0k..j0k+R and queries i0..i0+BK. Overwrites sT with P^T and dpT with
  // dS^T; lse/drow are padded per query so whole vectors can be read.
  static void ProbsAndDsT(const Geom& g, const float* lse, const float* drow, int i0, int nq, int jk,
                          int nk, float* sT, float* dpT) {
    for (int r = 0; r < R; ++r) {
      const int j = jk + r;
      const int lo = r < nk ? (g.causal ? (int)MaxI(0, j - g.q_off - i0) : 0) : BK;  // first visible query lane
      for (int v = 0; v < 4; ++v) {
        float* sv = sT + r * BK + v * W;
        float* dv = dpT + r * BK + v * W;
        Reg pr = V::exp(V::sub(V::load(sv), V::load(lse + i0 + v * W)));
        pr = V::keep_range(pr, lo - v * W, nq - v * W);
        V::store(sv, pr);
        V::store(dv, V::mul(pr, V::sub(V::load(dv), V::load(drow + i0 + v * W))));
      }
    }
  }

  static void Backward(const AttentionBackwardParams& bp) {
    const AttentionParams& p = bp.fwd;
    CHECK_MSG(p.lse != nullptr && p.out != nullptr, "[attention_bwd] needs fwd.out and fwd.lse");
    const Geom g(p);
    const int D = g.D, Dp = g.Dp;
    // Packed operands (see Packed): Q scaled, dO, K, V as rows and as transposed tiles.
    Packed qp(g.B, g.H, g.Tq, D, Dp, true, true, 0), dop(g.B, g.H, g.Tq, D, Dp, true, true, 2);
    Packed kp(g.B, g.Hkv, g.Tk, D, Dp, true, true, 4), vp(g.B, g.Hkv, g.Tk, D, Dp, true, true, 6);
    Pack(p.q, g.B, p.q_batch_stride, p.scale, true, true, qp);
    Pack(bp.dout, g.B, p.out_batch_stride, 1.f, true, true, dop);
    Pack(p.k, g.B, p.kv_batch_stride, 1.f, true, true, kp);
    Pack(p.v, g.B, p.kv_batch_stride, 1.f, true, true, vp);
    const int Tqp = qp.Tpad;
    // lse and Drow = rowsum(dO * O), [B, H, Tqp] with zero padding.
    float* lse = ThreadWorkspace(8, (int64_t)g.B * g.H * Tqp);
    float* drow = ThreadWorkspace(9, (int64_t)g.B * g.H * Tqp);
#pragma omp parallel for schedule(static)
    for (int64_t x = 0; x < (int64_t)g.B * g.H * Tqp; ++x) {
      const int i = (int)(x % Tqp), h = (int)(x / Tqp % g.H), b = (int)(x / Tqp / g.H);
      float a = 0.f, ls = 0.f;
      if (i < g.Tq) {
        const int64_t off = b * p.out_batch_stride + (int64_t)i * g.ldq + (int64_t)h * D;
        for (int d = 0; d < D; ++d) a += bp.dout[off + d] * p.out[off + d];
        ls = p.lse[((int64_t)b * g.H + h) * g.Tq + i];
      }
      drow[x] = a;
      lse[x] = ls;
    }
    const int qtiles = (g.Tq + BQ - 1) / BQ, ktiles = (g.Tk + BK - 1) / BK;
#pragma omp parallel
    {
      Scratch<float> dk(BK * Dp), dv(BK * Dp), dq(BQ * Dp), s(R * BK), dp(R * BK);
      // Pass A: dK, dV per (b, kv head, key tile); R keys at a time hold
      // their dK/dV rows in registers while sweeping BK queries.
      const int64_t tasks_a = (int64_t)g.B * g.Hkv * ktiles;
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t task = 0; task < tasks_a; ++task) {
        const int kti = (int)(task % ktiles), hk = (int)(task / ktiles % g.Hkv), b = (int)(task / ktiles / g.Hkv);
        const int j0 = kti * BK, bk = (int)MinI(BK, g.Tk - j0);
        for (int x = 0; x < BK * Dp; ++x) dk[x] = dv[x] = 0.f;
        const float* krows = kp.Rows(b, hk) + (int64_t)j0 * Dp;
        const float* vrows = vp.Rows(b, hk) + (int64_t)j0 * Dp;
        const int first_q = g.causal ? (int)MaxI(0, j0 - g.q_off) : 0;
        for (int h = hk * g.group; h < (hk + 1) * g.group; ++h) {
          const float* lse_h = lse + ((int64_t)b * g.H + h) * Tqp;
          const float* drow_h = drow + ((int64_t)b * g.H + h) * Tqp;
          for (int i0 = first_q / BK * BK; i0 < g.Tq; i0 += BK) {
            const int nq = (int)MinI(BK, g.Tq - i0);
            const float* qt = qp.Tile(b, h, i0 / BK);
            const float* dot = dop.Tile(b, h, i0 / BK);
            const float* qrows = qp.Rows(b, h) + (int64_t)i0 * Dp;
            const float* dorows = dop.Rows(b, h) + (int64_t)i0 * Dp;
            for (int kr = 0; kr < bk; kr += R) {
              Scores(krows + (int64_t)kr * Dp, Dp, qt, D, s.p);
              Scores(vrows + (int64_t)kr * Dp, Dp, dot, D, dp.p);
              ProbsAndDsT(g, lse_h, drow_h, i0, nq, j0 + kr, (int)MinI(R, bk - kr), s.p, dp.p);
              RowsXTile(s.p, dorows, nq, Dp, nullptr, dv.p + (int64_t)kr * Dp);
              RowsXTile(dp.p, qrows, nq, Dp, nullptr, dk.p + (int64_t)kr * Dp);  // qrows carry the scale
            }
          }
        }
        const int64_t kvoff = b * p.kv_batch_stride + (int64_t)j0 * g.ldkv + (int64_t)hk * D;
        for (int j = 0; j < bk; ++j) {
          std::memcpy(bp.dk + kvoff + j * g.ldkv, dk.p + (int64_t)j * Dp, D * sizeof(float));
          std::memcpy(bp.dv + kvoff + j * g.ldkv, dv.p + (int64_t)j * Dp, D * sizeof(float));
        }
      }
      // Pass B: dQ per (b, h, query tile).
      const int64_t tasks_b = (int64_t)g.B * g.H * qtiles;
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks_b; ++task) {
        const int qt = qtiles - 1 - (int)(task % qtiles), h = (int)(task / qtiles % g.H),
                  b = (int)(task / qtiles / g.H);
        const int hk = h / g.group, i0 = qt * BQ, bq = (int)MinI(BQ, g.Tq - i0);
        const float* qs = qp.Rows(b, h) + (int64_t)i0 * Dp;
        const float* dos = dop.Rows(b, h) + (int64_t)i0 * Dp;
        for (int x = 0; x < BQ * Dp; ++x) dq[x] = 0.f;
        const float* lse_h = lse + ((int64_t)b * g.H + h) * Tqp;
        const float* drow_h = drow + ((int64_t)b * g.H + h) * Tqp;
        const int kend = g.KeyLimit(i0 + bq - 1);
        for (int j0 = 0; j0 < kend; j0 += BK) {
          const int bk = (int)MinI(BK, kend - j0);
          const float* kt = kp.Tile(b, hk, j0 / BK);
          const float* vt = vp.Tile(b, hk, j0 / BK);
          const float* ks = kp.Rows(b, hk) + (int64_t)j0 * Dp;
          for (int i = 0; i < bq; i += R) {
            Scores(qs + (int64_t)i * Dp, Dp, kt, D, s.p);
            Scores(dos + (int64_t)i * Dp, Dp, vt, D, dp.p);
            ProbsAndDs(g, lse_h, drow_h, i0 + i, (int)MinI(R, bq - i), j0, s.p, dp.p);
            RowsXTile(dp.p, ks, bk, Dp, nullptr, dq.p + (int64_t)i * Dp);
          }
        }
        float* dqdst = bp.dq + b * p.q_batch_stride + (int64_t)i0 * g.ldq + (int64_t)h * D;
        for (int i = 0; i < bq; ++i)
          for (int d = 0; d < D; ++d) dqdst[i * g.ldq + d] = dq[(int64_t)i * Dp + d] * p.scale;
      }
    }
  }
};

}  // namespace
}  // namespace myriad::cpu
