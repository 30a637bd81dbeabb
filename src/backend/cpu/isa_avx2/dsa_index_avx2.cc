// The DSA indexer's int8 tile scores and candidate compress for AVX2 + FMA
// (contracts in backend/cpu/dsa/index_kernels.h; the same bits as the
// portable kernels of backend/cpu/dsa/dsa_indexer.cc).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/dsa/index_kernels.h"

namespace myriad::cpu::dsa {
namespace {

// kPerm[m]: byte i = the lane of the i-th set bit of m (the rest 0), the
// vpermd indices that pack the lanes of m to the front. Built at compile
// time: this TU's code must not run before the CPU is known to have AVX2.
struct PermTable {
  uint64_t e[256];
};
constexpr PermTable MakePerm() {
  PermTable t{};
  for (int m = 0; m < 256; ++m) {
    uint64_t v = 0;
    int o = 0;
    for (int l = 0; l < 8; ++l)
      if (m >> l & 1) v |= (uint64_t)l << (8 * o++);
    t.e[m] = v;
  }
  return t;
}
constexpr PermTable kPerm = MakePerm();

inline __m256i PermOf(int m) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&kPerm.e[m])));
}

// The 64 int8 scores of a tile in 8 vectors, 8 keys (one vector) at a time
// over every head: 4 int32 accumulators, the key vector and its magnitudes
// stay in registers (with two vectors at a time, or the groups unrolled,
// GCC spilled the accumulators: ~10% slower).
// kHi / kDg: the shape as compile-time constants (0: run-time Hi / Dg).
template <int kHi, int kDg>
[[gnu::always_inline]] inline void Scores(const IndexQueryRow& r, const uint8_t* tile, const float* ks,
                                          int hi_rt, int dg_rt, __m256 out[8]) {
  const int Hi = kHi ? kHi : hi_rt, Dg = kDg ? kDg : dg_rt;
  const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
  const __m256i zero = _mm256_setzero_si256();
  for (int p = 0; p < kIndexTile / 8; ++p) {
    __m256 t = _mm256_setzero_ps();
    for (int j = 0; j < Hi; j += 4) {
      const int nh = std::min(4, Hi - j);
      __m256i a[4] = {zero, zero, zero, zero};
#pragma GCC unroll 2
      for (int g = 0; g < Dg; ++g) {
        const uint8_t* tp = tile + (size_t)g * kIndexTile * 4 + p * 32;
        const __m256i k = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tp)), flip);
        const __m256i u = _mm256_abs_epi8(k);
#pragma GCC unroll 4
        for (int h = 0; h < 4; ++h) {
          if (h >= nh) break;
          int32_t q4;
          std::memcpy(&q4, r.q8 + (int64_t)(j + h) * Dg * 4 + g * 4, 4);
          a[h] = _mm256_add_epi32(
              a[h], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(_mm256_set1_epi32(q4), k)), ones));
        }
      }
      for (int h = 0; h < nh; ++h)
        t = _mm256_fmadd_ps(_mm256_set1_ps(r.c[j + h]), _mm256_cvtepi32_ps(_mm256_max_epi32(a[h], zero)), t);
    }
    out[p] = _mm256_mul_ps(t, _mm256_loadu_ps(ks + 8 * p));
  }
}

[[gnu::always_inline]] inline void ScoresAny(const IndexQueryRow& r, const uint8_t* tile, const float* ks,
                                             int Hi, int Dg, __m256 out[8]) {
  if (Hi == 4 && Dg == 8)
    Scores<4, 8>(r, tile, ks, Hi, Dg, out);
  else
    Scores<0, 0>(r, tile, ks, Hi, Dg, out);
}

// The lanes i < valid of 64 scores with OrderedKey >= tau, appended in lane
// order; branch-free. OrderedKey's unsigned order is the signed order of
// key ^ sign, so the keys are compared as u ^ (u < 0 ? 0x7fffffff : 0).
[[gnu::always_inline]] inline int CollectVectors(const __m256 sc[8], int valid, int s0, uint32_t tau,
                                                 uint32_t* ckey, int32_t* cidx, int c) {
  const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
  const __m256i stau = _mm256_set1_epi32((int)(tau ^ 0x80000000u));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int v = 0; v < kIndexTile / 8; ++v) {
    const int left = valid - 8 * v;
    if (left <= 0) break;
    const __m256i u = _mm256_castps_si256(_mm256_add_ps(sc[v], _mm256_setzero_ps()));
    const __m256i skey = _mm256_xor_si256(u, _mm256_srli_epi32(_mm256_srai_epi32(u, 31), 1));
    int m = ~_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(stau, skey))) & 0xFF;
    if (left < 8) m &= (1 << left) - 1;
    const __m256i perm = PermOf(m);
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(s0 + 8 * v), lanes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(ckey + c),
                        _mm256_permutevar8x32_epi32(_mm256_xor_si256(skey, sign), perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cidx + c), _mm256_permutevar8x32_epi32(idx, perm));
    c += __builtin_popcount(m);
  }
  return c;
}

template <int kHi, int kDg>
[[gnu::always_inline]] inline void CollectRows(const IndexTileRows& b, const uint8_t* tile, const float* ks,
                                               int Hi, int Dg, int s0) {
  for (int r = 0; r < b.nr; ++r) {
    if (b.n[r] <= b.K || s0 >= b.n[r]) continue;
    __m256 v[8];
    Scores<kHi, kDg>(b.rows[r], tile, ks, Hi, Dg, v);
    b.count[r] = CollectVectors(v, b.n[r] - s0, s0, b.tau[r], b.ckey + r * b.cap, b.cidx + r * b.cap,
                                b.count[r]);
  }
}

}  // namespace

