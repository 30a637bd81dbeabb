// DSA's lightning indexer with its fused top-k (see dsa.h for the math).
//
// Per call: the keys are laid out once in tiles of 64 (fp32: [Di][64],
// transposed; int8: [Di/4][64][4] bytes, offset by 128, with a scale per
// key), and a second set of tiles holds every 16th key (the sample).
// Per block of kRowBlock query rows (one OpenMP task, so results do not
// depend on the thread count):
//   1. each row scores its visible sample keys and takes the score of rank
//      ~3K/32 among them as a threshold tau: about 1.5 K of the row's keys
//      score at or above it;
//   2. the rows walk the key tiles together (a tile is read from memory
//      once per block and stays in L1 for the other rows); each row scores
//      the tile's 64 keys and keeps the ones at or above its tau
//      (candidates, in ascending key order; AVX-512 compress where present)
//      -- no [Tq, Tk] matrix and no per-row score buffer are written;
//   3. each row's exact K-th largest score among its candidates (a 32-pass
//      bitwise search over ~1.5 K entries) and one scan write the selection.
// A row whose tau let fewer than K keys through (possible only when many
// scores tie or the sample misjudged) is scored again with every key a
// candidate. Exactness needs only that every key at or above the K-th
// score is a candidate, which count >= K guarantees.
// Decode (up to kDirectMaxRows query rows): IndexerTopKDirect lays out 64
// keys at a time and keeps every key as a candidate (no per-call layout of
// all keys, no sample); the same tile kernels, so the same bits.
#include <immintrin.h>

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own
// _mm512_undefined_* placeholders.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_info.h"
#include "backend/cpu/dsa/index_kernels.h"
#include "backend/cpu/impl/common.h"  // ThreadWorkspace
#include "core/check.h"
#include "backend/cpu/dsa/dsa.h"
#include "backend/cpu/dsa/dsa_attn.h"  // NarrowVectors
#include "backend/cpu/dsa/dsa_simd.h"

