// Paged attention forward (BackendOps::paged_attention) in portable C++ with
// `omp simd` inner loops; fill_ops.h puts it in every ISA table, so the
// generic, AVX2 and AVX-512 TUs each compile it under their own flags.
//
// Work items: (sequence s, a block of up to `npos` of its query positions,
// a range of kv heads), each serving every query head of its kv heads, so a
// K/V row is read from the pool once per item and reused from L1 by all the
// item's rows. The range is all Hkv heads when there are enough items to
// keep the threads busy (batched decode: each key row is then read whole,
// once), fewer otherwise (one sequence). An item resolves the offsets of
// its key rows from the block table once (blocks of any size), then walks
// the keys in tiles of kBk (a tile spans blocks freely), prefetching rows 16
// keys ahead. Per tile and row: the online softmax of impl/attention.h
// (OnlineSoftmaxRow), then acc += P V. The scores of a tile are formed in
// one of two ways:
//   few rows per kv head (decode: `group` rows, one position): s[r][j] =
//     q_r . k_j, one SIMD dot over D per score, K read in place;
//   more (prefill chunks), one kv head at a time: the tile's K is
//     transposed into kt [D, kBk] once, then ScoreTile vectorises over keys.
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

// Offsets (in floats, from p.k / p.v) of the rows of keys [0, n) of one
// sequence (head 0; head hk is hk*D further), through its block table.
inline void PagedRowOffsets(const PagedAttentionParams& p, const int32_t* table, int n, int64_t* off) {
  for (int t = 0; t < n;) {
    const int m = (int)MinI(p.block_tokens, n - t);
    const int64_t base = table[t / p.block_tokens] * p.block_stride;
    for (int u = 0; u < m; ++u) off[t + u] = base + u * p.token_stride;
    t += m;
  }
}

// Keys ahead of use whose K and V rows are prefetched: rows in place sit in
// scattered blocks, where the hardware prefetcher loses the stream at every
// block boundary, and each score would wait on its row.
constexpr int kPagedPrefetchKeys = 16;
inline void PrefetchRow(const float* k, const float* v, int64_t off, int len) {
  for (int d = 0; d < len; d += 16) {
    __builtin_prefetch(k + off + d);
    __builtin_prefetch(v + off + d);
  }
}

// a[0..D) += sum_j p[j] * (row j of v at off[j]), j < n: four keys per pass
// over a (written out: left to the compiler, a loop of Axpy calls is jammed
// into scalar code).
inline void AccumulateRows(const float* p, const float* v, const int64_t* off, int n, float* a, int D) {
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const float p0 = p[j], p1 = p[j + 1], p2 = p[j + 2], p3 = p[j + 3];
    const float *v0 = v + off[j], *v1 = v + off[j + 1], *v2 = v + off[j + 2], *v3 = v + off[j + 3];
#pragma omp simd
    for (int d = 0; d < D; ++d) a[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
  }
  for (; j < n; ++j) Axpy(p[j], v + off[j], a, D);
}

struct PagedScratch {
  Scratch<float> qs, acc, sc, kt, m, l;
  Scratch<int64_t> off;
  PagedScratch(int max_rows, int D, int max_keys)
      : qs((int64_t)max_rows * D), acc((int64_t)max_rows * D), sc((int64_t)max_rows * kBk),
        kt((int64_t)D * kBk), m(max_rows), l(max_rows), off(max_keys) {}
};

