// DSA's indexer loss (dsa.h: IndexerLoss): per query row the main
// attention's head-averaged distribution p over the selection, the
// indexer's softmax q over it, KL(p || q) and its gradients to qi and wi;
// dki per (b, key) through the selection's inverse index. Results do not
// depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/impl/common.h"  // ExpF, ThreadWorkspace
#include "core/check.h"
#include "backend/cpu/dsa/dsa.h"
#include "backend/cpu/dsa/dsa_attn.h"
#include "backend/cpu/dsa/dsa_simd.h"

namespace myriad::cpu::dsa {
namespace {

using namespace simd;
using namespace detail;
using cpu::ExpF;
using cpu::ThreadWorkspace;

// p[i] = (1/H) sum_h exp(scale q[t,h] . k[keys[i], h/g] - lse[h, t]).
DSA_KERNEL(void, MainProbsRow, (const AttnView& a, int t, const int32_t* keys, int n, float* p), (a, t, keys, n, p)) {
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
DSA_KERNEL(void, IndexerScoresSel, (const float* qi, const float* w, const float* ki, const int32_t* keys, int n, int Hi, int Di, float* u, float* I), (qi, w, ki, keys, n, Hi, Di, u, I)) {
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
DSA_KERNEL(void, IndexerRowGrads, (const float* w, const float* ki, const int32_t* keys, int n, int Hi, int Di, const float* u, const float* dI, float* dqi, float* dwi, float* dw), (w, ki, keys, n, Hi, Di, u, dI, dqi, dwi, dw)) {
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
DSA_KERNEL(void, IndexerKeyGrad, (const float* qi, const float* wi, const float* kis, const int32_t* ents, int n, int K, int Hi, int Di, const float* dI, float* dki), (qi, wi, kis, ents, n, K, Hi, Di, dI, dki)) {
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

}  // namespace myriad::cpu::dsa
