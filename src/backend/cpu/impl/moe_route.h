// BackendOps::moe_route for the CPU: tokens in parallel for scores, top-K
// and weights; the permutation is one ordered pass (N*K rows, cheap), so
// its result does not depend on the thread count.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/backend.h"

namespace myriad::cpu {
namespace {

inline void MoeRouteK(const MoeRouteParams& p) {
  const int64_t N = p.N, E = p.E, K = p.K;
#pragma omp parallel for schedule(static) if (N * E >= 4096)
  for (int64_t t = 0; t < N; ++t) {
    const float* l = p.logits + t * E;
    float* s = p.scores + t * E;
    if (p.sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.f / (1.f + std::exp(-l[e]));
    } else {
      float mx = l[0];
      for (int64_t e = 1; e < E; ++e) mx = mx < l[e] ? l[e] : mx;
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(l[e] - mx));
      for (int64_t e = 0; e < E; ++e) s[e] /= sum;
    }
    // Group-limited routing: only the experts of the topk_group best
    // groups compete (a group's score: its two best biased scores).
    bool keep[256];
    for (int64_t e = 0; e < E; ++e) keep[e] = true;
    if (p.n_group > 1) {
      const int64_t G = p.n_group, per = E / G;
      float gs[256];
      for (int64_t g = 0; g < G; ++g) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float v = s[e] + (p.bias ? p.bias[e] : 0.f);
          if (v > b1) b2 = b1, b1 = v;
          else if (v > b2) b2 = v;
        }
        gs[g] = per >= 2 ? b1 + b2 : b1;
      }
      bool kept[256] = {};
      for (int64_t j = 0; j < p.topk_group; ++j) {
        int64_t best_g = -1;
        for (int64_t g = 0; g < G; ++g)
          if (!kept[g] && (best_g < 0 || gs[g] > gs[best_g])) best_g = g;
        kept[best_g] = true;
      }
      for (int64_t e = 0; e < E; ++e) keep[e] = kept[e / per];
    }
    // Top-K by insertion into a descending list (E is small); a later
    // expert displaces only a strictly smaller value, so ties keep the
    // lower index.
    int32_t* sel = p.sel + t * K;
    float best[256];
    int n = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (!keep[e]) continue;
      const float v = s[e] + (p.bias ? p.bias[e] : 0.f);
      if (n < K || v > best[n - 1]) {
        int i = n < K ? n++ : static_cast<int>(K) - 1;
        while (i > 0 && best[i - 1] < v) {
          best[i] = best[i - 1];
          sel[i] = sel[i - 1];
          --i;
        }
        best[i] = v;
        sel[i] = static_cast<int32_t>(e);
      }
    }
    float z = 0;
    for (int64_t k = 0; k < K; ++k) z += s[sel[k]];
    for (int64_t k = 0; k < K; ++k)
      p.weights[t * K + k] = p.normalize ? p.scale * (s[sel[k]] / z) : p.scale * s[sel[k]];
  }
  int64_t* off = p.expert_offset;
  for (int64_t e = 0; e <= E; ++e) off[e] = 0;
  for (int64_t i = 0; i < N * K; ++i) ++off[p.sel[i] + 1];
  for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
  int64_t fill[256];
  for (int64_t e = 0; e < E; ++e) fill[e] = off[e];
  for (int64_t i = 0; i < N * K; ++i) {
    const int64_t row = fill[p.sel[i]]++;
    p.perm[row] = static_cast<int32_t>(i / K);
    p.pos[i] = static_cast<int32_t>(row);
  }
}

// Tokens in parallel; each row's sums in double, as the reference.
inline void MoeRouteBwdK(const MoeRouteBackwardParams& p) {
  const int64_t N = p.N, E = p.E, K = p.K;
#pragma omp parallel for schedule(static) if (N * E >= 4096)
  for (int64_t t = 0; t < N; ++t) {
    const float* sc = p.scores + t * E;
    const int32_t* sel = p.sel + t * K;
    const float* wt = p.weights + t * K;
    const float* dw = p.d_weights + t * K;
    float* dl = p.d_logits + t * E;
    double ds[256];
    for (int64_t e = 0; e < E; ++e) ds[e] = 0;
    // w_k = c s_sel[k] / z: d s_sel[k] += c (dw_k - sum_j (w_j / c) dw_j) / z;
    // without normalisation w_k = c s_sel[k]: d s_sel[k] += c dw_k.
    const double c = p.scale;
    if (p.normalize) {
      double z = 0, wdw = 0;
      for (int64_t k = 0; k < K; ++k) z += sc[sel[k]], wdw += static_cast<double>(wt[k]) / c * dw[k];
      for (int64_t k = 0; k < K; ++k) ds[sel[k]] += c * (dw[k] - wdw) / z;
    } else {
      for (int64_t k = 0; k < K; ++k) ds[sel[k]] += c * dw[k];
    }
    if (p.balance) {
      // s' = s / sum(s): d s_e += (c_e - sum_j c_j s'_j) / sum(s).
      const float* c = p.balance + (t / p.T) * E;
      double ssum = 0, dot = 0;
      for (int64_t e = 0; e < E; ++e) ssum += sc[e];
      for (int64_t e = 0; e < E; ++e) dot += static_cast<double>(c[e]) * sc[e] / ssum;
      for (int64_t e = 0; e < E; ++e) ds[e] += (c[e] - dot) / ssum;
    }
    if (p.sigmoid) {
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(ds[e] * sc[e] * (1.0 - sc[e]));
    } else {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[e] * sc[e];
      for (int64_t e = 0; e < E; ++e) dl[e] = static_cast<float>(sc[e] * (ds[e] - dot));
    }
  }
}

// Sequences in parallel; tokens in order within one (same bits for any
// thread count).
inline void MoeBalanceStatsK(const float* scores, const int32_t* sel, int64_t B, int64_t T, int64_t E,
                             int64_t K, double* stats) {
#pragma omp parallel for schedule(static) if (B * T * E >= 4096)
  for (int64_t b = 0; b < B; ++b) {
    double* cnt = stats + b * E;
    double* P = stats + (B + b) * E;
    for (int64_t e = 0; e < E; ++e) cnt[e] = P[e] = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t tok = b * T + t;
      const float* s = scores + tok * E;
      double ssum = 0;
      for (int64_t e = 0; e < E; ++e) ssum += s[e];
      for (int64_t e = 0; e < E; ++e) P[e] += s[e] / ssum;
      for (int64_t k = 0; k < K; ++k) cnt[sel[tok * K + k]] += 1.0;
    }
  }
}

}  // namespace
}  // namespace myriad::cpu
