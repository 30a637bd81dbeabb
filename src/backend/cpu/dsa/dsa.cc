// DSA kernels (see dsa.h for the math and the layouts).
//
// Every kernel is OpenMP-parallel over independent outputs, so results do
// not depend on the thread count (bit for bit):
//   IndexerTopK             in dsa_indexer.cc (sampled threshold, candidates,
//                           exact selection among them; fp32 or int8).
//   SparseAttention         the row kernel (one task per (b, t), per (b, t,
//                           kv head) when rows are too few, e.g. decode) or
//                           the blocked one (one task per block of rows and
//                           kv head, walking the keys in chunks); either
//                           takes a row's keys in online-softmax steps of up
//                           to 128, each gathered k/v row used by the H/Hkv
//                           query heads that share it; masked dense in
//                           dsa_masked.cc.
//   SparseAttentionBackward dq per (b, t) as above; dk/dv per (b, key) from
//                           an inverse index (the entries that selected the
//                           key, in ascending order), recomputing P and dS,
//                           so nothing is scattered and nothing is atomic.
//   IndexerLoss             (dsa_loss.cc) per query row: p, q, KL, dI, dqi, dwi; dki per
//                           (b, key) through the same inverse index; the
//                           loss is summed over rows in a fixed order.
// The inner products work on blocks of 16 rows (16 dot products reduced by
// a shuffle tree; weighted sums of 16 rows), written with GCC vector
// extensions so that DSA_KERNEL (dsa_simd.h) compiles them for AVX-512,
// AVX2 and baseline x86-64 and calls the variant UseDsaKernelIsa chose:
// this module is built without -m flags. Helpers are always_inline so they
// take the variant's ISA. The
// forward's step kernel has an 8-lane form too (AttnView::narrow: every
// kernel ISA but avx512, see UseDsaKernelIsa): the 16-lane one needs 32
// vector registers, which AVX2 lacks.
#include "backend/cpu/dsa/dsa.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/cpu_info.h"
#include "backend/cpu/impl/common.h"  // ExpF, ThreadWorkspace
#include "core/check.h"
#include "backend/cpu/dsa/dsa_attn.h"
#include "backend/cpu/dsa/dsa_simd.h"

