// BF16 GEMM with fp32 accumulation (BackendOps::gemm_bf16) on AVX512-BF16.
//
// GotoBLAS/BLIS structure:
//   for jc (NC columns of C)        B block [KC x NC] packed once, shared
//     for pc (KC of K)
//       for ic (MC rows of C)       A block [MC x KC] packed per thread
//         for jr (NR) for ir (MR)   micro-kernel: MR x NR tile in zmm
// Packing converts fp32 -> bf16 (vcvtne2ps2bf16, round to nearest even) and
// lays pairs along K next to each other, which is what vdpbf16ps consumes:
// a packed panel of R "rows" (R = MR rows of op(A), or NR columns of op(B))
// is, for each k pair p, R uint32 words {bf16(x[r][2p]), bf16(x[r][2p+1])}.
// Odd K and ragged rows are padded with zeros while packing.
//
// Determinism: every C element is the sum over KC blocks in increasing k
// order, each block reduced by one micro-kernel call in a fixed order; the
// thread count only changes which thread computes a tile, never the order.
//
// Only this file uses AVX512-BF16; the entry point is registered only when
// cpuid reports it (ops_avx512.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC target("avx512bf16")

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "backend/backend.h"

namespace myriad::cpu {
namespace {

constexpr int kMR = 12;            // rows of a micro-tile
constexpr int kNV = 2;             // zmm per micro-tile row
constexpr int kNR = 16 * kNV;      // columns of a micro-tile
constexpr int64_t kKC = 1024;      // K per block at most (even)
constexpr int64_t kMC = 192;       // rows of op(A) per packed block (multiple of kMR)
constexpr int64_t kNC = 3072;      // columns of op(B) per packed block (multiple of kNR)

// Grow-only 64-byte-aligned scratch, one per thread that ever packs.
struct Scratch {
  uint32_t* p = nullptr;
  size_t n = 0;
  ~Scratch() { std::free(p); }
  uint32_t* Get(size_t words) {
    if (words > n) {
      std::free(p);
      size_t bytes = (words * sizeof(uint32_t) + 63) / 64 * 64;
      p = static_cast<uint32_t*>(std::aligned_alloc(64, bytes));
      n = words;
    }
    return p;
  }
};
thread_local Scratch tls_a, tls_b;

inline __mmask16 Mask16(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

// 32 fp32 (two vectors lo = k 0..15, hi = k 16..31) -> 16 bf16 pairs in k order.
inline __m512i CvtPairs(__m512 lo, __m512 hi) {
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// In-register transpose of a 16x16 matrix of 32-bit words.
inline void Transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i + 0], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// Packs rows [0, nr) x k [0, kc) of a fp32 matrix with element (r, k) at
// src[r * rs + k * ks] (one of rs, ks is 1) into a panel of R rows:
// dst[p * R + r] = pair p of row r, zero for r >= nr and k >= kc.
// kp = ceil(kc / 2) pairs are written.
template <int R>
void PackPanel(const float* src, int64_t rs, int64_t ks, int64_t nr, int64_t kc,
               uint32_t* dst) {
  const int64_t kp = (kc + 1) / 2;
  if (ks == 1) {
    // Rows are contiguous in k: convert 32 k of 16 rows, transpose 16x16.
    for (int64_t r0 = 0; r0 < R; r0 += 16) {
      const int64_t rows = std::min<int64_t>(16, std::max<int64_t>(0, nr - r0));
      const __mmask16 smask = Mask16(std::min<int64_t>(16, R - r0));
      for (int64_t p0 = 0; p0 < kp; p0 += 16) {
        const int64_t k0 = 2 * p0;
        const __mmask16 mlo = Mask16(std::max<int64_t>(0, kc - k0));
        const __mmask16 mhi = Mask16(std::max<int64_t>(0, kc - k0 - 16));
        __m512i v[16];
        for (int i = 0; i < 16; ++i) {
          if (i < rows) {
            const float* s = src + (r0 + i) * rs + k0;
            v[i] = CvtPairs(_mm512_maskz_loadu_ps(mlo, s), _mm512_maskz_loadu_ps(mhi, s + 16));
          } else {
            v[i] = _mm512_setzero_si512();
          }
        }
        Transpose16(v);
        const int64_t np = std::min<int64_t>(16, kp - p0);
        for (int64_t p = 0; p < np; ++p)
          _mm512_mask_storeu_epi32(dst + (p0 + p) * R + r0, smask, v[p]);
      }
    }
  } else {
    // Rows are contiguous in r (rs == 1): rows k and k+1 of 16 r's convert
    // to 32 bf16 [k row | k+1 row], interleaved with one vpermw.
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    for (int64_t r0 = 0; r0 < R; r0 += 16) {
      const int64_t rows = std::min<int64_t>(16, std::max<int64_t>(0, nr - r0));
      const __mmask16 lmask = Mask16(rows);
      const __mmask16 smask = Mask16(std::min<int64_t>(16, R - r0));
      for (int64_t p = 0; p < kp; ++p) {
        const int64_t k = 2 * p;
        const float* s = src + k * ks + r0;
        __m512 a = _mm512_maskz_loadu_ps(lmask, s);
        __m512 b = k + 1 < kc ? _mm512_maskz_loadu_ps(lmask, s + ks) : _mm512_setzero_ps();
        __m512i pr = _mm512_permutexvar_epi16(idx, CvtPairs(a, b));
        _mm512_mask_storeu_epi32(dst + p * R + r0, smask, pr);
      }
    }
  }
}

// C[0:m, 0:n] (+)= alpha * Apanel x Bpanel over kp pairs. mode 0: C = alpha
// acc; 1: C = alpha acc + beta C; 2: C += alpha acc.
template <int MR, int NV>
void Micro(int64_t kp, const uint32_t* __restrict a, const uint32_t* __restrict b, float* C,
           int64_t ldc, int64_t m, int64_t n, float alpha, float beta, int mode) {
  __m512 acc[MR][NV];
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
    _mm_prefetch((const char*)(b + 16 * NV * 8), _MM_HINT_T0);
#pragma GCC unroll 32
    for (int i = 0; i < MR; ++i) {
      __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
    }
    a += MR;
    b += 16 * NV;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
    if (i >= m) break;
    float* c = C + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const int64_t nn = n - 16 * v;
      if (nn <= 0) break;
      const __mmask16 mk = Mask16(nn);
      __m512 r = _mm512_mul_ps(acc[i][v], va);
      if (mode == 1) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mk, c + 16 * v), r);
      else if (mode == 2) r = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, c + 16 * v), r);
      _mm512_mask_storeu_ps(c + 16 * v, mk, r);
    }
  }
}

