// Paged attention forward (BackendOps::paged_attention) in portable C++ with
// `omp simd` inner loops; fill_ops.h puts it in every ISA table, so the
// generic, AVX2 and AVX-512 TUs each compile it under their own flags.
//
// Work items: (sequence s, kv head hk, a block of up to `npos` of the
// sequence's query positions). An item serves all `group` = H / Hkv query
// heads of hk at once: row r of an item is position i0 + r / group of head
// hk * group + r % group, so each K/V row is read from the pool once per item
// and reused from L1 by every row. Keys are walked in tiles of kBk keys; the
// offsets of a tile's rows are resolved from the block table once per tile
// (a tile spans blocks freely, blocks of any size). Per tile and row: the
// online softmax of impl/attention.h (OnlineSoftmaxRow), then acc += P V.
// The scores of a tile are formed in one of two ways:
//   few rows (decode: group rows, one position): s[r][j] = q_r . k_j, one
//     SIMD dot over D per score, K read in place;
//   more rows (prefill chunks): the tile's K is transposed into kt [D, kBk]
//     once, then ScoreTile vectorises over the tile's keys.
// Items write disjoint outputs with a fixed order of operations, so dynamic
// scheduling keeps results bitwise deterministic for any thread count.
#pragma once

#include "backend/backend.h"
#include "backend/cpu/impl/attention.h"
#include "backend/cpu/impl/common.h"

namespace myriad::cpu {
namespace {

constexpr int kPagedItemRows = 64;  // rows (positions x group heads) per work item
constexpr int kPagedDotRows = 8;    // up to this many rows: dot-product scores

inline float DotF(const float* a, const float* b, int n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Offsets (in floats, from p.k / p.v) of keys j0 .. j0+bk of one sequence,
// kv head hk, resolved through its block table `table`.
inline void PagedTileOffsets(const PagedAttentionParams& p, const int32_t* table, int hk, int j0,
                             int bk, int64_t* off) {
  for (int j = 0; j < bk;) {
    const int t = j0 + j, slot = t % p.block_tokens;
    const int n = (int)MinI(p.block_tokens - slot, bk - j);
    const int64_t base = table[t / p.block_tokens] * p.block_stride + slot * p.token_stride + (int64_t)hk * p.D;
    for (int u = 0; u < n; ++u) off[j + u] = base + u * p.token_stride;
    j += n;
  }
}

inline void PagedAttentionK(const PagedAttentionParams& p) {
  const int D = p.D, group = p.H / p.Hkv;
  const int npos = (int)MaxI(1, kPagedItemRows / group), max_rows = npos * group;
  const int64_t ldq = (int64_t)p.H * D;
  // Items (s, i0) of every sequence, times Hkv; and the work they do.
  int64_t n_items = 0, work = 0;
  for (int s = 0; s < p.n_seq; ++s) {
    const int n = p.q_start[s + 1] - p.q_start[s];
    n_items += (n + npos - 1) / npos;
    work += (int64_t)n * p.kv_len[s];
  }
  if (n_items == 0) return;
  Scratch<int32_t> items(2 * n_items);
  for (int s = 0, x = 0; s < p.n_seq; ++s)
    for (int i0 = 0; i0 < p.q_start[s + 1] - p.q_start[s]; i0 += npos) items[x++] = s, items[x++] = i0;
  const int64_t tasks = n_items * p.Hkv;
#pragma omp parallel if (work * p.H * D >= kMinParallelElems)
  {
    Scratch<float> qs((int64_t)max_rows * D), acc((int64_t)max_rows * D), sc((int64_t)max_rows * kBk),
        kt((int64_t)D * kBk), m(max_rows), l(max_rows);
    Scratch<int64_t> off(kBk);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t it = task / p.Hkv;
      const int hk = (int)(task % p.Hkv), s = items[2 * it], i0 = items[2 * it + 1];
      const int n_s = p.q_start[s + 1] - p.q_start[s];
      const int nq = (int)MinI(npos, n_s - i0), rows = nq * group;
      const int first_pos = p.kv_len[s] - n_s + i0;  // position of the item's first row
      const int32_t* table = p.blocks + (int64_t)s * p.max_blocks;
      for (int r = 0; r < rows; ++r) {
        const float* src = p.q + (p.q_start[s] + i0 + r / group) * ldq + (int64_t)(hk * group + r % group) * D;
        float* q = qs.p + (int64_t)r * D;
        float* a = acc.p + (int64_t)r * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) q[d] = src[d] * p.scale, a[d] = 0.f;
        m[r] = -INFINITY, l[r] = 0.f;
      }
      const int kend = first_pos + nq;  // the last row sees keys [0, kend)
      for (int j0 = 0; j0 < kend; j0 += kBk) {
        const int bk = (int)MinI(kBk, kend - j0);
        PagedTileOffsets(p, table, hk, j0, bk, off.p);
        if (rows <= kPagedDotRows) {
          for (int j = 0; j < bk; ++j) {
            const float* kj = p.k + off[j];
            for (int r = 0; r < rows; ++r) sc[(int64_t)r * kBk + j] = DotF(qs.p + (int64_t)r * D, kj, D);
          }
        } else {
          for (int j = 0; j < bk; ++j) {
            const float* kj = p.k + off[j];
            for (int d = 0; d < D; ++d) kt[(int64_t)d * kBk + j] = kj[d];
          }
          for (int d = 0; d < D; ++d)
            for (int j = bk; j < kBk; ++j) kt[(int64_t)d * kBk + j] = 0.f;
          ScoreTile(qs.p, D, rows, kt.p, D, sc.p);
        }
        for (int r = 0; r < rows; ++r) {
          const int valid = (int)MinI(bk, first_pos + r / group + 1 - j0);
          if (valid <= 0) continue;
          float* srow = sc.p + (int64_t)r * kBk;
          float* a = acc.p + (int64_t)r * D;
          OnlineSoftmaxRow(srow, valid, &m[r], &l[r], a, D);
          for (int j = 0; j < valid; ++j) Axpy(srow[j], p.v + off[j], a, D);
        }
      }
      for (int r = 0; r < rows; ++r) {
        float* dst = p.out + (p.q_start[s] + i0 + r / group) * ldq + (int64_t)(hk * group + r % group) * D;
        const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
        const float* a = acc.p + (int64_t)r * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) dst[d] = a[d] * inv;
      }
    }
  }
}

}  // namespace
}  // namespace myriad::cpu
