// Shared fixtures of the DSA op tests (dsa_test.cc, dsa_kernels_test.cc):
// shapes, strided tensors with sentinel padding, a problem's inputs and
// parameter builders, error measures, and RunAll (every op, fast or
// reference) on one problem.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dsa/dsa.h"
#include "backend/backend.h"

namespace myriad::cpu::dsa::dsatest {

// Runs f once per DSA kernel ISA this CPU has (avx512, avx2, scalar: every
// variant is tested, not only the one the CPU would pick), then restores
// the default.
template <typename F>
void ForEachKernelIsa(F&& f) {
  for (const std::string& isa : AvailableDsaKernelIsas()) {
    SCOPED_TRACE("kernel ISA " + isa);
    EXPECT_TRUE(UseDsaKernelIsa(isa));
    f();
  }
  UseDsaKernelIsa("");
}


inline constexpr float kSentinel = -7777.f;  // output padding: must stay untouched
inline constexpr int kPad = 3;               // extra floats per batch element

struct Dims {
  int B, Tq, Tk, H, Hkv, D, Hi, Di, K;
  std::string Name() const {
    char buf[128];
    std::snprintf(buf, sizeof buf, "B%d Tq%d Tk%d H%d Hkv%d D%d Hi%d Di%d K%d", B, Tq, Tk, H, Hkv,
                  D, Hi, Di, K);
    return buf;
  }
};

// A strided [B, n] tensor: n dense floats per batch element, then kPad more.
struct Tensor {
  int B = 0;
  int64_t n = 0, stride = 0;
  std::vector<float> v;
  Tensor() = default;
  Tensor(int B_, int64_t n_, float fill)
      : B(B_), n(n_), stride(n_ + kPad), v((size_t)B_ * (n_ + kPad), fill) {}
  float* p() { return v.data(); }
  const float* p() const { return v.data(); }
  float& at(int b, int64_t i) { return v[(size_t)(b * stride + i)]; }
};

inline Tensor Random(int B, int64_t n, std::mt19937& rng, float lo = 0.f, bool uniform = false) {
  Tensor t(B, n, std::numeric_limits<float>::quiet_NaN());  // padding NaN: a stray read shows
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(lo, 1.f);
  for (int b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i) t.at(b, i) = uniform ? ud(rng) : nd(rng);
  return t;
}

struct Case {
  Dims d;
  Tensor q, k, v, qi, ki, wi, dout;
  int64_t idx_stride;
  explicit Case(Dims d_, uint32_t seed) : d(d_) {
    std::mt19937 rng(seed);
    q = Random(d.B, (int64_t)d.Tq * d.H * d.D, rng);
    k = Random(d.B, (int64_t)d.Tk * d.Hkv * d.D, rng);
    v = Random(d.B, (int64_t)d.Tk * d.Hkv * d.D, rng);
    qi = Random(d.B, (int64_t)d.Tq * d.Hi * d.Di, rng);
    ki = Random(d.B, (int64_t)d.Tk * d.Di, rng);
    wi = Random(d.B, (int64_t)d.Tq * d.Hi, rng);
    dout = Random(d.B, (int64_t)d.Tq * d.H * d.D, rng);
    idx_stride = (int64_t)d.Tq * d.K + kPad;
  }
  std::vector<int32_t> NewIdx() const { return std::vector<int32_t>((size_t)d.B * idx_stride, -1); }
  Tensor NewOut() const { return Tensor(d.B, (int64_t)d.Tq * d.H * d.D, kSentinel); }
  Tensor NewKv() const { return Tensor(d.B, (int64_t)d.Tk * d.Hkv * d.D, kSentinel); }
  std::vector<float> NewLse() const {
    return std::vector<float>((size_t)d.B * d.H * d.Tq, kSentinel);
  }

