// The DSA kernels' vector primitives: 16-lane blocks written with GCC
// vector extensions, so that one body compiles for AVX-512, AVX2 and
// baseline x86-64 (DSA_KERNEL); always_inline, so they take the ISA of the
// variant that calls them.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cpu/impl/common.h"  // ExpF

#define DSA_CHECK(op, cond) CHECK_MSG(cond, "[%s] invalid arguments", op)

#define DSA_INLINE [[gnu::always_inline]] inline

namespace myriad::cpu::dsa::detail {
// The ISA of the kernel variants in use (UseDsaKernelIsa, dsa.h; dsa.cc).
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
Isa ActiveIsa();
}  // namespace myriad::cpu::dsa::detail

// A kernel compiled once per kernel ISA (x86-64-v4, x86-64-v3 and baseline
// x86-64: its body is always_inline into three wrappers, each built for its
// target) and called in the variant ActiveIsa() names. So UseDsaKernelIsa
// and MYRIAD_CPU_ISA reach every DSA kernel, and the tests run each
// variant on one CPU; nothing follows the CPU behind their back. Use:
//   DSA_KERNEL(void, Name, (const float* x, int n), (x, n)) { body }
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DSA_KERNEL(ret, name, params, args)                                                  \
  DSA_INLINE ret name##Body params;                                                          \
  [[gnu::target("arch=x86-64-v4"), gnu::noinline]] ret name##V4 params { return name##Body args; } \
  [[gnu::target("arch=x86-64-v3"), gnu::noinline]] ret name##V3 params { return name##Body args; } \
  [[gnu::noinline]] ret name##V1 params { return name##Body args; }                          \
  ret name params {                                                                          \
    switch (::myriad::cpu::dsa::detail::ActiveIsa()) {                                      \
      case ::myriad::cpu::dsa::detail::Isa::kAvx512: return name##V4 args;                   \
      case ::myriad::cpu::dsa::detail::Isa::kAvx2: return name##V3 args;                     \
      default: return name##V1 args;                                                         \
    }                                                                                        \
  }                                                                                          \
  DSA_INLINE ret name##Body params
#else
#define DSA_KERNEL(ret, name, params, args) ret name params
#endif

// 64-byte vectors live in always_inline helpers only (passed by reference),
// never across an ABI boundary.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace myriad::cpu::dsa {
struct SparseAttentionParams;
// dsa_masked.cc: the forward as masked dense attention in tiles of `tile`
// query rows; false (nothing written) when a selection row is not an
// ascending prefix of causal keys followed by -1 pads.
bool MaskedDenseAttention(const SparseAttentionParams& p, int tile);

// The number of valid entries of a selection row when they form an
// ascending prefix followed by -1 pads only (what IndexerTopK writes);
// -1 when the row is in any other form (the blocked kernel then hands the
// row to the row kernel).
inline int RegularPrefix(const int32_t* sel, int K) {
  int n = 0;
  while (n < K && sel[n] >= 0) {
    if (n > 0 && sel[n] <= sel[n - 1]) return -1;
    ++n;
  }
  for (int j = n; j < K; ++j)
    if (sel[j] != -1) return -1;
  return n;
}
}  // namespace myriad::cpu::dsa

namespace myriad::cpu::dsa::simd {

constexpr int kLanes = 16;  // keys (or inverse-index entries) per block: one vector of scores

// 16 floats. GCC vector extensions rather than intrinsics: the same code
// compiles in every DSA_KERNEL variant (zmm, 2 ymm, 4 xmm).
typedef float V16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));