namespace myriad::cpu::dsa {
namespace {

using namespace simd;
using cpu::ThreadWorkspace;
using cpu::dsa::OrderedKey;
using QueryRow = cpu::dsa::IndexQueryRow;
using TileRows = cpu::dsa::IndexTileRows;

constexpr int kTile = cpu::dsa::kIndexTile;  // keys per tile
constexpr int kSampleStep = 16;  // the sample: keys s = 16 i + kSampleOffset
constexpr int kSampleOffset = 7;
constexpr int kRowBlock = 16;    // query rows per task, sharing each key tile
constexpr int kMaxInt8Dim = 256; // Di of the int8 path
constexpr int kDirectMaxRows = 4; // up to this many query rows: IndexerTopKDirect
// Thread workspace slots (per thread; see backend/cpu/impl/common.h).
enum Slot { kSlotSample = 0, kSlotCandKey, kSlotCandIdx, kSlotQuant, kSlotSelect };

// A threshold for the k largest (1 <= k <= n) of key[0..n): the largest
// thr with at least k keys >= thr, or, when exactly k keys reach some
// value, any thr with exactly k keys >= thr. Found bit by bit by vectorised
// counting passes (no branches on the data); the search stops at the first
// thr with exactly k keys >= thr (those keys are then the k largest and no
// lower bit can change that). Bits above the highest one where the
// smallest and largest keys differ are common to all keys: the passes
// start below them. *ge gets the count of keys >= thr.
DSA_KERNEL(uint32_t, KthThreshold, (const uint32_t* key, int n, int k, int* ge), (key, n, k, ge)) {
  uint32_t lo = ~0u, hi = 0;
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int i = 0; i < n; ++i) lo = std::min(lo, key[i]), hi = std::max(hi, key[i]);
  if (lo == hi) return *ge = n, hi;
  const int top = 31 - __builtin_clz(lo ^ hi);  // the highest differing bit
  uint32_t thr = top == 31 ? 0u : hi & (~0u << (top + 1));
  int at = n;  // keys >= thr
  for (int bit = top; bit >= 0; --bit) {
    const uint32_t cand = thr | (1u << bit);
    int cnt = 0;
#pragma omp simd reduction(+ : cnt)
    for (int i = 0; i < n; ++i) cnt += key[i] >= cand ? 1 : 0;
    if (cnt >= k) {
      thr = cand, at = cnt;
      if (cnt == k) break;
    }
  }
  *ge = at;
  return thr;
}

// ------------------------------------------------------------ key layouts

struct KeyTiles {
  int64_t ld = 0;       // keys per batch element, rounded up to kTile
  int Dg = 0;           // int8: groups of 4 dims (Di rounded up to 4, / 4)
  std::vector<float> f32;     // [B][tile][Di][64]
  std::vector<uint8_t> i8;    // [B][tile][Dg][64][4], value + 128
  std::vector<float> scale;   // [B][ld] per-key scale (int8), 0 past the end
};

// int8 quantisation (dsa.h): scale = amax / 127, q = round-to-even(x * (127 / amax)).
DSA_INLINE void QuantizeRow(const float* x, int n, int8_t* q, float* scale) {
  float amax = 0.f;
  for (int d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  // Round half to even without a libm call: for |y| <= 127 (far below
  // 2^22), y + 1.5 * 2^23 - 1.5 * 2^23 rounds to the nearest integer, ties
  // to even, in float arithmetic (volatile-free: no -ffast-math here).
  constexpr float kMagic = 12582912.f;
#pragma omp simd
  for (int d = 0; d < n; ++d) {
    const float r = (x[d] * inv + kMagic) - kMagic;
    q[d] = (int8_t)std::clamp((int)r, -127, 127);
  }
  *scale = amax / 127.f;
}

// One key into lane `lane` of a tile: fp32 [Di][64] (tile_f32), or int8
// [Dg][64][4] bytes offset by 128 with scale[lane] (tile_i8, scale).
DSA_INLINE void LayOutKey(const float* row, int Di, int lane, float* tile_f32, uint8_t* tile_i8,
                          float* scale) {
  if (tile_i8) {
    int8_t q[kMaxInt8Dim];
    QuantizeRow(row, Di, q, &scale[lane]);
    for (int d = 0; d < Di; ++d) tile_i8[((size_t)(d / 4) * kTile + lane) * 4 + d % 4] = (uint8_t)(q[d] + 128);
  } else {
    for (int d = 0; d < Di; ++d) tile_f32[(size_t)d * kTile + lane] = row[d];
  }
}

// Builds the tiles of keys key(b, i) = ki row `row_of(i)` for i < count
// (zero / scale 0 past count).
template <typename RowOf>
void BuildTiles(const IndexerParams& p, int count, RowOf row_of, bool par, KeyTiles* kt) {
  const int Di = p.Di;
  kt->ld = ((int64_t)count + kTile - 1) / kTile * kTile;
  const int64_t tiles = kt->ld / kTile;
  const bool int8 = p.precision == IndexerPrecision::kInt8;
  kt->Dg = (Di + 3) / 4;
  if (int8) {
    kt->i8.assign((size_t)p.B * kt->ld * kt->Dg * 4, 128);
    kt->scale.assign((size_t)p.B * kt->ld, 0.f);
  } else {
    kt->f32.assign((size_t)p.B * kt->ld * Di, 0.f);
  }
#pragma omp parallel for schedule(static) if (par)
  for (int64_t task = 0; task < (int64_t)p.B * tiles; ++task) {
    const int b = (int)(task / tiles);
    const int i0 = (int)(task % tiles) * kTile;
    const size_t first = (size_t)b * kt->ld + i0;  // the tile's first key
    float* f32 = int8 ? nullptr : kt->f32.data() + first * Di;
    uint8_t* i8 = int8 ? kt->i8.data() + first * kt->Dg * 4 : nullptr;
    float* scale = int8 ? kt->scale.data() + first : nullptr;
    for (int i = i0; i < std::min(count, i0 + kTile); ++i)
      LayOutKey(IndexerKeyRow(p, b, row_of(i)), Di, i - i0, f32, i8, scale);
  }
}

// ------------------------------------------------------------ tile scores

// fp32: sc[0..64) = sum_j w[j] relu(qi[j] . key) over a [Di][64] tile.
DSA_KERNEL(void, TileScoresF32, (const QueryRow& r, const float* tile, int Hi, int Di, float* sc), (r, tile, Hi, Di, sc)) {
  V16 t0 = {}, t1 = {}, t2 = {}, t3 = {};
  for (int j = 0; j < Hi; ++j) {
    const float* qj = r.qi + (int64_t)j * Di;
    V16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int d = 0; d < Di; ++d) {
      const V16 x = SplatV(qj[d]);
      const float* kr = tile + d * kTile;
      a0 += x * LoadV(kr);
      a1 += x * LoadV(kr + 16);
      a2 += x * LoadV(kr + 32);
      a3 += x * LoadV(kr + 48);
    }
    const V16 wj = SplatV(r.w[j]);
    t0 += wj * Relu(a0);
    t1 += wj * Relu(a1);
    t2 += wj * Relu(a2);
    t3 += wj * Relu(a3);
  }
  StoreV(sc, t0);
  StoreV(sc + 16, t1);
  StoreV(sc + 32, t2);
  StoreV(sc + 48, t3);
}

// TileScoresF32 in 8-lane vectors, 32 keys at a time (4 + 4 accumulators):
// for CPUs without AVX-512, where the 16-lane form needs 32 registers and
// GCC lowers its relu lane by lane. The same operations per key: the same
// bits.
DSA_KERNEL(void, TileScoresF32x8, (const QueryRow& r, const float* tile, int Hi, int Di, float* sc), (r, tile, Hi, Di, sc)) {
  for (int half = 0; half < kTile; half += 32) {
    V8 t[4] = {};
    for (int j = 0; j < Hi; ++j) {
      const float* qj = r.qi + (int64_t)j * Di;
      V8 a[4] = {};
      for (int d = 0; d < Di; ++d) {
        const V8 x = SplatV8(qj[d]);
        const float* kr = tile + d * kTile + half;
#pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) a[v] += x * LoadV8(kr + 8 * v);
      }
      const V8 wj = SplatV8(r.w[j]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) t[v] += wj * (a[v] > V8{} ? a[v] : V8{});
    }
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) StoreV8(sc + half + 8 * v, t[v]);
  }
}

// int8, any ISA: dot = sum (key + 128) * q - corr, exact in int32; then
// t = fma(c[j], max(float(dot), 0), t) over the heads and sc = t * scale.
// The VNNI kernel below does the same operations: the same bits.
void TileScoresI8Portable(const QueryRow& r, const uint8_t* tile, const float* ks, int Hi, int Dg,
                          float* sc) {
  for (int i = 0; i < kTile; ++i) {
    float t = 0.f;
    for (int j = 0; j < Hi; ++j) {
      const int8_t* q = r.q8 + (int64_t)j * Dg * 4;
      int32_t dot = 0;
      for (int g = 0; g < Dg; ++g)
        for (int e = 0; e < 4; ++e) dot += (int32_t)tile[((size_t)g * kTile + i) * 4 + e] * q[g * 4 + e];
      t = std::fma(r.c[j], std::max((float)(dot - r.corr[j]), 0.f), t);
    }
    sc[i] = t * ks[i];
  }
}