namespace myriad::cpu::dsa {

namespace detail {

namespace {
bool CpuHas(Isa isa) {
  const CpuInfo& cpu = GetCpuInfo();
  return isa == Isa::kScalar || (isa == Isa::kAvx2 && cpu.has_avx2_kernels()) ||
         (isa == Isa::kAvx512 && cpu.has_avx512_kernels());
}
bool ParseIsa(const std::string& name, Isa* isa) {
  if (name == "avx512") return *isa = Isa::kAvx512, true;
  if (name == "avx2") return *isa = Isa::kAvx2, true;
  if (name == "scalar") return *isa = Isa::kScalar, true;
  return false;
}
const char* IsaName(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : isa == Isa::kAvx2 ? "avx2" : "scalar";
}
// MYRIAD_CPU_ISA where this CPU has it, else the best it has.
Isa DefaultIsa() {
  static const Isa isa = [] {
    Isa e;
    const char* env = std::getenv("MYRIAD_CPU_ISA");
    if (env && ParseIsa(env, &e) && CpuHas(e)) return e;
    return CpuHas(Isa::kAvx512) ? Isa::kAvx512 : CpuHas(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar;
  }();
  return isa;
}
std::atomic<int> g_isa{-1};  // UseDsaKernelIsa's choice; -1: DefaultIsa
}  // namespace

Isa ActiveIsa() {
  const int v = g_isa.load(std::memory_order_relaxed);
  return v < 0 ? DefaultIsa() : static_cast<Isa>(v);
}

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

}  // namespace detail

bool UseDsaKernelIsa(const std::string& isa) {
  if (isa.empty()) return detail::g_isa.store(-1), true;
  detail::Isa v;
  if (!detail::ParseIsa(isa, &v) || !detail::CpuHas(v)) return false;
  detail::g_isa.store(static_cast<int>(v));
  return true;
}

std::vector<std::string> AvailableDsaKernelIsas() {
  std::vector<std::string> out;
  for (detail::Isa v : {detail::Isa::kAvx512, detail::Isa::kAvx2, detail::Isa::kScalar})
    if (detail::CpuHas(v)) out.push_back(detail::IsaName(v));
  return out;
}

std::string DsaKernelIsa() { return detail::IsaName(detail::ActiveIsa()); }

namespace {

using namespace simd;
using namespace detail;

using cpu::ExpF;
using cpu::ThreadWorkspace;

// Whether a kernel's steps request their k/v rows ahead: the row kernel's
// rows come from L3 or DRAM (at 64K: 41 instead of 49 ns per key and kv
// head); the blocked kernel's sit in L2, where the requests only cost
// instructions (16 instead of 13 ns).
constexpr bool kRowPrefetch = true, kBlockedPrefetch = false;

// ---------------------------------------------------------------- attention

// Rows and kv-head chunks of the attention tasks: one task per (b, t) and
// chunk; several chunks (one kv head each) only when rows alone would not
// keep the threads busy (decode). Per-head results do not depend on it.
int KvChunks(int64_t rows, int Hkv) { return rows >= 4 * (int64_t)omp_get_max_threads() ? 1 : Hkv; }

// Keys per online-softmax step (at most): a step scores all its keys first,
// then takes one max, one rescale of the accumulators and one exp per score,
// then the weighted sum of the values. Steps of a few dozen keys or more
// keep the arithmetic independent; per 16-key step, the max, exp and rescale
// chain serialised the kernel (measured in L1, g = 2, D = 64: 13.6 ns per
// key and kv head with 16-key steps, 7.3 with 64, 6.6 with 128).
constexpr int kStep = 128;

DSA_INLINE int Round16(int n) { return (n + kLanes - 1) / kLanes * kLanes; }

// sums[j] += q0 . kr[j], sums[8 + j] += q1 . kr[j] for j < NK (q1 = qs + D),
// as 16-lane partial sums.
template <int NK>
DSA_INLINE void PairDots(const float* qs, const float* const* kr, int D, V16* sums) {
  for (int c = 0; c < D; c += kLanes) {
    const V16 q0 = LoadV(qs + c), q1 = LoadV(qs + D + c);
#pragma GCC unroll 8
    for (int j = 0; j < NK; ++j) {
      const V16 kv = LoadV(kr[j] + c);
      sums[j] += q0 * kv;
      sums[8 + j] += q1 * kv;
    }
  }
}

// PairDots in 8-lane vectors (the narrow path): sums[j] += q0 . kr[j],
// sums[4 + j] += q1 . kr[j] for j < 4, 8 accumulators.
DSA_INLINE void PairDots8(const float* qs, const float* const* kr, int D, V8* sums) {
  for (int c = 0; c < D; c += 8) {
    const V8 q0 = LoadV8(qs + c), q1 = LoadV8(qs + D + c);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const V8 kv = LoadV8(kr[j] + c);
      sums[j] += q0 * kv;
      sums[4 + j] += q1 * kv;
    }
  }
}

// Scores of one step: s[h * kStep + j] = qs_h . k[keys[j]] for the g heads of
// kv head hk (qs already scaled), j < n; lanes [n, Round16(n)) are -inf.
// While scoring, the step's v rows and the k rows two groups ahead are
// requested (rows at unpredictable addresses the hardware cannot guess).
DSA_INLINE void StepScores(const AttnView& a, int hk, const int32_t* keys, int n, const float* qs,
                           bool prefetch, float* s) {
  const int D = a.D, g = a.g;
  const float* kb = a.k + hk * a.kv_head_stride;
  const float* vb = a.v + hk * a.kv_head_stride;
  const int64_t ld = a.ldkv;
  if (a.narrow && g == 2 && D % 8 == 0 && D <= 16 * 8) {
    // Groups of 4 keys x 2 heads: 8 accumulators, one 8-lane tree.
    alignas(32) float r[8];
    for (int j0 = 0; j0 < n; j0 += 4) {
      const float* kr[4];
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) kr[j] = kb + keys[std::min(j0 + j, n - 1)] * ld;
      if (prefetch) {
        for (int j = j0 + 16; j < std::min(n, j0 + 20); ++j)
          for (int d = 0; d < D; d += kLanes) __builtin_prefetch(kb + keys[j] * ld + d);
        for (int j = j0; j < std::min(n, j0 + 4); ++j)
          for (int d = 0; d < D; d += kLanes) __builtin_prefetch(vb + keys[j] * ld + d);
      }
      V8 sums[8] = {};
      PairDots8(qs, kr, D, sums);
      StoreV8(r, Reduce8(sums));
      std::memcpy(s + j0, r, 4 * sizeof(float));
      std::memcpy(s + kStep + j0, r + 4, 4 * sizeof(float));
    }
  } else if (g == 2 && D % kLanes == 0 && D <= 8 * kLanes) {
    // Groups of 8 keys x 2 heads: 16 accumulators, one reduction tree.
    alignas(64) float r[kLanes];
    for (int j0 = 0; j0 < n; j0 += 8) {
      const float* kr[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) kr[j] = kb + keys[std::min(j0 + j, n - 1)] * ld;
      if (prefetch) {
        for (int j = j0 + 16; j < std::min(n, j0 + 24); ++j)
          for (int d = 0; d < D; d += kLanes) __builtin_prefetch(kb + keys[j] * ld + d);
        for (int j = j0; j < std::min(n, j0 + 8); ++j)
          for (int d = 0; d < D; d += kLanes) __builtin_prefetch(vb + keys[j] * ld + d);
      }
      V16 sums[kLanes] = {};
      if (n - j0 > 4)
        PairDots<8>(qs, kr, D, sums);
      else  // a group's last 1-4 keys: half the multiply-adds (the rest stay 0)
        PairDots<4>(qs, kr, D, sums);
      StoreV(r, Reduce16(sums));
      std::memcpy(s + j0, r, 8 * sizeof(float));
      std::memcpy(s + kStep + j0, r + 8, 8 * sizeof(float));
    }
  } else {
    const float* kr[kLanes];
    for (int j0 = 0; j0 < n; j0 += kLanes) {
      BlockRows(kb, ld, keys + j0, std::min(kLanes, n - j0), kr);
      if (prefetch)
        for (int j = j0; j < std::min(n, j0 + kLanes); ++j)
          for (int d = 0; d < D; d += kLanes) __builtin_prefetch(vb + keys[j] * ld + d);
      for (int h = 0; h < g; ++h) Dots16(qs + (int64_t)h * D, kr, D, s + h * kStep + j0);
    }
  }
  for (int h = 0; h < g; ++h)
    for (int j = n; j < Round16(n); ++j) s[h * kStep + j] = kNegInf;
}

// Online softmax over one step's scores of head h (Round16(n) lanes): the
// scores become weights exp(s - m_new); m and l are updated; returns the
// factor the accumulator is rescaled by.
DSA_INLINE float StepSoftmax(float* s, int n, float* m, float* l) {
  const int n16 = Round16(n);
  V16 mx = SplatV(kNegInf);
  for (int j = 0; j < n16; j += kLanes) mx = MaxV(mx, LoadV(s + j));
  const float mnew = std::max(*m, HMax(mx));
  V16 sum = {};
  for (int j = 0; j < n16; j += kLanes) {
    const V16 e = ExpV(LoadV(s + j) - mnew);  // 0 in the -inf lanes
    StoreV(s + j, e);
    sum += e;
  }
  const float alpha = ExpF(*m - mnew);  // 0 while m = -inf
  *m = mnew;
  *l = *l * alpha + HSum(sum);
  return alpha;
}

// StepSoftmax in 8-lane vectors (the narrow path: GCC lowers the 16-lane
// compares and selects lane by lane for AVX2). The same result up to the
// order of the sum of l.
DSA_INLINE float StepSoftmax8(float* s, int n, float* m, float* l) {
  const int n16 = Round16(n);
  V8 mx = SplatV8(kNegInf);
  for (int j = 0; j < n16; j += 8) mx = MaxV8(mx, LoadV8(s + j));
  const float mnew = std::max(*m, HMax8(mx));
  V8 sum = {};
  for (int j = 0; j < n16; j += 8) {
    const V8 e = ExpV8(LoadV8(s + j) - mnew);  // 0 in the -inf lanes
    StoreV8(s + j, e);
    sum += e;
  }
  const float alpha = ExpF(*m - mnew);  // 0 while m = -inf
  *m = mnew;
  *l = *l * alpha + HSum8(sum);
  return alpha;
}

// acc_h = alpha_h acc_h + sum_j w_h[j] v[keys[j]] for two heads sharing the
// rows, NV vectors of 16 per row, in registers; with NV <= 4 even and odd
// keys go to separate accumulators (twice the independent chains).
template <int NV>
DSA_INLINE void StepValuesPair(const float* vb, int64_t ld, const int32_t* keys, int n, const float* w0,
                               const float* w1, float alpha0, float alpha1, float* acc, int D) {
  constexpr bool kTwo = NV <= 4;
  V16 o0[NV], o1[NV], p0[NV], p1[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    o0[v] = LoadV(acc + v * kLanes) * alpha0, o1[v] = LoadV(acc + D + v * kLanes) * alpha1;
    p0[v] = V16{}, p1[v] = V16{};
  }
  int j = 0;
  if constexpr (kTwo) {
    for (; j + 2 <= n; j += 2) {
      const float* ra = vb + keys[j] * ld;
      const float* rb = vb + keys[j + 1] * ld;
      const V16 a0 = SplatV(w0[j]), a1 = SplatV(w1[j]), b0 = SplatV(w0[j + 1]), b1 = SplatV(w1[j + 1]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const V16 x = LoadV(ra + v * kLanes), y = LoadV(rb + v * kLanes);
        o0[v] += a0 * x, o1[v] += a1 * x;
        p0[v] += b0 * y, p1[v] += b1 * y;
      }
    }
  }
  for (; j < n; ++j) {
    const float* ra = vb + keys[j] * ld;
    const V16 a0 = SplatV(w0[j]), a1 = SplatV(w1[j]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const V16 x = LoadV(ra + v * kLanes);
      o0[v] += a0 * x, o1[v] += a1 * x;
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    StoreV(acc + v * kLanes, kTwo ? o0[v] + p0[v] : o0[v]);
    StoreV(acc + D + v * kLanes, kTwo ? o1[v] + p1[v] : o1[v]);
  }
}

// StepValuesPair in 8-lane vectors (the narrow path), NV (1..4) vectors
// of the rows from float c0 on: 2 * NV accumulators, one pass over the
// keys per 32 floats of the row.
template <int NV>
DSA_INLINE void StepValuesPair8(const float* vb, int64_t ld, const int32_t* keys, int n, const float* w0,
                                const float* w1, float alpha0, float alpha1, float* acc, int D, int c0) {
  V8 o0[NV], o1[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v)
    o0[v] = LoadV8(acc + c0 + 8 * v) * alpha0, o1[v] = LoadV8(acc + D + c0 + 8 * v) * alpha1;
  for (int j = 0; j < n; ++j) {
    const float* ra = vb + keys[j] * ld + c0;
    const V8 a0 = SplatV8(w0[j]), a1 = SplatV8(w1[j]);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const V8 x = LoadV8(ra + 8 * v);
      o0[v] += a0 * x, o1[v] += a1 * x;
    }
  }
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) StoreV8(acc + c0 + 8 * v, o0[v]), StoreV8(acc + D + c0 + 8 * v, o1[v]);
}