// Tunables (env overrides for tuning runs only; read once).
struct Blocking {
  int64_t kc = kKC, mc = kMC, nc = kNC;
  Blocking() {
    if (const char* e = std::getenv("MYRIAD_BF16_KC")) kc = std::max<int64_t>(2, std::atoll(e) / 2 * 2);
    if (const char* e = std::getenv("MYRIAD_BF16_MC")) mc = std::max<int64_t>(1, std::atoll(e) / kMR) * kMR;
    if (const char* e = std::getenv("MYRIAD_BF16_NC")) nc = std::max<int64_t>(1, std::atoll(e) / kNR) * kNR;
  }
};
const Blocking& Blk() {
  static const Blocking b;
  return b;
}

// K is cut into ceil(K / kc) blocks of equal even size (the last one shorter),
// so no block is a sliver; the cut depends only on K.
int64_t KBlock(int64_t K) {
  const int64_t kc = Blk().kc;
  const int64_t nb = (K + kc - 1) / kc;
  return ((K + nb - 1) / nb + 1) / 2 * 2;
}

// Serial GotoBLAS on C[0:M, 0:N] with this thread's pack buffers.
void GemmTile(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t ars,
              int64_t aks, const float* B, int64_t brs, int64_t bks, float beta, float* C,
              int64_t ldc) {
  const Blocking& bl = Blk();
  const int64_t KC = KBlock(K), MC = bl.mc, NC = bl.nc;
  const int64_t kc_max = std::min<int64_t>(KC, (K + 1) / 2 * 2);
  const int64_t nc_max = std::min<int64_t>(NC, (N + kNR - 1) / kNR * kNR);
  const int64_t mc_max = std::min<int64_t>(MC, (M + kMR - 1) / kMR * kMR);
  uint32_t* bpack = tls_b.Get((size_t)(kc_max / 2) * nc_max);
  uint32_t* apack = tls_a.Get((size_t)(kc_max / 2) * mc_max);
  for (int64_t jc = 0; jc < N; jc += NC) {
    const int64_t nc = std::min<int64_t>(NC, N - jc);
    const int64_t npanels = (nc + kNR - 1) / kNR;
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = std::min<int64_t>(KC, K - pc);
      const int64_t kp = (kc + 1) / 2;
      const int mode = pc > 0 ? 2 : beta == 0.f ? 0 : 1;
      for (int64_t q = 0; q < npanels; ++q) {
        const int64_t j0 = jc + q * kNR;
        PackPanel<kNR>(B + j0 * brs + pc * bks, brs, bks, std::min<int64_t>(kNR, N - j0), kc,
                       bpack + q * kp * kNR);
      }
      for (int64_t ic = 0; ic < M; ic += MC) {
        const int64_t mc = std::min<int64_t>(MC, M - ic);
        for (int64_t i0 = 0; i0 < mc; i0 += kMR)
          PackPanel<kMR>(A + (ic + i0) * ars + pc * aks, ars, aks, std::min<int64_t>(kMR, mc - i0),
                         kc, apack + (i0 / kMR) * kp * kMR);
        for (int64_t q = 0; q < npanels; ++q) {
          const int64_t j0 = jc + q * kNR, nn = std::min<int64_t>(kNR, N - j0);
          const uint32_t* bp = bpack + q * kp * kNR;
          for (int64_t i0 = 0; i0 < mc; i0 += kMR) {
            // Touch the C tile first: with ldc a multiple of 4 KiB its rows
            // alias in L1, and a late write-allocate stalls the stores.
            float* ct = C + (ic + i0) * ldc + j0;
            for (int64_t i = 0; i < std::min<int64_t>(kMR, mc - i0); ++i) {
              _mm_prefetch((const char*)(ct + i * ldc), _MM_HINT_T0);
              _mm_prefetch((const char*)(ct + i * ldc + kNR - 1), _MM_HINT_T0);
            }
            Micro<kMR, kNV>(kp, apack + (i0 / kMR) * kp * kMR, bp, C + (ic + i0) * ldc + j0, ldc,
                            std::min<int64_t>(kMR, mc - i0), nn, alpha, beta, mode);
          }
        }
      }
    }
  }
}

}  // namespace