int CollectPortable(const float* sc, int valid, int s0, uint32_t tau, uint32_t* ckey, int32_t* cidx,
                    int c) {
  for (int i = 0; i < std::min(valid, kTile); ++i) {
    const uint32_t key = OrderedKey(sc[i]);
    ckey[c] = key;
    cidx[c] = s0 + i;
    c += key >= tau ? 1 : 0;
  }
  return c;
}

int TileCollectI8Portable(const QueryRow& r, const uint8_t* tile, const float* ks, int Hi, int Dg,
                          int valid, int s0, uint32_t tau, uint32_t* ckey, int32_t* cidx, int c) {
  alignas(64) float sc[kTile];
  TileScoresI8Portable(r, tile, ks, Hi, Dg, sc);
  return CollectPortable(sc, valid, s0, tau, ckey, cidx, c);
}

// The rows of one task's block on one tile (IndexTileRows): one call per
// tile for the whole block, no per-row call through the kernel table.
void TileCollectRowsI8Portable(const TileRows& b, const uint8_t* tile, const float* ks, int Hi, int Dg,
                               int s0) {
  for (int r = 0; r < b.nr; ++r) {
    if (b.n[r] <= b.K || s0 >= b.n[r]) continue;
    b.count[r] = TileCollectI8Portable(b.rows[r], tile, ks, Hi, Dg, b.n[r] - s0, s0, b.tau[r],
                                       b.ckey + r * b.cap, b.cidx + r * b.cap, b.count[r]);
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
#define DSA_HAVE_VNNI_KERNEL 1
#define DSA_VNNI gnu::target("avx512f,avx512bw,avx512vnni")

// The 64 int8 scores of a tile (see TileScoresI8Portable), in 4 vectors.
// kHi / kDg: the head count and groups of 4 dims as compile-time constants
// (0: the run-time Hi / Dg); the benchmark's shape compiled with its
// constants runs ~25% faster (unrolled, no partial head groups). The
// accumulators start at -corr, and relu is an integer max before the
// conversion: the same values as subtracting corr and clamping after.
template <int kHi, int kDg>
[[DSA_VNNI, gnu::always_inline]] inline void VnniScores(const QueryRow& r, const uint8_t* tile,
                                                        const float* ks, int hi_rt, int dg_rt,
                                                        __m512 out[4]) {
  const int Hi = kHi ? kHi : hi_rt, Dg = kDg ? kDg : dg_rt;
  __m512 t[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  // Heads in groups of 4: each tile vector is loaded once per group and
  // feeds 4 heads (16 accumulators); heads are folded into t in order j.
  for (int j = 0; j < Hi; j += 4) {
    const int nh = std::min(4, Hi - j);
    __m512i a[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      const __m512i start = _mm512_set1_epi32(h < nh ? -r.corr[j + h] : 0);
      for (int v = 0; v < 4; ++v) a[h][v] = start;
    }
#pragma GCC unroll 8
    for (int g = 0; g < Dg; ++g) {
      const uint8_t* tp = tile + (size_t)g * kTile * 4;
      const __m512i k0 = _mm512_loadu_si512(tp), k1 = _mm512_loadu_si512(tp + 64),
                    k2 = _mm512_loadu_si512(tp + 128), k3 = _mm512_loadu_si512(tp + 192);
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) {
        if (h >= nh) break;
        int32_t q4;
        std::memcpy(&q4, r.q8 + (int64_t)(j + h) * Dg * 4 + g * 4, 4);
        const __m512i qb = _mm512_set1_epi32(q4);
        a[h][0] = _mm512_dpbusd_epi32(a[h][0], k0, qb);
        a[h][1] = _mm512_dpbusd_epi32(a[h][1], k1, qb);
        a[h][2] = _mm512_dpbusd_epi32(a[h][2], k2, qb);
        a[h][3] = _mm512_dpbusd_epi32(a[h][3], k3, qb);
      }
    }
    const __m512i zero = _mm512_setzero_si512();
    for (int h = 0; h < nh; ++h) {
      const __m512 c = _mm512_set1_ps(r.c[j + h]);
      for (int v = 0; v < 4; ++v)
        t[v] = _mm512_fmadd_ps(c, _mm512_cvtepi32_ps(_mm512_max_epi32(a[h][v], zero)), t[v]);
    }
  }
  for (int v = 0; v < 4; ++v) out[v] = _mm512_mul_ps(t[v], _mm512_loadu_ps(ks + 16 * v));
}

// VnniScores with the shape's constants where it is the benchmark's
// (Hi 4, Di 32), else run-time loops.
[[DSA_VNNI, gnu::always_inline]] inline void VnniScoresAny(const QueryRow& r, const uint8_t* tile,
                                                           const float* ks, int Hi, int Dg,
                                                           __m512 out[4]) {
  if (Hi == 4 && Dg == 8)
    VnniScores<4, 8>(r, tile, ks, Hi, Dg, out);
  else
    VnniScores<0, 0>(r, tile, ks, Hi, Dg, out);
}

// Candidates among 64 scores: the lanes i < valid with OrderedKey >= tau,
// appended to (ckey, cidx) in lane order; returns the new count. Branch-free
// (whether a group of 16 has a candidate is a coin flip); writes up to 16
// entries past the count (the buffers have the room).
[[gnu::target("avx512f"), gnu::always_inline]] inline int CollectVectors(const __m512 sc[4], int valid,
                                                                         int s0, uint32_t tau,
                                                                         uint32_t* ckey, int32_t* cidx,
                                                                         int c) {
  const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
  const __m512i tv = _mm512_set1_epi32((int)tau);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int v = 0; v < 4; ++v) {
    const int left = valid - 16 * v;
    if (left <= 0) break;
    // OrderedKey on 16 lanes: (x + 0) turns -0 into +0; negative -> ~u, else u | sign.
    const __m512i u = _mm512_castps_si512(_mm512_add_ps(sc[v], _mm512_setzero_ps()));
    const __mmask16 neg = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512());
    const __m512i key = _mm512_mask_xor_epi32(_mm512_or_si512(u, sign), neg, u, _mm512_set1_epi32(-1));
    __mmask16 m = _mm512_cmpge_epu32_mask(key, tv);
    if (left < 16) m &= (__mmask16)((1u << left) - 1);
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(s0 + 16 * v), lanes);
    _mm512_storeu_si512(ckey + c, _mm512_maskz_compress_epi32(m, key));
    _mm512_storeu_si512(cidx + c, _mm512_maskz_compress_epi32(m, idx));
    c += __builtin_popcount(m);
  }
  return c;
}

