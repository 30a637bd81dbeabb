// Scalar references of the DSA ops (the tests' oracles): plain loops over
// the definitions in dsa.h, double accumulation, no parallelism, written
// apart from the fast kernels (full sort for the selection, scatter for the
// key gradients).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "backend/cpu/dsa/dsa.h"

namespace myriad::cpu::dsa::ref {
namespace {

double DotD(const float* a, const float* b, int n) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += (double)a[i] * (double)b[i];
  return s;
}

// Element [b, t, h, d] of a token-major tensor with `heads` heads.
inline int64_t At(int64_t batch_stride, int b, int t, int heads, int h, int D) {
  return b * batch_stride + ((int64_t)t * heads + h) * D;
}

// The int8 path's quantisation as dsa.h specifies it (float arithmetic):
// q[d] = clamp(round-half-even(x[d] * (127 / amax)), -127, 127), scale amax / 127.
std::vector<int> Quantize(const float* x, int n, double* scale) {
  float amax = 0.f;
  for (int d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  std::vector<int> q(n);
  for (int d = 0; d < n; ++d) {
    const float y = x[d] * inv;
    float r = std::round(y);  // half away from zero; fix the halves to even
    if (std::fabs(y - std::trunc(y)) == 0.5f) r = 2.f * std::round(y / 2.f);
    q[d] = std::clamp((int)r, -127, 127);
  }
  *scale = (double)(amax / 127.f);
  return q;
}

// I(t, s) in double (for kInt8: of the quantised operands, dots exact).
double IndexerScore(const IndexerParams& p, int b, int t, int s) {
  const float* kr = IndexerKeyRow(p, b, s);
  double score = 0.0;
  for (int j = 0; j < p.Hi; ++j) {
    const float* qr = p.qi + At(p.qi_batch_stride, b, t, p.Hi, j, p.Di);
    const double w = (double)p.wi[b * p.wi_batch_stride + (int64_t)t * p.Hi + j];
    if (p.precision == IndexerPrecision::kInt8) {
      double sq = 0, sk = 0;
      const std::vector<int> q8 = Quantize(qr, p.Di, &sq), k8 = Quantize(kr, p.Di, &sk);
      int64_t dot = 0;
      for (int d = 0; d < p.Di; ++d) dot += (int64_t)q8[d] * k8[d];
      score += w * sq * sk * std::max<double>((double)dot, 0.0);
    } else {
      score += w * std::max(DotD(qr, kr, p.Di), 0.0);
    }
  }
  return score;
}

// The valid (>= 0) keys of idx[b, t].
std::vector<int> Selected(const int32_t* idx, int64_t stride, int K, int b, int t) {
  std::vector<int> keys;
  for (int j = 0; j < K; ++j) {
    const int32_t s = idx[b * stride + (int64_t)t * K + j];
    if (s >= 0) keys.push_back(s);
  }
  return keys;
}

// Scaled scores of (b, t, h) over keys, in double.
std::vector<double> MainScores(const SparseAttentionParams& p, int b, int t, int h,
                               const std::vector<int>& keys) {
  const int hk = h / (p.H / p.Hkv);
  std::vector<double> s(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    s[i] = (double)p.scale * DotD(p.q + At(p.q_batch_stride, b, t, p.H, h, p.D),
                                  p.k + At(p.kv_batch_stride, b, keys[i], p.Hkv, hk, p.D), p.D);
  return s;
}

}  // namespace

void IndexerTopK(const IndexerParams& p) {
  for (int b = 0; b < p.B; ++b) {
    for (int t = 0; t < p.Tq; ++t) {
      const int pos = p.Tk - p.Tq + t;
      std::vector<int> order;
      std::vector<double> score;
      for (int s = 0; s <= pos && s < p.Tk; ++s) {
        order.push_back(s);
        score.push_back(IndexerScore(p, b, t, s));
      }
      // Highest score first; stable, so equal scores keep ascending s.
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int c) { return score[a] > score[c]; });
      const int n = std::min<int>(p.K, (int)order.size());
      std::vector<int> chosen(order.begin(), order.begin() + n);
      std::sort(chosen.begin(), chosen.end());
      int32_t* out = p.idx + b * p.idx_batch_stride + (int64_t)t * p.K;
      for (int j = 0; j < p.K; ++j) out[j] = j < n ? chosen[j] : -1;
    }
  }
}