// Unaligned loads and stores of any of the vector types below.
template <typename V>
DSA_INLINE V LoadVec(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V>
DSA_INLINE void StoreVec(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

DSA_INLINE V16 LoadV(const float* p) { return LoadVec<V16>(p); }
DSA_INLINE void StoreV(float* p, const V16& v) { StoreVec(p, v); }
DSA_INLINE V16 SplatV(float x) { return V16{} + x; }
DSA_INLINE V16 Relu(const V16& x) { return x > V16{} ? x : V16{}; }
// Lanes >= n replaced by `fill`.
DSA_INLINE V16 Masked(const V16& x, int n, float fill) {
  const I16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return lane < n ? x : SplatV(fill);
}
DSA_INLINE float HSum(const V16& x) {
  V16 v = x;
  v += __builtin_shuffle(v, I16{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
  v += __builtin_shuffle(v, I16{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
  v += __builtin_shuffle(v, I16{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
  v += __builtin_shuffle(v, I16{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
  return v[0];
}
DSA_INLINE V16 MaxV(const V16& a, const V16& b) { return a > b ? a : b; }
DSA_INLINE float HMax(const V16& x) {
  V16 v = x;
  v = MaxV(v, __builtin_shuffle(v, I16{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
  v = MaxV(v, __builtin_shuffle(v, I16{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11}));
  v = MaxV(v, __builtin_shuffle(v, I16{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13}));
  v = MaxV(v, __builtin_shuffle(v, I16{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14}));
  return v[0];
}
// backend/cpu's ExpF (same steps, same constants) on the lanes of V (I:
// the integer vector of the same shape).
template <typename V, typename I>
DSA_INLINE V ExpT(const V& x) {
  const V hi = V{} + 88.7f, lo = V{} + -87.3f;
  V xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  const V t = xc * 1.44269504088896341f;
  const V r = t + 12582912.f;
  const V n = r - 12582912.f;
  const I ni = (I)r - 0x4B400000;
  V f = xc - n * 0.693145751953125f;
  f = f - n * 1.42860682030941723212e-6f;
  V p = V{} + 1.f / 5040.f;
  p = p * f + 1.f / 720.f;
  p = p * f + 1.f / 120.f;
  p = p * f + 1.f / 24.f;
  p = p * f + 1.f / 6.f;
  p = p * f + 0.5f;
  p = p * f + 1.f;
  p = p * f + 1.f;
  const V y = p * (V)((ni + 127) << 23);
  return x < lo ? V{} : y;
}
DSA_INLINE V16 ExpV(const V16& x) { return ExpT<V16, I16>(x); }

// r[j] = the sum of the lanes of a[j]: a transpose-and-add tree (unpack,
// shuffle within 128-bit lanes, then across them), 15 adds for 16 sums.
DSA_INLINE V16 Reduce16(const V16* a) {
  const I16 lo = {0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29};
  const I16 hi = {2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31};
  const I16 pa = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  const I16 pb = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
  const I16 qa = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const I16 qb = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  V16 w[8], x[4], z[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    w[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo) +
           __builtin_shuffle(a[2 * i], a[2 * i + 1], hi);
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    x[i] = __builtin_shuffle(w[2 * i], w[2 * i + 1], pa) +
           __builtin_shuffle(w[2 * i], w[2 * i + 1], pb);
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    z[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], qa) +
           __builtin_shuffle(x[2 * i], x[2 * i + 1], qb);
  return __builtin_shuffle(z[0], z[1], qa) + __builtin_shuffle(z[0], z[1], qb);
}

// s[j] = x . rows[j] over n floats, j < 16.
DSA_INLINE void Dots16(const float* x, const float* const* rows, int n, float* s) {
  V16 acc[kLanes] = {};
  int c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    const V16 xv = LoadV(x + c);
#pragma GCC unroll 16
    for (int j = 0; j < kLanes; ++j) acc[j] += xv * LoadV(rows[j] + c);
  }
  StoreV(s, Reduce16(acc));
  if (c < n) {
    for (int j = 0; j < kLanes; ++j) {
      float t = 0.f;
      for (int d = c; d < n; ++d) t += x[d] * rows[j][d];
      s[j] += t;
    }
  }
}

// acc[0..n) += sum_j w[j] rows[j][0..n), j < 16 (four independent chains).
DSA_INLINE void AccumRows16(float* acc, const float* const* rows, const float* w, int n) {
  int c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    V16 o0 = LoadV(acc + c), o1 = {}, o2 = {}, o3 = {};
#pragma GCC unroll 4
    for (int j = 0; j < kLanes; j += 4) {
      o0 += SplatV(w[j]) * LoadV(rows[j] + c);
      o1 += SplatV(w[j + 1]) * LoadV(rows[j + 1] + c);
      o2 += SplatV(w[j + 2]) * LoadV(rows[j + 2] + c);
      o3 += SplatV(w[j + 3]) * LoadV(rows[j + 3] + c);
    }
    StoreV(acc + c, (o0 + o1) + (o2 + o3));
  }
  for (; c < n; ++c) {
    float t = acc[c];
    for (int j = 0; j < kLanes; ++j) t += w[j] * rows[j][c];
    acc[c] = t;
  }
}

// 8 floats: the AVX2 path's vector (16 registers of 8 lanes; the 16-lane
// kernels above would need 32 accumulators there and spill).
typedef float V8 __attribute__((vector_size(32)));
typedef int32_t I8x __attribute__((vector_size(32)));
DSA_INLINE V8 LoadV8(const float* p) { return LoadVec<V8>(p); }
DSA_INLINE void StoreV8(float* p, const V8& v) { StoreVec(p, v); }
DSA_INLINE V8 SplatV8(float x) { return V8{} + x; }
DSA_INLINE V8 ExpV8(const V8& x) { return ExpT<V8, I8x>(x); }
DSA_INLINE V8 MaxV8(const V8& a, const V8& b) { return a > b ? a : b; }
DSA_INLINE float HMax8(const V8& x) {
  V8 v = MaxV8(x, __builtin_shuffle(x, I8x{4, 5, 6, 7, 0, 1, 2, 3}));
  v = MaxV8(v, __builtin_shuffle(v, I8x{2, 3, 0, 1, 6, 7, 4, 5}));
  v = MaxV8(v, __builtin_shuffle(v, I8x{1, 0, 3, 2, 5, 4, 7, 6}));
  return v[0];
}
DSA_INLINE float HSum8(const V8& x) {
  V8 v = x + __builtin_shuffle(x, I8x{4, 5, 6, 7, 0, 1, 2, 3});
  v += __builtin_shuffle(v, I8x{2, 3, 0, 1, 6, 7, 4, 5});
  v += __builtin_shuffle(v, I8x{1, 0, 3, 2, 5, 4, 7, 6});
  return v[0];
}
// r[j] = the sum of the lanes of a[j], j < 8: unpack, then 64-bit
// unpack, then 128-bit halves (7 adds for 8 sums).
DSA_INLINE V8 Reduce8(const V8* a) {
  const I8x lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
  const I8x pa = {0, 1, 8, 9, 4, 5, 12, 13}, pb = {2, 3, 10, 11, 6, 7, 14, 15};
  const I8x qa = {0, 1, 2, 3, 8, 9, 10, 11}, qb = {4, 5, 6, 7, 12, 13, 14, 15};
  V8 w[4], z[2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    w[i] = __builtin_shuffle(a[2 * i], a[2 * i + 1], lo) + __builtin_shuffle(a[2 * i], a[2 * i + 1], hi);
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    z[i] = __builtin_shuffle(w[2 * i], w[2 * i + 1], pa) + __builtin_shuffle(w[2 * i], w[2 * i + 1], pb);
  return __builtin_shuffle(z[0], z[1], qa) + __builtin_shuffle(z[0], z[1], qb);
}

DSA_INLINE void ScaleRow(float* y, float a, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] *= a;
}
DSA_INLINE void Zero(float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 0.f;
}
DSA_INLINE float DotN(const float* a, const float* b, int n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace myriad::cpu::dsa::simd