[[DSA_VNNI]] void TileScoresI8Vnni(const QueryRow& r, const uint8_t* tile, const float* ks, int Hi,
                                   int Dg, float* sc) {
  __m512 v[4];
  VnniScoresAny(r, tile, ks, Hi, Dg, v);
  for (int i = 0; i < 4; ++i) _mm512_storeu_ps(sc + 16 * i, v[i]);
}

[[DSA_VNNI]] int TileCollectI8Vnni(const QueryRow& r, const uint8_t* tile, const float* ks, int Hi,
                                   int Dg, int valid, int s0, uint32_t tau, uint32_t* ckey,
                                   int32_t* cidx, int c) {
  __m512 v[4];
  VnniScoresAny(r, tile, ks, Hi, Dg, v);
  return CollectVectors(v, valid, s0, tau, ckey, cidx, c);
}

// TileCollectRowsI8Portable with the VNNI kernel, the shape's constants
// chosen once per tile.
template <int kHi, int kDg>
[[DSA_VNNI, gnu::always_inline]] inline void CollectRowsVnni(const TileRows& b, const uint8_t* tile,
                                                             const float* ks, int Hi, int Dg, int s0) {
  for (int r = 0; r < b.nr; ++r) {
    if (b.n[r] <= b.K || s0 >= b.n[r]) continue;
    __m512 v[4];
    VnniScores<kHi, kDg>(b.rows[r], tile, ks, Hi, Dg, v);
    b.count[r] = CollectVectors(v, b.n[r] - s0, s0, b.tau[r], b.ckey + r * b.cap, b.cidx + r * b.cap,
                                b.count[r]);
  }
}

[[DSA_VNNI]] void TileCollectRowsI8Vnni(const TileRows& b, const uint8_t* tile, const float* ks, int Hi,
                                        int Dg, int s0) {
  if (Hi == 4 && Dg == 8)
    CollectRowsVnni<4, 8>(b, tile, ks, Hi, Dg, s0);
  else
    CollectRowsVnni<0, 0>(b, tile, ks, Hi, Dg, s0);
}

[[gnu::target("avx512f")]] int CollectAvx512(const float* sc, int valid, int s0, uint32_t tau,
                                             uint32_t* ckey, int32_t* cidx, int c) {
  const __m512 v[4] = {_mm512_loadu_ps(sc), _mm512_loadu_ps(sc + 16), _mm512_loadu_ps(sc + 32),
                       _mm512_loadu_ps(sc + 48)};
  return CollectVectors(v, valid, s0, tau, ckey, cidx, c);
}

// KthThreshold's contract (below) by a shrinking set: bit by bit from the
// highest one where the keys differ, the keys still undecided are split by
// the bit (AVX-512 compress into `scratch`, which may be `key` itself when
// it can be overwritten; n + 16 entries, as whole vectors are stored):
// when at least `need` have it set, the others fall below the threshold,
// else those with it set are all above it. The set shrinks about by half per bit once the bits separate
// the keys, instead of n keys counted per bit. When the set is exactly the
// keys still needed, the threshold is its smallest key.
[[gnu::target("avx512f")]] uint32_t KthThresholdAvx512(const uint32_t* key, int n, int k, int* ge,
                                                       uint32_t* scratch) {
  __m512i lo = _mm512_set1_epi32(-1), hi = _mm512_setzero_si512();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 tail = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    const __m512i x = _mm512_maskz_loadu_epi32(tail, key + i);
    lo = _mm512_mask_min_epu32(lo, tail, lo, x);
    hi = _mm512_mask_max_epu32(hi, tail, hi, x);
  }
  const uint32_t mn = _mm512_reduce_min_epu32(lo), mx = _mm512_reduce_max_epu32(hi);
  if (mn == mx) return *ge = n, mx;
  const int top = 31 - __builtin_clz(mn ^ mx);
  uint32_t prefix = top == 31 ? 0u : mx & (~0u << (top + 1));
  const uint32_t* cur = key;
  int m = n, need = k, above = 0;
  for (int bit = top; bit >= 0; --bit) {
    const __m512i b = _mm512_set1_epi32((int)(1u << bit));
    int set = 0;
    for (int i = 0; i < m; i += 16) {
      const __mmask16 tail = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
      const __m512i x = _mm512_maskz_loadu_epi32(tail, cur + i);
      set += __builtin_popcount(_mm512_mask_test_epi32_mask(tail, x, b));
    }
    const bool keep_set = set >= need;
    int o = 0;
    for (int i = 0; i < m; i += 16) {
      const __mmask16 tail = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
      const __m512i x = _mm512_maskz_loadu_epi32(tail, cur + i);
      const __mmask16 keep = keep_set ? _mm512_mask_test_epi32_mask(tail, x, b)
                                      : _mm512_mask_testn_epi32_mask(tail, x, b);
      _mm512_storeu_si512(scratch + o, _mm512_maskz_compress_epi32(keep, x));
      o += __builtin_popcount(keep);
    }
    cur = scratch, m = o;
    if (keep_set) {
      prefix |= 1u << bit;
    } else {
      need -= set, above += set;
    }
    if (m == need) {  // exactly the keys still needed: all of them are in
      __m512i least = _mm512_set1_epi32(-1);
      for (int i = 0; i < m; i += 16) {
        const __mmask16 tail = m - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - i)) - 1);
        least = _mm512_mask_min_epu32(least, tail, least, _mm512_maskz_loadu_epi32(tail, cur + i));
      }
      *ge = above + m;
      return _mm512_reduce_min_epu32(least);
    }
  }
  *ge = above + m;  // m keys equal the threshold
  return prefix;
}