void SparseAttention(const SparseAttentionParams& p) {
  const int g = p.H / p.Hkv;
  for (int b = 0; b < p.B; ++b) {
    for (int t = 0; t < p.Tq; ++t) {
      const std::vector<int> keys = Selected(p.idx, p.idx_batch_stride, p.K, b, t);
      for (int h = 0; h < p.H; ++h) {
        const std::vector<double> s = MainScores(p, b, t, h, keys);
        double mx = -std::numeric_limits<double>::infinity();
        for (double x : s) mx = std::max(mx, x);
        double sum = 0.0;
        for (double x : s) sum += std::exp(x - mx);
        float* o = p.out + At(p.out_batch_stride, b, t, p.H, h, p.D);
        for (int d = 0; d < p.D; ++d) {
          double acc = 0.0;
          for (size_t i = 0; i < keys.size(); ++i)
            acc += std::exp(s[i] - mx) / sum *
                   (double)p.v[At(p.kv_batch_stride, b, keys[i], p.Hkv, h / g, p.D) + d];
          o[d] = keys.empty() ? 0.f : (float)acc;
        }
        if (p.lse)
          p.lse[((int64_t)b * p.H + h) * p.Tq + t] =
              keys.empty() ? -std::numeric_limits<float>::infinity() : (float)(mx + std::log(sum));
      }
    }
  }
}

void SparseAttentionBackward(const SparseAttentionBackwardParams& bp) {
  const SparseAttentionParams& p = bp.fwd;
  const int g = p.H / p.Hkv;
  for (int b = 0; b < p.B; ++b) {
    std::vector<double> dk((size_t)p.Tk * p.Hkv * p.D, 0.0), dv(dk.size(), 0.0);
    for (int t = 0; t < p.Tq; ++t) {
      const std::vector<int> keys = Selected(p.idx, p.idx_batch_stride, p.K, b, t);
      for (int h = 0; h < p.H; ++h) {
        const int hk = h / g;
        const float* dout = bp.dout + At(p.out_batch_stride, b, t, p.H, h, p.D);
        const float* out = p.out + At(p.out_batch_stride, b, t, p.H, h, p.D);
        const float* q = p.q + At(p.q_batch_stride, b, t, p.H, h, p.D);
        const double lse = p.lse[((int64_t)b * p.H + h) * p.Tq + t];
        const double drow = DotD(dout, out, p.D);
        const std::vector<double> s = MainScores(p, b, t, h, keys);
        std::vector<double> dq(p.D, 0.0);
        for (size_t i = 0; i < keys.size(); ++i) {
          const float* k = p.k + At(p.kv_batch_stride, b, keys[i], p.Hkv, hk, p.D);
          const float* v = p.v + At(p.kv_batch_stride, b, keys[i], p.Hkv, hk, p.D);
          const double P = std::exp(s[i] - lse);
          const double dP = DotD(dout, v, p.D);
          const double dS = P * (dP - drow);
          const int64_t kv = ((int64_t)keys[i] * p.Hkv + hk) * p.D;
          for (int d = 0; d < p.D; ++d) {
            dq[d] += dS * p.scale * k[d];
            dk[kv + d] += dS * p.scale * q[d];
            dv[kv + d] += P * dout[d];
          }
        }
        float* dqo = bp.dq + At(p.q_batch_stride, b, t, p.H, h, p.D);
        for (int d = 0; d < p.D; ++d) dqo[d] = (float)dq[d];
      }
    }
    for (int s = 0; s < p.Tk; ++s)
      for (int x = 0; x < p.Hkv * p.D; ++x) {
        const int64_t i = (int64_t)s * p.Hkv * p.D + x;
        bp.dk[b * p.kv_batch_stride + i] = (float)dk[i];
        bp.dv[b * p.kv_batch_stride + i] = (float)dv[i];
      }
  }
}