// Parallel driver: C is cut into mt x nt tiles (rows multiple of kMR, columns
// multiple of kNR), each an independent serial GEMM that packs its own
// panels; tiles are handed out dynamically, so there are no barriers and a
// descheduled thread does not stall the other. Each tile's arithmetic does
// not depend on which thread runs it, hence results are bitwise identical
// for any thread count. The tiling depends only on the shape.
void GemmBf16Avx512(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                    float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || alpha == 0.f) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  // Element (i, k) of op(A) at A[i * ars + k * aks]; (k, j) of op(B) at B[j * brs + k * bks].
  const int64_t ars = ta == Trans::kNo ? lda : 1, aks = ta == Trans::kNo ? 1 : lda;
  const int64_t brs = tb == Trans::kNo ? 1 : ldb, bks = tb == Trans::kNo ? ldb : 1;

  // Tiling from the shape alone: about kUnits tiles of at least ~kMin rows
  // and columns, choosing the split with the least duplicated packing
  // (each row-tile repacks B, each column-tile repacks A).
  constexpr int64_t kUnits = 8, kMin = 128;
  const double flops = 2.0 * M * N * K;
  int64_t best_mt = 1, best_nt = 1;
  if (flops >= 4e6) {
    double best = 1e300;
    const int64_t mmax = std::max<int64_t>(1, M / kMin), nmax = std::max<int64_t>(1, N / kMin);
    for (int64_t mt = 1; mt <= std::min(kUnits, mmax); ++mt) {
      const int64_t nt = std::min(nmax, (kUnits + mt - 1) / mt);
      const int64_t units = mt * nt;
      // Pack overhead plus a penalty for having too few units to balance.
      double cost = (double)mt * N + (double)nt * M + (units < kUnits ? (kUnits - units) * 0.1 * (M + N) : 0);
      if (cost < best) best = cost, best_mt = mt, best_nt = nt;
    }
  }
  const int64_t mt = best_mt, nt = best_nt;
  const int64_t tm = ((M + mt - 1) / mt + kMR - 1) / kMR * kMR;
  const int64_t tn = ((N + nt - 1) / nt + kNR - 1) / kNR * kNR;
  const int64_t gm = (M + tm - 1) / tm, gn = (N + tn - 1) / tn, units = gm * gn;
  const int threads = omp_in_parallel() || units == 1 ? 1 : (int)std::min<int64_t>(omp_get_max_threads(), units);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t i0 = (u / gn) * tm, j0 = (u % gn) * tn;
    GemmTile(std::min(tm, M - i0), std::min(tn, N - j0), K, alpha, A + i0 * ars, ars, aks,
             B + j0 * brs, brs, bks, beta, C + i0 * ldc + j0, ldc);
  }
}

}  // namespace myriad::cpu