// CompactPortable (below) with AVX-512 compress into a register and a
// masked store (the compress-to-memory form is slow on some cores).
[[gnu::target("avx512f")]] void CompactAvx512(const uint32_t* ck, const int32_t* ci, int c, uint32_t thr,
                                              int32_t* out) {
  const __m512i tv = _mm512_set1_epi32((int)thr);
  for (int i = 0; i < c; i += 16) {
    const __mmask16 tail = c - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (c - i)) - 1);
    const __mmask16 m = _mm512_mask_cmpge_epu32_mask(tail, _mm512_maskz_loadu_epi32(tail, ck + i), tv);
    const int n = __builtin_popcount(m);
    const __m512i kept = _mm512_maskz_compress_epi32(m, _mm512_maskz_loadu_epi32(tail, ci + i));
    _mm512_mask_storeu_epi32(out, (__mmask16)((1u << n) - 1), kept);
    out += n;
  }
}
#endif

inline uint32_t KthThresholdPortable(const uint32_t* key, int n, int k, int* ge, uint32_t*) {
  return KthThreshold(key, n, k, ge);
}

// out[0..) = ci[i] for the i < c with ck[i] >= thr, in order; writes
// exactly that many entries.
inline void CompactPortable(const uint32_t* ck, const int32_t* ci, int c, uint32_t thr, int32_t* out) {
  for (int i = 0; i < c; ++i)
    if (ck[i] >= thr) *out++ = ci[i];
}

struct Kernels {
  void (*f32)(const QueryRow&, const float*, int, int, float*) = TileScoresF32;
  void (*i8)(const QueryRow&, const uint8_t*, const float*, int, int, float*) = TileScoresI8Portable;
  int (*i8_collect)(const QueryRow&, const uint8_t*, const float*, int, int, int, int, uint32_t,
                    uint32_t*, int32_t*, int) = TileCollectI8Portable;
  void (*i8_collect_rows)(const TileRows&, const uint8_t*, const float*, int, int, int) =
      TileCollectRowsI8Portable;
  int (*collect)(const float*, int, int, uint32_t, uint32_t*, int32_t*, int) = CollectPortable;
  void (*compact)(const uint32_t*, const int32_t*, int, uint32_t, int32_t*) = CompactPortable;
  uint32_t (*threshold)(const uint32_t*, int, int, int*, uint32_t*) = KthThresholdPortable;
};

// The kernels of one ISA (UseDsaKernelIsa): int8 scores by VNNI where the
// CPU has it (avx512), else AVX2's (avx2 and avx512); candidates and
// compaction by AVX-512 compress (avx512) or AVX2 permutes (avx2); the
// portable ones for scalar. Every table gives the same selection bits.
Kernels MakeKernels(detail::Isa isa) {
  Kernels out;
  if (isa != detail::Isa::kAvx512) out.f32 = TileScoresF32x8;
#ifdef DSA_HAVE_VNNI_KERNEL
  if (isa != detail::Isa::kScalar) {
    out.i8 = cpu::dsa::TileScoresI8Avx2;
    out.i8_collect = cpu::dsa::TileCollectI8Avx2;
    out.i8_collect_rows = cpu::dsa::TileCollectRowsI8Avx2;
    out.collect = cpu::dsa::CollectAvx2, out.compact = cpu::dsa::CompactAvx2;
    out.threshold = cpu::dsa::KthThresholdAvx2;
  }
  if (isa == detail::Isa::kAvx512) {
    out.collect = CollectAvx512, out.compact = CompactAvx512, out.threshold = KthThresholdAvx512;
    if (GetCpuInfo().avx512_vnni) {
      out.i8 = TileScoresI8Vnni;
      out.i8_collect = TileCollectI8Vnni;
      out.i8_collect_rows = TileCollectRowsI8Vnni;
    }
  }
#endif
  return out;
}

const Kernels& Pick() {
  static const Kernels tables[3] = {MakeKernels(detail::Isa::kScalar), MakeKernels(detail::Isa::kAvx2),
                                    MakeKernels(detail::Isa::kAvx512)};
  return tables[static_cast<int>(detail::ActiveIsa())];
}