double IndexerLoss(const IndexerLossParams& lp) {
  const IndexerParams& ip = lp.indexer;
  const SparseAttentionParams& ap = lp.attn;
  const int Hi = ip.Hi, Di = ip.Di;
  const double rows = (double)ip.B * ip.Tq;
  double loss = 0.0;
  for (int b = 0; b < ip.B; ++b) {
    std::vector<double> dki((size_t)ip.Tk * Di, 0.0);
    for (int t = 0; t < ip.Tq; ++t) {
      const std::vector<int> keys = Selected(ip.idx, ip.idx_batch_stride, ip.K, b, t);
      const size_t n = keys.size();
      // p: the main attention's probabilities, averaged over heads.
      std::vector<double> pm(n, 0.0);
      for (int h = 0; h < ap.H; ++h) {
        const std::vector<double> s = MainScores(ap, b, t, h, keys);
        const double lse = ap.lse[((int64_t)b * ap.H + h) * ap.Tq + t];
        for (size_t i = 0; i < n; ++i) pm[i] += std::exp(s[i] - lse) / ap.H;
      }
      // q: softmax of the indexer scores over the selection.
      std::vector<double> I(n), qd(n);
      double mx = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < n; ++i) {
        I[i] = IndexerScore(ip, b, t, keys[i]);
        mx = std::max(mx, I[i]);
      }
      double z = 0.0;
      for (size_t i = 0; i < n; ++i) z += std::exp(I[i] - mx);
      for (size_t i = 0; i < n; ++i) {
        qd[i] = std::exp(I[i] - mx) / z;
        if (pm[i] > 0.0) loss += pm[i] * (std::log(pm[i]) - std::log(qd[i])) / rows;
      }
      // Gradients: dL/dI = (q - p) / rows, then through the relu heads.
      const float* qi = ip.qi + At(ip.qi_batch_stride, b, t, Hi, 0, Di);
      const float* wi = ip.wi + b * ip.wi_batch_stride + (int64_t)t * Hi;
      std::vector<double> dqi((size_t)Hi * Di, 0.0), dwi(Hi, 0.0);
      for (size_t i = 0; i < n; ++i) {
        const double dI = (qd[i] - pm[i]) / rows * lp.grad_scale;
        const float* ki = ip.ki + b * ip.ki_batch_stride + (int64_t)keys[i] * Di;
        for (int j = 0; j < Hi; ++j) {
          const double u = DotD(qi + (int64_t)j * Di, ki, Di);
          if (u <= 0.0) continue;
          dwi[j] += dI * u;
          for (int d = 0; d < Di; ++d) {
            dqi[(size_t)j * Di + d] += dI * wi[j] * ki[d];
            dki[(size_t)keys[i] * Di + d] += dI * wi[j] * qi[(int64_t)j * Di + d];
          }
        }
      }
      if (lp.dqi)
        for (int x = 0; x < Hi * Di; ++x)
          lp.dqi[At(ip.qi_batch_stride, b, t, Hi, 0, Di) + x] = (float)dqi[x];
      if (lp.dwi)
        for (int j = 0; j < Hi; ++j)
          lp.dwi[b * ip.wi_batch_stride + (int64_t)t * Hi + j] = (float)dwi[j];
    }
    if (lp.dki)
      for (int64_t x = 0; x < (int64_t)ip.Tk * Di; ++x)
        lp.dki[b * ip.ki_batch_stride + x] = (float)dki[x];
  }
  return loss;
}

}  // namespace myriad::cpu::dsa::ref