  IndexerParams Indexer(int32_t* idx) const {
    IndexerParams p;
    p.B = d.B;
    p.Tq = d.Tq;
    p.Tk = d.Tk;
    p.Hi = d.Hi;
    p.Di = d.Di;
    p.K = d.K;
    p.qi_batch_stride = qi.stride;
    p.ki_batch_stride = ki.stride;
    p.wi_batch_stride = wi.stride;
    p.idx_batch_stride = idx_stride;
    p.qi = qi.p();
    p.ki = ki.p();
    p.wi = wi.p();
    p.idx = idx;
    return p;
  }
  SparseAttentionParams Attn(const int32_t* idx, Tensor* out, std::vector<float>* lse) const {
    SparseAttentionParams p;
    p.B = d.B;
    p.Tq = d.Tq;
    p.Tk = d.Tk;
    p.H = d.H;
    p.Hkv = d.Hkv;
    p.D = d.D;
    p.K = d.K;
    p.scale = 1.f / std::sqrt((float)d.D);
    p.q_batch_stride = q.stride;
    p.kv_batch_stride = k.stride;
    p.out_batch_stride = out->stride;
    p.idx_batch_stride = idx_stride;
    p.q = q.p();
    p.k = k.p();
    p.v = v.p();
    p.idx = idx;
    p.out = out->p();
    p.lse = lse ? lse->data() : nullptr;
    return p;
  }
  AttentionParams Dense(Tensor* out, std::vector<float>* lse) const {
    AttentionParams p;
    p.B = d.B;
    p.Tq = d.Tq;
    p.Tk = d.Tk;
    p.H = d.H;
    p.Hkv = d.Hkv;
    p.D = d.D;
    p.scale = 1.f / std::sqrt((float)d.D);
    p.causal = true;
    p.q_batch_stride = q.stride;
    p.kv_batch_stride = k.stride;
    p.out_batch_stride = out->stride;
    p.q = q.p();
    p.k = k.p();
    p.v = v.p();
    p.out = out->p();
    p.lse = lse->data();
    return p;
  }
};

// The shapes of the comparisons: ragged prefill and decode, K from 1 to
// past the number of keys.
inline std::vector<Dims> AllDims() {
  std::vector<Dims> out;
  for (int K : {1, 5, 16, 64}) out.push_back({2, 37, 37, 4, 2, 24, 3, 16, K});
  for (int K : {5, 16, 64}) out.push_back({2, 1, 50, 4, 2, 24, 3, 16, K});
  // Two query heads per kv head and D a multiple of 16: the paired forward.
  for (int K : {7, 40}) out.push_back({1, 45, 45, 4, 2, 32, 2, 16, K});
  return out;
}

// max_i |a_i - b_i| / (|b_i| + rms(b)) over the dense part: relative error,
// measured on the tensor's own scale for entries near zero.
inline double RelErr(const float* a, const float* b, int B, int64_t n, int64_t stride) {
  double ss = 0.0;
  for (int bb = 0; bb < B; ++bb)
    for (int64_t i = 0; i < n; ++i) ss += (double)b[bb * stride + i] * b[bb * stride + i];
  const double rms = std::max(std::sqrt(ss / std::max<double>(1.0, (double)B * n)), 1e-30);
  double worst = 0.0;
  for (int bb = 0; bb < B; ++bb)
    for (int64_t i = 0; i < n; ++i) {
      const double x = a[bb * stride + i], y = b[bb * stride + i];
      const double e = std::fabs(x - y) / (std::fabs(y) + rms);
      if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
    }
  return worst;
}
inline double RelErr(const Tensor& a, const Tensor& b) { return RelErr(a.p(), b.p(), a.B, a.n, a.stride); }
inline double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  return RelErr(a.data(), b.data(), 1, (int64_t)a.size(), (int64_t)a.size());
}

inline double MaxAbs(const Tensor& t) {
  double m = 0;
  for (int b = 0; b < t.B; ++b)
    for (int64_t i = 0; i < t.n; ++i)
      m = std::max(m, (double)std::fabs(t.v[(size_t)(b * t.stride + i)]));
  return m;
}

// The padding of an output is never written.
inline bool PaddingIntact(const Tensor& t) {
  for (int b = 0; b < t.B; ++b)
    for (int64_t i = t.n; i < t.stride; ++i)
      if (t.v[(size_t)(b * t.stride + i)] != kSentinel) return false;
  return true;
}

// Everything one case produces, fast or ref.
struct Results {
  std::vector<int32_t> idx;
  Tensor out, dq, dk, dv, dqi, dki, dwi;
  std::vector<float> lse;
  double loss = 0;
};

// Runs every op of one implementation; attention and the loss use `sel`
// (the fast selection) so both implementations see the same indices.
template <bool kRef>
Results RunAll(const Case& c, const std::vector<int32_t>* sel) {
  Results r;
  r.idx = c.NewIdx();
  if (kRef)
    ref::IndexerTopK(c.Indexer(r.idx.data()));
  else
    IndexerTopK(c.Indexer(r.idx.data()));
  const int32_t* idx = sel ? sel->data() : r.idx.data();
  r.out = c.NewOut();
  r.lse = c.NewLse();
  SparseAttentionParams ap = c.Attn(idx, &r.out, &r.lse);
  if (kRef)
    ref::SparseAttention(ap);
  else
    SparseAttention(ap);
  SparseAttentionBackwardParams bp;
  bp.fwd = ap;
  bp.dout = c.dout.p();
  r.dq = Tensor(c.d.B, c.q.n, kSentinel);
  r.dk = c.NewKv();
  r.dv = c.NewKv();
  bp.dq = r.dq.p();
  bp.dk = r.dk.p();
  bp.dv = r.dv.p();
  if (kRef)
    ref::SparseAttentionBackward(bp);
  else
    SparseAttentionBackward(bp);
  IndexerLossParams lp;
  lp.indexer = c.Indexer(const_cast<int32_t*>(idx));
  lp.attn = ap;
  r.dqi = Tensor(c.d.B, c.qi.n, kSentinel);
  r.dki = Tensor(c.d.B, c.ki.n, kSentinel);
  r.dwi = Tensor(c.d.B, c.wi.n, kSentinel);
  lp.dqi = r.dqi.p();
  lp.dki = r.dki.p();
  lp.dwi = r.dwi.p();
  lp.grad_scale = 0.75f;
  r.loss = kRef ? ref::IndexerLoss(lp) : IndexerLoss(lp);
  return r;
}

// ---------------------------------------------------------------- fast vs ref

}  // namespace myriad::cpu::dsa::dsatest