// Candidates of one row on tile number `tile` of kt: scores, then the keys
// at or above tau (see CollectVectors).
DSA_INLINE int TileCandidates(const IndexerParams& p, const KeyTiles& kt, const Kernels& k, int b,
                              int64_t tile, const QueryRow& r, int valid, uint32_t tau,
                              uint32_t* ckey, int32_t* cidx, int c) {
  const int64_t first = (int64_t)b * kt.ld + tile * kTile;
  if (p.precision == IndexerPrecision::kInt8)
    return k.i8_collect(r, kt.i8.data() + first * kt.Dg * 4, kt.scale.data() + first, p.Hi, kt.Dg,
                        valid, (int)(tile * kTile), tau, ckey, cidx, c);
  alignas(64) float sc[kTile];
  k.f32(r, kt.f32.data() + first * p.Di, p.Hi, p.Di, sc);
  return k.collect(sc, valid, (int)(tile * kTile), tau, ckey, cidx, c);
}

// Scores of one row on tile number `tile` of kt (batch element b).
DSA_INLINE void TileScores(const IndexerParams& p, const KeyTiles& kt, const Kernels& k, int b,
                           int64_t tile, const QueryRow& r, float* sc) {
  const int64_t first = (int64_t)b * kt.ld + tile * kTile;
  if (p.precision == IndexerPrecision::kInt8)
    k.i8(r, kt.i8.data() + first * kt.Dg * 4, kt.scale.data() + first, p.Hi, kt.Dg, sc);
  else
    k.f32(r, kt.f32.data() + first * p.Di, p.Hi, p.Di, sc);
}

inline int VisibleKeys(int Tq, int Tk, int t) { return std::max(0, std::min(Tk, Tk - Tq + t + 1)); }

// Sample keys visible to a row that sees n keys: i with 16 i + offset < n.
inline int VisibleSample(int n) { return n > kSampleOffset ? (n - kSampleOffset + kSampleStep - 1) / kSampleStep : 0; }

// Floats of a row's int8 query state: q8 [Hi][Dg*4] bytes, c [Hi], corr [Hi].
inline int64_t QuantFloats(int Hi, int Di) { return (int64_t)Hi * ((Di + 3) / 4) + 2 * Hi + 1; }

// The int8 query of a row (q->qi, q->w set): q8 per head (zero-padded to
// Dg*4), c = w * scale_q, corr = 128 * sum(q8) (the keys' +128 offset).
void QuantizeQuery(int Hi, int Di, float* base, QueryRow* q) {
  const int Dg = (Di + 3) / 4;
  int8_t* q8 = reinterpret_cast<int8_t*>(base);  // Hi * Dg * 4 bytes = Hi * Dg floats
  float* c = base + (int64_t)Hi * Dg;
  int32_t* corr = reinterpret_cast<int32_t*>(c + Hi);
  std::memset(q8, 0, (size_t)Hi * Dg * 4);
  for (int j = 0; j < Hi; ++j) {
    float sq;
    QuantizeRow(q->qi + (int64_t)j * Di, Di, q8 + (int64_t)j * Dg * 4, &sq);
    int32_t sum = 0;
    for (int d = 0; d < Di; ++d) sum += q8[(int64_t)j * Dg * 4 + d];
    c[j] = q->w[j] * sq;
    corr[j] = 128 * sum;
  }
  q->q8 = q8, q->c = c, q->corr = corr;
}

// The selection among c >= K candidates (keys in ascending order): every
// candidate above the threshold, then the first (lowest s) ones equal to
// it. When exactly K candidates reach the threshold (no tie straddles it:
// the usual case), the compaction kernel takes them; otherwise a
// branch-free scalar loop (whether a candidate is in is a coin flip).
void SelectAmongCandidates(const Kernels& kern, const uint32_t* ck, const int32_t* ci, int c, int K,
                           int32_t* out) {
  int ge = 0;
  uint32_t* scratch = reinterpret_cast<uint32_t*>(ThreadWorkspace(kSlotSelect, (int64_t)c + 16));
  const uint32_t thr = kern.threshold(ck, c, K, &ge, scratch);
  if (ge == K) {
    kern.compact(ck, ci, c, thr, out);
    return;
  }
  int above = 0;
  for (int i = 0; i < c; ++i) above += ck[i] > thr ? 1 : 0;
  int equal_left = K - above, o = 0;
  for (int i = 0; i < c && o < K; ++i) {
    const int eq = (ck[i] == thr) & (equal_left > 0);
    const int take = (ck[i] > thr) | eq;
    out[o] = ci[i];
    o += take;
    equal_left -= eq;
  }
}