// Positions i0 .. i0+nq of sequence s, kv heads hk0 .. hk0+nhk (all their
// query heads): rows r = (position, head) with head hk0*group + r % hpt,
// hpt = nhk*group. `dot`: dot-product scores (any nhk); otherwise nhk = 1
// and the K tile is transposed once for ScoreTile.
// Sparse mode (p.sel): nq == 1, and the item's keys are its row's selection.
inline void PagedItem(const PagedAttentionParams& p, int s, int i0, int nq, int hk0, int nhk, bool dot,
                      PagedScratch& w) {
  const int D = p.D, group = p.H / p.Hkv, hpt = nhk * group, rows = nq * hpt;
  const int64_t ldq = (int64_t)p.H * D;
  const int n_s = p.q_start[s + 1] - p.q_start[s];
  const int first_pos = p.kv_len[s] - n_s + i0;  // position of the item's first row
  const int32_t* table = p.blocks + (int64_t)s * p.max_blocks;
  for (int r = 0; r < rows; ++r) {
    const float* src = p.q + (p.q_start[s] + i0 + r / hpt) * ldq + (int64_t)(hk0 * group + r % hpt) * D;
    float* q = w.qs.p + (int64_t)r * D;
    float* a = w.acc.p + (int64_t)r * D;
#pragma omp simd
    for (int d = 0; d < D; ++d) q[d] = src[d] * p.scale, a[d] = 0.f;
    w.m[r] = -INFINITY, w.l[r] = 0.f;
  }
  // Head slice of row r within a key row.
  auto head_off = [&](int r) { return (int64_t)(hk0 + r % hpt / group) * D; };
  int kend = first_pos + nq;  // the last row sees keys [0, kend)
  const bool sparse = p.sel != nullptr;
  if (sparse) {  // the row's selected keys, through the block table
    const int32_t* keys = p.sel + (int64_t)(p.q_start[s] + i0) * p.sel_k;
    kend = 0;
    while (kend < p.sel_k && keys[kend] >= 0) {
      const int t = keys[kend];
      w.off[kend++] = table[t / p.block_tokens] * p.block_stride + (int64_t)(t % p.block_tokens) * p.token_stride;
    }
  } else {
    PagedRowOffsets(p, table, kend, w.off.p);
  }
  const float *kpf = p.k + (int64_t)hk0 * D, *vpf = p.v + (int64_t)hk0 * D;
  for (int j = 0; j < MinI(kPagedPrefetchKeys, kend); ++j) PrefetchRow(kpf, vpf, w.off[j], nhk * D);
  for (int j0 = 0; j0 < kend; j0 += kBk) {
    const int bk = (int)MinI(kBk, kend - j0);
    const int64_t* off = w.off.p + j0;
    const int pf_end = (int)MinI(bk, kend - j0 - kPagedPrefetchKeys);  // keys whose row j + ahead exists
    if (dot) {
      for (int j = 0; j < bk; ++j) {
        if (j < pf_end) PrefetchRow(kpf, vpf, off[j + kPagedPrefetchKeys], nhk * D);
        const float* kj = p.k + off[j];
        for (int r = 0; r < rows; ++r) w.sc[(int64_t)r * kBk + j] = DotF(w.qs.p + (int64_t)r * D, kj + head_off(r), D);
      }
    } else {
      for (int j = 0; j < bk; ++j) {
        if (j < pf_end) PrefetchRow(kpf, vpf, off[j + kPagedPrefetchKeys], D);
        const float* kj = p.k + off[j] + (int64_t)hk0 * D;
        for (int d = 0; d < D; ++d) w.kt[(int64_t)d * kBk + j] = kj[d];
      }
      for (int d = 0; d < D; ++d)
        for (int j = bk; j < kBk; ++j) w.kt[(int64_t)d * kBk + j] = 0.f;
      ScoreTile(w.qs.p, D, rows, w.kt.p, D, w.sc.p);
    }
    for (int r = 0; r < rows; ++r) {
      const int valid = sparse ? bk : (int)MinI(bk, first_pos + r / hpt + 1 - j0);
      if (valid <= 0) continue;
      float* srow = w.sc.p + (int64_t)r * kBk;
      float* a = w.acc.p + (int64_t)r * D;
      OnlineSoftmaxRow(srow, valid, &w.m[r], &w.l[r], a, D);
      AccumulateRows(srow, p.v + head_off(r), off, valid, a, D);
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* dst = p.out + (p.q_start[s] + i0 + r / hpt) * ldq + (int64_t)(hk0 * group + r % hpt) * D;
    const float inv = w.l[r] > 0.f ? 1.f / w.l[r] : 0.f;
    const float* a = w.acc.p + (int64_t)r * D;
#pragma omp simd
    for (int d = 0; d < D; ++d) dst[d] = a[d] * inv;
  }
}

inline void PagedAttentionK(const PagedAttentionParams& p) {
  const int D = p.D, group = p.H / p.Hkv;
  // Sparse mode: one position per item (each row has its own keys).
  const int npos = p.sel ? 1 : (int)MaxI(1, kPagedItemRows / group);
  // Items (s, i0) of every sequence, and the work they do.
  int64_t n_items = 0, work = 0;
  int max_keys = 1;
  for (int s = 0; s < p.n_seq; ++s) {
    const int n = p.q_start[s + 1] - p.q_start[s];
    n_items += (n + npos - 1) / npos;
    work += (int64_t)n * (p.sel ? MinI(p.sel_k, p.kv_len[s]) : p.kv_len[s]);
    max_keys = (int)MaxI(max_keys, p.sel ? p.sel_k : p.kv_len[s]);
  }
  if (n_items == 0) return;
  Scratch<int32_t> items(2 * n_items);
  for (int s = 0, x = 0; s < p.n_seq; ++s)
    for (int i0 = 0; i0 < p.q_start[s + 1] - p.q_start[s]; i0 += npos) items[x++] = s, items[x++] = i0;
  // Kv heads per task: all of them when the items alone keep every thread
  // busy (each key row is then read once, whole), fewer otherwise.
  const bool parallel = work * p.H * D >= kMinParallelElems;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const int split = (int)MinI(p.Hkv, (2 * threads + n_items - 1) / n_items);
  const int nhk = (p.Hkv + split - 1) / split, hk_tasks = (p.Hkv + nhk - 1) / nhk;
  const int max_rows = (int)MaxI(npos * group, (int64_t)kPagedDotRows * nhk);
  const int64_t tasks = n_items * hk_tasks;
#pragma omp parallel if (parallel)
  {
    PagedScratch w(max_rows, D, max_keys);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t it = task / hk_tasks;
      const int s = items[2 * it], i0 = items[2 * it + 1];
      const int hk0 = (int)(task % hk_tasks) * nhk, nh = (int)MinI(nhk, p.Hkv - hk0);
      const int nq = (int)MinI(npos, p.q_start[s + 1] - p.q_start[s] - i0);
      if (nq * group <= kPagedDotRows) {
        PagedItem(p, s, i0, nq, hk0, nh, true, w);
      } else {
        for (int hk = hk0; hk < hk0 + nh; ++hk) PagedItem(p, s, i0, nq, hk, 1, false, w);
      }
    }
  }
}

}  // namespace
}  // namespace myriad::cpu