// One online-softmax step of one row over n (1..kStep) selected keys for
// the g query heads of kv head hk: qs/acc/m/l point at the group's first
// head; s is scratch of g * kStep floats.
DSA_INLINE void FwdStep(const AttnView& a, int hk, const int32_t* keys, int n, bool prefetch,
                        const float* qs, float* acc, float* m, float* l, float* s) {
  const int D = a.D, g = a.g;
  StepScores(a, hk, keys, n, qs, prefetch, s);
  const float* vb = a.v + hk * a.kv_head_stride;
  if (a.narrow && g == 2 && D % 8 == 0 && D <= 16 * 8) {
    const float alpha0 = StepSoftmax8(s, n, m, l), alpha1 = StepSoftmax8(s + kStep, n, m + 1, l + 1);
    for (int c0 = 0; c0 < D; c0 += 32) {
      switch (std::min(4, (D - c0) / 8)) {
        case 1: StepValuesPair8<1>(vb, a.ldkv, keys, n, s, s + kStep, alpha0, alpha1, acc, D, c0); break;
        case 2: StepValuesPair8<2>(vb, a.ldkv, keys, n, s, s + kStep, alpha0, alpha1, acc, D, c0); break;
        case 3: StepValuesPair8<3>(vb, a.ldkv, keys, n, s, s + kStep, alpha0, alpha1, acc, D, c0); break;
        default: StepValuesPair8<4>(vb, a.ldkv, keys, n, s, s + kStep, alpha0, alpha1, acc, D, c0); break;
      }
    }
    return;
  }
  if (g == 2 && D % kLanes == 0 && D <= 8 * kLanes) {
    const float alpha0 = StepSoftmax(s, n, m, l), alpha1 = StepSoftmax(s + kStep, n, m + 1, l + 1);
    switch (D / kLanes) {
#define DSA_PAIR_CASE(nv) \
  case nv: StepValuesPair<nv>(vb, a.ldkv, keys, n, s, s + kStep, alpha0, alpha1, acc, D); break;
      DSA_PAIR_CASE(1) DSA_PAIR_CASE(2) DSA_PAIR_CASE(3) DSA_PAIR_CASE(4)
      DSA_PAIR_CASE(5) DSA_PAIR_CASE(6) DSA_PAIR_CASE(7) DSA_PAIR_CASE(8)
#undef DSA_PAIR_CASE
    }
    return;
  }
  const float* vr[kLanes];
  for (int h = 0; h < g; ++h) {
    float* sh = s + h * kStep;
    const float alpha = StepSoftmax(sh, n, m + h, l + h);
    float* ah = acc + (int64_t)h * D;
    if (alpha != 1.f) ScaleRow(ah, alpha, D);
    for (int j0 = 0; j0 < n; j0 += kLanes) {  // lanes past n weigh 0
      BlockRows(vb, a.ldkv, keys + j0, std::min(kLanes, n - j0), vr);
      AccumRows16(ah, vr, sh + j0, D);
    }
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

// Forward of row t, kv heads [hk0, hk1): keys[0..n) the valid selection,
// in steps of kStep keys; ws holds the row's state, s the step's scores.
DSA_KERNEL(void, AttnFwdTask, (const AttnView& a, int t, const int32_t* keys, int n, int hk0, int hk1, float* ws, float* s, float* out_row, float* lse_t), (a, t, keys, n, hk0, hk1, ws, s, out_row, lse_t)) {
  const int D = a.D, g = a.g, h0 = hk0 * g, nh = (hk1 - hk0) * g;
  float* qs = ws;
  float* acc = qs + (int64_t)nh * D;
  float* m = acc + (int64_t)nh * D;
  float* l = m + nh;
  const float* q = a.q + t * a.ldq + (int64_t)h0 * D;
  for (int64_t x = 0; x < (int64_t)nh * D; ++x) qs[x] = q[x] * a.scale, acc[x] = 0.f;
  for (int h = 0; h < nh; ++h) m[h] = kNegInf, l[h] = 0.f;
  for (int j0 = 0; j0 < n; j0 += kStep) {
    const int bn = std::min(kStep, n - j0);
    for (int hk = hk0; hk < hk1; ++hk) {
      const int64_t o = (int64_t)(hk - hk0) * g;
      FwdStep(a, hk, keys + j0, bn, kRowPrefetch, qs + o * D, acc + o * D, m + o, l + o, s);
    }
  }
  FwdFinish(a, acc, m, l, nh, out_row + (int64_t)h0 * D, lse_t ? lse_t + (int64_t)h0 * a.Tq : nullptr,
            a.Tq);
}

// Blocked forward: rows [t0, t1) of one batch element, kv head hk. The keys
// are walked in chunks of `chunk` positions; in each chunk every row of the
// block takes the selected keys that lie in it (in steps of at most kStep),
// so a chunk's k/v rows are read from DRAM once and reused from cache by
// every row of the block that selected them. ws holds the rows' states, s
// the step's scores; nv[r] is RegularPrefix of row t0 + r, cur one int per
// row.
DSA_KERNEL(void, AttnFwdBlockTask, (const AttnView& a, const int32_t* idx, int K, int t0, int t1, int hk, int chunk, float* ws, float* s, const int32_t* nv, int32_t* cur, int32_t* spare, float* out, float* lse), (a, idx, K, t0, t1, hk, chunk, ws, s, nv, cur, spare, out, lse)) {
  const int D = a.D, g = a.g, h0 = hk * g, nr = t1 - t0;
  const int64_t stride = ((int64_t)2 * g * D + 2 * g + 15) / 16 * 16;
  for (int r = 0; r < nr; ++r) {
    const int t = t0 + r;
    const int32_t* sel = idx + (int64_t)t * K;
    cur[r] = 0;
    float* st = ws + r * stride;
    if (nv[r] < 0) {  // not an ascending prefix: the row kernel, on its own
      const int n = Compact(sel, K, spare, nullptr);
      AttnFwdTask(a, t, spare, n, hk, hk + 1, st, s, out + (int64_t)t * a.ldq,
                  lse ? lse + t : nullptr);
      continue;
    }
    const float* q = a.q + t * a.ldq + (int64_t)h0 * D;
    for (int64_t x = 0; x < (int64_t)g * D; ++x) st[x] = q[x] * a.scale, st[g * D + x] = 0.f;
    for (int h = 0; h < g; ++h) st[2 * g * D + h] = kNegInf, st[2 * g * D + g + h] = 0.f;
  }
  // While the rows walk a chunk, each row visit requests a slice of the
  // next chunk's k/v rows (they come from DRAM the first time).
  // (Measured at 64K, alternating in one process: 3-5% faster.)
  const int per = (chunk + nr - 1) / nr;
  for (int64_t end = chunk;; end += chunk) {
    bool more = false;
    for (int r = 0; r < nr; ++r) {
      const int64_t p0 = end + (int64_t)r * per, p1 = std::min<int64_t>({p0 + per, end + chunk, a.Tk});
      for (int64_t pos = p0; pos < p1; ++pos)
        for (int d = 0; d < D; d += kLanes) {
          __builtin_prefetch(a.k + hk * a.kv_head_stride + pos * a.ldkv + d, 0, 2);
          __builtin_prefetch(a.v + hk * a.kv_head_stride + pos * a.ldkv + d, 0, 2);
        }
      const int n = nv[r];
      int j = cur[r];
      if (j >= n) continue;
      const int32_t* keys = idx + (int64_t)(t0 + r) * K;
      int e = j;
      while (e < n && keys[e] < end) ++e;
      float* st = ws + r * stride;
      for (; j < e; j += kStep)
        FwdStep(a, hk, keys + j, std::min(kStep, e - j), kBlockedPrefetch, st, st + g * D, st + 2 * g * D,
                st + 2 * g * D + g, s);
      cur[r] = e;
      more |= e < n;
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
DSA_KERNEL(void, AttnBwdDqTask, (const AttnView& a, int t, const int32_t* keys, int n, int hk0, int hk1, float* ws, float* dq_row), (a, t, keys, n, hk0, hk1, ws, dq_row)) {
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
DSA_KERNEL(void, RowDots, (const float* x, const float* y, int H, int D, float* r), (x, y, H, D, r)) {
  for (int h = 0; h < H; ++h) r[h] = DotN(x + (int64_t)h * D, y + (int64_t)h * D, D);
}

// Backward, dk and dv of key s (all kv heads): ents[0..n) are the entries
// t*K + slot that selected it (ascending). Per block of 16 entries and
// query head, P and dS are recomputed from q, dout, lse and drow; the
// gathered q and dout rows are weighted into dk and dv. Writes the rows.
DSA_KERNEL(void, AttnBwdKvTask, (const AttnView& a, int s, const int32_t* ents, int n, int K, float* dk_row, float* dv_row), (a, s, ents, n, K, dk_row, dv_row)) {
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

namespace {
// The L2 cache per core in bytes (1 MB when the system does not say).
int64_t L2Bytes() {
  static const int64_t bytes = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? (int64_t)v : int64_t{1} << 20;
  }();
  return bytes;
}
}  // namespace

SparseAttentionSchedule DefaultSparseAttentionSchedule(const SparseAttentionParams& p, int64_t l2_bytes) {
  // Few query rows (decode): nothing to share, the row kernel. Masked dense
  // attention is not a default: the blocked kernel beats it even where the
  // selection is most of the keys (measured, K 2048: 53 against 85 ms at
  // T 2560, 105 against 189 ms at 4096).
  if ((int64_t)p.B * p.Tq < 64) return {1, 0, 0};
  // Blocked: enough rows per block that each key is selected by ~32 of them
  // on average (K / Tk of the rows select a given key), and chunks long
  // enough that a row takes ~32 keys per visit (a softmax step each).
  // Measured (H 8, Hkv 4, D 64, K 2048): 16K flat within 5% over q_block
  // 256-1024 x chunk 256-1024; 64K, 1024/1024 best (13 ns per key and kv
  // head at the last rows against 16 with chunks of 512, 19 with 256).
  // Both capped by the L2 per core: 1024 per MB (the 64K optimum on a 1 MB
  // Zen 5 L2; on a 512 KB Zen 3 L2, 512 / 512 took 14.1 s against 21.3 s
  // for 1024 / 1024 at 64K, one busy run).
  const int64_t ratio = std::max<int64_t>(1, p.Tk / std::max(1, p.K));
  const int64_t l2 = l2_bytes > 0 ? l2_bytes : L2Bytes();
  const int64_t cap = std::max<int64_t>(256, 1024 * l2 / (1 << 20));
  const int q_block = (int)std::clamp<int64_t>(std::min(32 * ratio, cap), 64, 2048) / 64 * 64;
  const int chunk = (int)std::clamp<int64_t>(std::min(32 * ratio, cap), 256, 2048);
  return {q_block, chunk, 0};
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
    // k and v repacked per kv head ([B, Hkv, Tk, D]): a chunk of one head's
    // rows is then contiguous (measured at 64K: 19 -> 14 ns per key and kv
    // head); the copy takes 7-10 ms of the 2.6 s kernel.
    const int Tk = p.Tk;
    const int64_t per_b = (int64_t)Hkv * Tk * D;
    float* packed = Hkv > 1 ? ThreadWorkspace(kSlotPacked, 2 * p.B * per_b) : nullptr;
    if (packed) {
#pragma omp parallel for schedule(static) if (par)
      for (int64_t bs = 0; bs < (int64_t)p.B * Tk; ++bs) {
        const int64_t b = bs / Tk, pos = bs % Tk;
        const float* kr = p.k + b * p.kv_batch_stride + pos * Hkv * D;
        const float* vr = p.v + b * p.kv_batch_stride + pos * Hkv * D;
        for (int hk = 0; hk < Hkv; ++hk) {
          const int64_t at = ((int64_t)hk * Tk + pos) * D;
          std::memcpy(packed + b * per_b + at, kr + (int64_t)hk * D, D * sizeof(float));
          std::memcpy(packed + (p.B + b) * per_b + at, vr + (int64_t)hk * D, D * sizeof(float));
        }
      }
    }
    // Each selection row's form, once for all its kv heads.
    std::vector<int32_t> nv(rows);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < rows; ++r)
      nv[r] = RegularPrefix(p.idx + (r / Tq) * p.idx_batch_stride + (r % Tq) * K, K);
    // Later blocks (more keys) first: the dynamic schedule then ends evenly.
#pragma omp parallel for schedule(dynamic, 1) if (par)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t rev = tasks - 1 - task;
      const int hk = (int)(rev % Hkv);
      const int64_t bb = rev / Hkv;
      const int b = (int)(bb / blocks), t0 = (int)(bb % blocks) * qb, t1 = std::min(Tq, t0 + qb);
      float* ws = ThreadWorkspace(kSlotWork, qb * stride);
      float* s = ThreadWorkspace(kSlotScores, (int64_t)g * kStep);
      int32_t* ints = reinterpret_cast<int32_t*>(ThreadWorkspace(kSlotKeys, (int64_t)qb + K));
      AttnView view = ViewOf(p, b);
      if (packed) {
        view.k = packed + b * per_b, view.v = packed + (p.B + b) * per_b;
        view.ldkv = D, view.kv_head_stride = (int64_t)Tk * D;
      }
      AttnFwdBlockTask(view, p.idx + b * p.idx_batch_stride, K, t0, t1, hk, sched.key_chunk,
                       ws, s, nv.data() + (int64_t)b * Tq + t0, ints, ints + qb,
                       p.out + b * p.out_batch_stride, p.lse ? p.lse + (int64_t)b * H * Tq : nullptr);
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
    float* s = ThreadWorkspace(kSlotScores, (int64_t)(H / Hkv) * kStep);
    AttnFwdTask(ViewOf(p, b), t, keys, n, hk0, hk0 + per, ws, s,
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

}  // namespace myriad::cpu::dsa