// Few query rows (decode): no per-call layout of every key and no sample.
// Each row walks the keys 64 at a time, lays out just those in the tile
// format (BuildTiles' code for one tile), and keeps every key as a
// candidate; then the exact selection. The tile kernels are the ones of
// the blocked path, so the scores, and the selection, are the same bits.
// The candidates (every key) of one query row over key tiles [tile0,
// tile1), appended to (ckey, cidx); returns the new count. Lays out one
// tile at a time (BuildTiles' code for one tile) into thread-local buffers.
int DirectTiles(const IndexerParams& p, const Kernels& kern, const QueryRow& q, int b,
                int n, int64_t tile0, int64_t tile1, uint32_t* ckey, int32_t* cidx, int count) {
  const int Tk = p.Tk, Hi = p.Hi, Di = p.Di, Dg = (Di + 3) / 4;
  const bool int8 = p.precision == IndexerPrecision::kInt8;
  alignas(64) float sc[kTile];
  alignas(64) float scale[kTile];
  float* tile_f32 = int8 ? nullptr : ThreadWorkspace(kSlotSample, (int64_t)Di * kTile);
  uint8_t* tile_i8 = int8 ? reinterpret_cast<uint8_t*>(ThreadWorkspace(kSlotSample, (int64_t)Dg * kTile)) : nullptr;
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const int s0 = (int)(tile * kTile), m = std::min(kTile, Tk - s0);
    if (int8) {
      std::memset(tile_i8, 128, (size_t)Dg * kTile * 4);
      for (int i = 0; i < kTile; ++i) scale[i] = 0.f;
      for (int i = 0; i < m; ++i) LayOutKey(IndexerKeyRow(p, b, s0 + i), Di, i, nullptr, tile_i8, scale);
      count = kern.i8_collect(q, tile_i8, scale, Hi, Dg, n - s0, s0, 0, ckey, cidx, count);
    } else {
      std::memset(tile_f32, 0, (size_t)Di * kTile * sizeof(float));
      for (int i = 0; i < m; ++i) LayOutKey(IndexerKeyRow(p, b, s0 + i), Di, i, tile_f32, nullptr, nullptr);
      kern.f32(q, tile_f32, Hi, Di, sc);
      count = kern.collect(sc, n - s0, s0, 0, ckey, cidx, count);
    }
  }
  return count;
}

// Few query rows (decode): no per-call layout of every key and no sample.
// Each row walks the keys 64 at a time, laying out just those in the tile
// format, and keeps every key as a candidate; then the exact selection.
// The tile kernels are the ones of the blocked path, so the scores, and the
// selection, are the same bits. Long rows split their tiles over the
// threads in contiguous ranges, concatenated in order (the same list).
void IndexerTopKDirect(const IndexerParams& p, const Kernels& kern) {
  const int Tq = p.Tq, Tk = p.Tk, Hi = p.Hi, Di = p.Di, K = p.K;
  std::vector<float> quant(QuantFloats(Hi, Di));
  std::vector<uint32_t> ckey((size_t)Tk + 16);
  std::vector<int32_t> cidx((size_t)Tk + 16);
  for (int b = 0; b < p.B; ++b)
    for (int t = 0; t < Tq; ++t) {
      const int n = VisibleKeys(Tq, Tk, t);
      int32_t* out = p.idx + b * p.idx_batch_stride + (int64_t)t * K;
      if (n <= K) {
        for (int i = 0; i < K; ++i) out[i] = i < n ? i : -1;
        continue;
      }
      QueryRow q;
      q.qi = p.qi + b * p.qi_batch_stride + (int64_t)t * Hi * Di;
      q.w = p.wi + b * p.wi_batch_stride + (int64_t)t * Hi;
      if (p.precision == IndexerPrecision::kInt8) QuantizeQuery(Hi, Di, quant.data(), &q);
      const int64_t tiles = (n + kTile - 1) / kTile;
      const int threads = omp_in_parallel() || (int64_t)n * Hi * Di < (int64_t{1} << 20)
                              ? 1 : std::min<int>(omp_get_max_threads(), (int)tiles);
      if (threads == 1) {
        const int count = DirectTiles(p, kern, q, b, n, 0, tiles, ckey.data(), cidx.data(), 0);
        SelectAmongCandidates(kern, ckey.data(), cidx.data(), count, K, out);
        continue;
      }
      // Thread r takes tiles [tiles*r/threads, tiles*(r+1)/threads) into its
      // own slice of the buffers (offset by its first key), then the slices
      // are packed in order.
      if ((int64_t)ckey.size() < tiles * kTile + 16 * (threads + 1)) {
        ckey.resize(tiles * kTile + 16 * (threads + 1));
        cidx.resize(ckey.size());
      }
      std::vector<int> got(threads);
#pragma omp parallel num_threads(threads)
      {
        const int r = omp_get_thread_num();
        const int64_t t0 = tiles * r / threads, t1 = tiles * (r + 1) / threads;
        const int64_t off = t0 * kTile + 16 * r;
        got[r] = DirectTiles(p, kern, q, b, n, t0, t1, ckey.data() + off, cidx.data() + off, 0);
      }
      int count = 0;
      for (int r = 0; r < threads; ++r) {
        const int64_t off = tiles * r / threads * kTile + 16 * r;
        std::memmove(ckey.data() + count, ckey.data() + off, got[r] * sizeof(uint32_t));
        std::memmove(cidx.data() + count, cidx.data() + off, got[r] * sizeof(int32_t));
        count += got[r];
      }
      SelectAmongCandidates(kern, ckey.data(), cidx.data(), count, K, out);
    }
}

}  // namespace

