#include "backend/cpu/ref/ref_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace myriad::ref {
namespace {

// Pointers to row t of head h of batch b in each tensor.
struct View {
  const AttentionParams& p;
  int64_t QIdx(int b, int t, int h) const {
    return b * p.q_batch_stride + (int64_t)t * p.H * p.D + (int64_t)h * p.D;
  }
  int64_t KvIdx(int b, int t, int hk) const {
    return b * p.kv_batch_stride + (int64_t)t * p.Hkv * p.D + (int64_t)hk * p.D;
  }
  int64_t OIdx(int b, int t, int h) const {
    return b * p.out_batch_stride + (int64_t)t * p.H * p.D + (int64_t)h * p.D;
  }
  bool Allowed(int i, int j) const { return !p.causal || j <= i + (p.Tk - p.Tq); }
};

// probs [Tq, Tk] = softmax(scale * q k^T) with the causal mask; lse [Tq].
void Probs(const View& v, int b, int h, std::vector<double>& probs, std::vector<double>& lse) {
  const AttentionParams& p = v.p;
  int hk = h / (p.H / p.Hkv);
  probs.assign((size_t)p.Tq * p.Tk, 0.0);
  lse.assign(p.Tq, 0.0);
  for (int i = 0; i < p.Tq; ++i) {
    double mx = -std::numeric_limits<double>::infinity();
    std::vector<double> s(p.Tk, 0.0);
    for (int j = 0; j < p.Tk; ++j) {
      if (!v.Allowed(i, j)) continue;
      double dot = 0;
      for (int d = 0; d < p.D; ++d) dot += (double)p.q[v.QIdx(b, i, h) + d] * p.k[v.KvIdx(b, j, hk) + d];
      s[j] = dot * p.scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int j = 0; j < p.Tk; ++j)
      if (v.Allowed(i, j)) sum += std::exp(s[j] - mx);
    for (int j = 0; j < p.Tk; ++j)
      if (v.Allowed(i, j)) probs[(size_t)i * p.Tk + j] = std::exp(s[j] - mx) / sum;
    lse[i] = mx + std::log(sum);
  }
}

}  // namespace

void AttentionFwd(const AttentionParams& p) {
  View v{p};
  std::vector<double> probs, lse;
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      int hk = h / (p.H / p.Hkv);
      Probs(v, b, h, probs, lse);
      for (int i = 0; i < p.Tq; ++i) {
        for (int d = 0; d < p.D; ++d) {
          double acc = 0;
          for (int j = 0; j < p.Tk; ++j) acc += probs[(size_t)i * p.Tk + j] * p.v[v.KvIdx(b, j, hk) + d];
          p.out[v.OIdx(b, i, h) + d] = (float)acc;
        }
        if (p.lse) p.lse[((int64_t)b * p.H + h) * p.Tq + i] = (float)lse[i];
      }
    }
}

// dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(P * dP)); dQ = scale dS K;
// dK = scale dS^T Q. Does not use p.fwd.out or p.fwd.lse (recomputes them).
void AttentionBwd(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  View v{p};
  // Zero dk/dv (they accumulate over the query heads of a group).
  for (int b = 0; b < p.B; ++b)
    for (int t = 0; t < p.Tk; ++t)
      for (int hk = 0; hk < p.Hkv; ++hk)
        for (int d = 0; d < p.D; ++d) {
          bp.dk[v.KvIdx(b, t, hk) + d] = 0;
          bp.dv[v.KvIdx(b, t, hk) + d] = 0;
        }
  std::vector<double> probs, lse;
  std::vector<double> dk((size_t)p.Tk * p.D), dv((size_t)p.Tk * p.D);
  int group = p.H / p.Hkv;
  for (int b = 0; b < p.B; ++b)
    for (int hk = 0; hk < p.Hkv; ++hk) {
      std::fill(dk.begin(), dk.end(), 0.0);
      std::fill(dv.begin(), dv.end(), 0.0);
      for (int h = hk * group; h < (hk + 1) * group; ++h) {
        Probs(v, b, h, probs, lse);
        for (int i = 0; i < p.Tq; ++i) {
          const float* dO = bp.dout + v.OIdx(b, i, h);
          std::vector<double> ds(p.Tk, 0.0);
          double rowsum = 0;
          for (int j = 0; j < p.Tk; ++j) {
            double pij = probs[(size_t)i * p.Tk + j];
            double dp = 0;
            for (int d = 0; d < p.D; ++d) dp += (double)dO[d] * p.v[v.KvIdx(b, j, hk) + d];
            ds[j] = dp;
            rowsum += pij * dp;
            for (int d = 0; d < p.D; ++d) dv[(size_t)j * p.D + d] += pij * dO[d];
          }
          for (int j = 0; j < p.Tk; ++j) ds[j] = probs[(size_t)i * p.Tk + j] * (ds[j] - rowsum);
          for (int d = 0; d < p.D; ++d) {
            double acc = 0;
            for (int j = 0; j < p.Tk; ++j) acc += ds[j] * p.k[v.KvIdx(b, j, hk) + d];
            bp.dq[v.QIdx(b, i, h) + d] = (float)(acc * p.scale);
          }
          for (int j = 0; j < p.Tk; ++j)
            for (int d = 0; d < p.D; ++d)
              dk[(size_t)j * p.D + d] += ds[j] * p.scale * p.q[v.QIdx(b, i, h) + d];
        }
      }
      for (int j = 0; j < p.Tk; ++j)
        for (int d = 0; d < p.D; ++d) {
          bp.dk[v.KvIdx(b, j, hk) + d] = (float)dk[(size_t)j * p.D + d];
          bp.dv[v.KvIdx(b, j, hk) + d] = (float)dv[(size_t)j * p.D + d];
        }
    }
}

void PagedAttention(const PagedAttentionParams& p) {
  const int group = p.H / p.Hkv;
  // Offset of head hk's row of key t of sequence s, from p.k / p.v.
  auto at = [&](int s, int t, int hk) {
    const int32_t b = p.blocks[(int64_t)s * p.max_blocks + t / p.block_tokens];
    return b * p.block_stride + (int64_t)(t % p.block_tokens) * p.token_stride + (int64_t)hk * p.D;
  };
  for (int s = 0; s < p.n_seq; ++s) {
    const int n = p.q_start[s + 1] - p.q_start[s];
    for (int i = 0; i < n; ++i) {
      const int pos = p.kv_len[s] - n + i;  // sees keys [0, pos]
      const int64_t r = p.q_start[s] + i, row = r * p.H * p.D;
      // The keys this row attends to: [0, pos], or its selection.
      std::vector<int> keys;
      if (p.sel) {
        for (int j = 0; j < p.sel_k && p.sel[r * p.sel_k + j] >= 0; ++j) keys.push_back(p.sel[r * p.sel_k + j]);
      } else {
        for (int t = 0; t <= pos; ++t) keys.push_back(t);
      }
      const int nk = (int)keys.size();
      for (int h = 0; h < p.H; ++h) {
        const int hk = h / group;
        const float* q = p.q + row + (int64_t)h * p.D;
        std::vector<double> sc(nk);
        double mx = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < nk; ++j) {
          double dot = 0;
          for (int d = 0; d < p.D; ++d) dot += (double)q[d] * p.k[at(s, keys[j], hk) + d];
          sc[j] = dot * p.scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j < nk; ++j) sum += sc[j] = std::exp(sc[j] - mx);
        for (int d = 0; d < p.D; ++d) {
          double acc = 0;
          for (int j = 0; j < nk; ++j) acc += sc[j] * p.v[at(s, keys[j], hk) + d];
          p.out[row + (int64_t)h * p.D + d] = nk ? (float)(acc / sum) : 0.f;
        }
      }
    }
  }
}

}  // namespace myriad::ref