void TileScoresI8Avx2(const IndexQueryRow& r, const uint8_t* tile, const float* ks, int Hi, int Dg,
                      float* sc) {
  __m256 v[8];
  ScoresAny(r, tile, ks, Hi, Dg, v);
  for (int i = 0; i < 8; ++i) _mm256_storeu_ps(sc + 8 * i, v[i]);
}

int TileCollectI8Avx2(const IndexQueryRow& r, const uint8_t* tile, const float* ks, int Hi, int Dg,
                      int valid, int s0, uint32_t tau, uint32_t* ckey, int32_t* cidx, int c) {
  __m256 v[8];
  ScoresAny(r, tile, ks, Hi, Dg, v);
  return CollectVectors(v, valid, s0, tau, ckey, cidx, c);
}

void TileCollectRowsI8Avx2(const IndexTileRows& b, const uint8_t* tile, const float* ks, int Hi, int Dg,
                           int s0) {
  if (Hi == 4 && Dg == 8)
    CollectRows<4, 8>(b, tile, ks, Hi, Dg, s0);
  else
    CollectRows<0, 0>(b, tile, ks, Hi, Dg, s0);
}

int CollectAvx2(const float* sc, int valid, int s0, uint32_t tau, uint32_t* ckey, int32_t* cidx, int c) {
  __m256 v[8];
  for (int i = 0; i < 8; ++i) v[i] = _mm256_loadu_ps(sc + 8 * i);
  return CollectVectors(v, valid, s0, tau, ckey, cidx, c);
}

// Writes exactly the kept entries (out is a selection row: the next row may
// belong to another thread), so the last partial vector goes through a
// masked store.
void CompactAvx2(const uint32_t* ck, const int32_t* ci, int c, uint32_t thr, int32_t* out) {
  const __m256i sign = _mm256_set1_epi32((int)0x80000000u);
  const __m256i st = _mm256_set1_epi32((int)(thr ^ 0x80000000u));
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int i = 0;
  for (; i + 8 <= c; i += 8) {
    const __m256i sk = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ck + i)), sign);
    const int m = ~_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(st, sk))) & 0xFF;
    const int n = __builtin_popcount(m);
    const __m256i kept = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ci + i)), PermOf(m));
    _mm256_maskstore_epi32(out, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes), kept);
    out += n;
  }
  for (; i < c; ++i)
    if (ck[i] >= thr) *out++ = ci[i];
}

// The shrinking-set search of backend/cpu/dsa/dsa_indexer.cc's KthThresholdAvx512
// with 8-lane compares and the permute table: per bit, the undecided keys
// are split by the bit and only one side is kept (about half), instead of
// all n keys counted once per bit.
uint32_t KthThresholdAvx2(const uint32_t* key, int n, int k, int* ge, uint32_t* scratch) {
  __m256i vlo = _mm256_set1_epi32(-1), vhi = _mm256_setzero_si256();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + i));
    vlo = _mm256_min_epu32(vlo, x), vhi = _mm256_max_epu32(vhi, x);
  }
  alignas(32) uint32_t l8[8], h8[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l8), vlo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(h8), vhi);
  uint32_t mn = ~0u, mx = 0;
  for (int l = 0; l < 8; ++l) mn = std::min(mn, l8[l]), mx = std::max(mx, h8[l]);
  for (; i < n; ++i) mn = std::min(mn, key[i]), mx = std::max(mx, key[i]);
  if (mn == mx) return *ge = n, mx;
  const int top = 31 - __builtin_clz(mn ^ mx);
  uint32_t prefix = top == 31 ? 0u : mx & (~0u << (top + 1));
  const uint32_t* cur = key;
  int m = n, need = k, above = 0;
  for (int bit = top; bit >= 0; --bit) {
    const uint32_t bv = 1u << bit;
    const __m256i b = _mm256_set1_epi32((int)bv);
    int set = 0;
    for (i = 0; i + 8 <= m; i += 8) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur + i));
      set += __builtin_popcount(
          _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(x, b), b))));
    }
    for (; i < m; ++i) set += (cur[i] & bv) ? 1 : 0;
    const bool keep_set = set >= need;
    const int flip = keep_set ? 0 : 0xFF;
    // In place is safe: each store lands at or before the vector just read.
    int o = 0;
    for (i = 0; i + 8 <= m; i += 8) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur + i));
      const int keep =
          _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(x, b), b))) ^ flip;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(scratch + o), _mm256_permutevar8x32_epi32(x, PermOf(keep)));
      o += __builtin_popcount(keep);
    }
    for (; i < m; ++i) {
      const uint32_t x = cur[i];
      scratch[o] = x;
      o += ((x & bv) != 0) == keep_set ? 1 : 0;
    }
    cur = scratch, m = o;
    if (keep_set) {
      prefix |= bv;
    } else {
      need -= set, above += set;
    }
    if (m == need) {  // exactly the keys still needed: all of them are in
      uint32_t least = ~0u;
      for (i = 0; i < m; ++i) least = std::min(least, cur[i]);
      *ge = above + m;
      return least;
    }
  }
  *ge = above + m;  // m keys equal the threshold
  return prefix;
}

}  // namespace myriad::cpu::dsa