void IndexerTopK(const IndexerParams& p) {
  CHECK_MSG(p.B > 0 && p.Tq > 0 && p.Tk >= p.Tq && p.Hi > 0 && p.Di > 0 && p.K > 0,
            "[dsa_indexer_topk] invalid arguments");
  CHECK_MSG(p.qi && p.ki && p.wi && p.idx, "[dsa_indexer_topk] invalid arguments");
  CHECK_MSG(p.precision == IndexerPrecision::kFp32 ||
                (p.precision == IndexerPrecision::kInt8 && p.Di <= kMaxInt8Dim),
            "[dsa_indexer_topk] the int8 indexer takes Di <= %d, got %d", kMaxInt8Dim, p.Di);
  const int B = p.B, Tq = p.Tq, Tk = p.Tk, Hi = p.Hi, Di = p.Di, K = p.K;
  const bool int8 = p.precision == IndexerPrecision::kInt8;
  const bool any_select = VisibleKeys(Tq, Tk, Tq - 1) > K;
  const bool par = (int64_t)B * Tq * (Tk - Tq / 2) * Hi * Di >= (int64_t{1} << 20);
  const Kernels& kern = Pick();
  if ((int64_t)B * Tq <= kDirectMaxRows) return IndexerTopKDirect(p, kern);
  KeyTiles keys, sample;
  if (any_select) {
    BuildTiles(p, Tk, [](int i) { return i; }, par, &keys);
    const int ns = VisibleSample(Tk);
    BuildTiles(p, ns, [](int i) { return kSampleStep * i + kSampleOffset; }, par, &sample);
  }
  const int64_t cap = (keys.ld > 0 ? keys.ld : kTile) + 16;  // candidates per row (+ compress slack)
  const int64_t blocks = ((int64_t)Tq + kRowBlock - 1) / kRowBlock;
  const int rank = std::max(4, 3 * K / 32);  // sample rank of tau: ~1.5 K candidates

#pragma omp parallel for schedule(dynamic, 1) if (par)
  for (int64_t task = 0; task < (int64_t)B * blocks; ++task) {
    // Later rows see more keys: take them first, so the schedule ends evenly.
    const int64_t rev = (int64_t)B * blocks - 1 - task;
    const int b = (int)(rev / blocks), t0 = (int)(rev % blocks) * kRowBlock;
    const int nr = std::min(kRowBlock, Tq - t0);
    uint32_t* ckey = reinterpret_cast<uint32_t*>(ThreadWorkspace(kSlotCandKey, (int64_t)nr * cap));
    int32_t* cidx = reinterpret_cast<int32_t*>(ThreadWorkspace(kSlotCandIdx, (int64_t)nr * cap));
    // Per row: int8 query, c, corr (int8) and the tile scores of the sample.
    float* quant = ThreadWorkspace(kSlotQuant, (int64_t)nr * QuantFloats(Hi, Di));
    QueryRow rows[kRowBlock];
    int n[kRowBlock], count[kRowBlock];
    uint32_t tau[kRowBlock];
    int nmax = 0;
    for (int r = 0; r < nr; ++r) {
      const int t = t0 + r;
      n[r] = VisibleKeys(Tq, Tk, t);
      count[r] = 0;
      QueryRow& q = rows[r];
      q.qi = p.qi + b * p.qi_batch_stride + (int64_t)t * Hi * Di;
      q.w = p.wi + b * p.wi_batch_stride + (int64_t)t * Hi;
      if (n[r] <= K) continue;
      nmax = std::max(nmax, n[r]);
      if (int8) QuantizeQuery(Hi, Di, quant + (int64_t)r * QuantFloats(Hi, Di), &q);
      // tau: the score of rank `rank` among the row's visible sample keys.
      const int ms = VisibleSample(n[r]);
      tau[r] = 0;
      if (ms >= 2 * rank) {
        float* ss = ThreadWorkspace(kSlotSample, (ms + kTile - 1) / kTile * kTile);
        for (int64_t tile = 0; tile * kTile < ms; ++tile)
          TileScores(p, sample, kern, b, tile, q, ss + tile * kTile);
        uint32_t* sk = ckey + (int64_t)r * cap;  // scratch: the row's candidate space
        for (int i = 0; i < ms; ++i) sk[i] = OrderedKey(ss[i]);
        int ge = 0;
        tau[r] = kern.threshold(sk, ms, rank, &ge, sk);
      }
    }
    // The tiles, shared by the block's rows.
    const TileRows block{rows, n, tau, ckey, cidx, count, cap, nr, K};
    for (int64_t tile = 0; tile * kTile < nmax; ++tile) {
      const int s0 = (int)(tile * kTile);
      if (int8) {
        const int64_t first = (int64_t)b * keys.ld + tile * kTile;
        kern.i8_collect_rows(block, keys.i8.data() + first * keys.Dg * 4, keys.scale.data() + first, Hi,
                             keys.Dg, s0);
        continue;
      }
      for (int r = 0; r < nr; ++r) {
        if (n[r] <= K || s0 >= n[r]) continue;
        count[r] = TileCandidates(p, keys, kern, b, tile, rows[r], n[r] - s0, tau[r],
                                  ckey + (int64_t)r * cap, cidx + (int64_t)r * cap, count[r]);
      }
    }
    for (int r = 0; r < nr; ++r) {
      const int t = t0 + r;
      int32_t* out = p.idx + b * p.idx_batch_stride + (int64_t)t * K;
      if (n[r] <= K) {
        for (int i = 0; i < K; ++i) out[i] = i < n[r] ? i : -1;
        continue;
      }
      uint32_t* ck = ckey + (int64_t)r * cap;
      int32_t* ci = cidx + (int64_t)r * cap;
      if (count[r] < K) {  // tau let too few through: every key is a candidate
        count[r] = 0;
        for (int64_t tile = 0; tile * kTile < n[r]; ++tile) {
          count[r] = TileCandidates(p, keys, kern, b, tile, rows[r], n[r] - (int)(tile * kTile), 0,
                                    ck, ci, count[r]);
        }
      }
      SelectAmongCandidates(kern, ck, ci, count[r], K, out);
    }
  }
}

}  // namespace myriad::cpu::dsa
