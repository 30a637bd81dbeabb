// Scalar reference oracles for every BackendOps slot: plain loops, double
// accumulation, no threads. Correctness over speed; used only by tests.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cpu/dsa/dsa.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ref/ref_attention.h"

namespace myriad::ref {
namespace {

void Gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        double a = ta == Trans::kNo ? A[i * lda + k] : A[k * lda + i];
        double b = tb == Trans::kNo ? B[k * ldb + j] : B[j * ldb + k];
        acc += a * b;
      }
      double c = beta == 0.f ? 0.0 : (double)beta * C[i * ldc + j];
      C[i * ldc + j] = (float)(alpha * acc + c);
    }
}

// fp32 -> bf16 -> fp32, round to nearest even (NaN stays NaN); subnormals
// flush to signed zero, as vcvtne2ps2bf16 does.
double RoundBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) {
    u &= 0x80000000u;
  } else if ((u & 0x7fffffffu) > 0x7f800000u) {
    u |= 0x00400000u;
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

void GemmBf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        double a = RoundBf16(ta == Trans::kNo ? A[i * lda + k] : A[k * lda + i]);
        double b = RoundBf16(tb == Trans::kNo ? B[k * ldb + j] : B[j * ldb + k]);
        acc += a * b;
      }
      double c = beta == 0.f ? 0.0 : (double)beta * C[i * ldc + j];
      C[i * ldc + j] = (float)(alpha * acc + c);
    }
}

void RmsnormFwd(const float* x, const float* w, float eps, int64_t N, int64_t C, float* out,
                float* rstd) {
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += (double)x[n * C + c] * x[n * C + c];
    double r = 1.0 / std::sqrt(ss / C + eps);
    rstd[n] = (float)r;
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = (float)(x[n * C + c] * r * w[c]);
  }
}

// y = x r w with r = (mean(x^2)+eps)^-1/2:
// dx_i = r w_i g_i - r^3/C x_i sum_j g_j w_j x_j ; dw_i = sum_n g_i x_i r.
void RmsnormBwd(const float* dout, const float* x, const float* w, const float* rstd, int64_t N,
                int64_t C, float* dx, float* dw) {
  for (int64_t n = 0; n < N; ++n) {
    const float* g = dout + n * C;
    const float* xr = x + n * C;
    double r = rstd[n];
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += (double)g[c] * w[c] * xr[c];
    for (int64_t c = 0; c < C; ++c) dx[n * C + c] += (float)(r * w[c] * g[c] - r * r * r / C * xr[c] * dot);
  }
  for (int64_t c = 0; c < C; ++c) {
    double acc = 0;
    for (int64_t n = 0; n < N; ++n) acc += (double)dout[n * C + c] * x[n * C + c] * rstd[n];
    dw[c] += (float)acc;
  }
}

void Rope(float* x, int64_t N, int H, int D, int64_t head_stride, const int32_t* pos,
          const float* cos_table, const float* sin_table, bool inverse) {
  int half = D / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int h = 0; h < H; ++h) {
      float* v = x + (n * H + h) * head_stride;
      for (int i = 0; i < half; ++i) {
        double c = cos_table[(int64_t)pos[n] * half + i];
        double s = sin_table[(int64_t)pos[n] * half + i];
        if (inverse) s = -s;
        double a = v[i], b = v[i + half];
        v[i] = (float)(a * c - b * s);
        v[i + half] = (float)(a * s + b * c);
      }
    }
}

double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }

// gu [N, 2F] = [gate | up] per row; out [N, F].
void SwigluFwd(const float* gu, int64_t N, int64_t F, float* out) {
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gu + n * 2 * F;
    const float* u = g + F;
    for (int64_t f = 0; f < F; ++f) out[n * F + f] = (float)(g[f] * Sigmoid(g[f]) * u[f]);
  }
}

// dout [N, F]; dgu [N, 2F] = [dgate | dup] per row.
void SwigluBwd(const float* dout, const float* gu, int64_t N, int64_t F, float* dgu) {
  for (int64_t n = 0; n < N; ++n) {
    const float* gr = gu + n * 2 * F;
    float* dg = dgu + n * 2 * F;
    for (int64_t f = 0; f < F; ++f) {
      double g = gr[f], s = Sigmoid(g);
      double d = dout[n * F + f], u = gr[F + f];
      dg[f] = (float)(d * u * s * (1.0 + g * (1.0 - s)));
      dg[F + f] = (float)(d * g * s);
    }
  }
}

void SoftmaxXent(const float* logits, const int32_t* targets, int64_t N, int64_t V,
                 float grad_scale, float* losses, float* dlogits) {
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    int32_t t = targets[n];
    double mx = l[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, (double)l[j]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(l[j] - mx);
    double lse = mx + std::log(sum);
    losses[n] = t < 0 ? 0.f : (float)(lse - l[t]);
    if (!dlogits) continue;
    float* d = dlogits + n * V;  // may alias l: each element read before written
    for (int64_t j = 0; j < V; ++j) {
      double p = std::exp(l[j] - lse);
      d[j] = t < 0 ? 0.f : (float)((p - (j == t ? 1.0 : 0.0)) * grad_scale);
    }
  }
}

// Routing by sorting: scores in double, a stable sort of expert indices by
// descending score + bias, and the permutation as a stable sort of the N*K
// (expert, token) rows.
void MoeRoute(const MoeRouteParams& p) {
  const int64_t N = p.N, E = p.E, K = p.K;
  for (int64_t t = 0; t < N; ++t) {
    std::vector<double> s(E);
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, (double)p.logits[t * E + e]);
    for (int64_t e = 0; e < E; ++e) {
      double l = p.logits[t * E + e];
      s[e] = p.sigmoid ? 1.0 / (1.0 + std::exp(-l)) : std::exp(l - mx);
      sum += s[e];
    }
    if (!p.sigmoid)
      for (auto& v : s) v /= sum;
    // Group-limited: rank the groups by the sum of their two best biased
    // scores (a stable sort: ties keep the lower group) and let only the
    // experts of the first topk_group compete.
    auto biased = [&](int64_t e) { return s[e] + (p.bias ? p.bias[e] : 0.0); };
    std::vector<bool> allowed(E, true);
    if (p.n_group > 1) {
      const int64_t G = p.n_group, per = E / G;
      std::vector<double> gscore(G);
      for (int64_t g = 0; g < G; ++g) {
        std::vector<double> v;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) v.push_back(biased(e));
        std::sort(v.begin(), v.end(), std::greater<double>());
        gscore[g] = v[0] + (per >= 2 ? v[1] : 0.0);
      }
      std::vector<int64_t> gorder(G);
      for (int64_t g = 0; g < G; ++g) gorder[g] = g;
      std::stable_sort(gorder.begin(), gorder.end(), [&](int64_t a, int64_t b) { return gscore[a] > gscore[b]; });
      for (int64_t e = 0; e < E; ++e) allowed[e] = false;
      for (int64_t j = 0; j < p.topk_group; ++j)
        for (int64_t e = gorder[j] * per; e < (gorder[j] + 1) * per; ++e) allowed[e] = true;
    }
    std::vector<int32_t> order;
    for (int64_t e = 0; e < E; ++e)
      if (allowed[e]) order.push_back((int32_t)e);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return biased(a) > biased(b); });
    double z = 0;
    for (int64_t k = 0; k < K; ++k) z += s[order[k]];
    for (int64_t k = 0; k < K; ++k) {
      p.sel[t * K + k] = order[k];
      p.weights[t * K + k] = (float)(p.scale * (p.normalize ? s[order[k]] / z : s[order[k]]));
    }
    for (int64_t e = 0; e < E; ++e) p.scores[t * E + e] = (float)s[e];
  }
  std::vector<int64_t> rows(N * K);
  for (int64_t i = 0; i < N * K; ++i) rows[i] = i;
  std::stable_sort(rows.begin(), rows.end(), [&](int64_t a, int64_t b) { return p.sel[a] < p.sel[b]; });
  for (int64_t e = 0; e <= E; ++e) p.expert_offset[e] = 0;
  for (int64_t r = 0; r < N * K; ++r) {
    p.perm[r] = (int32_t)(rows[r] / K);
    p.pos[rows[r]] = (int32_t)r;
    p.expert_offset[p.sel[rows[r]] + 1]++;
  }
  for (int64_t e = 0; e < E; ++e) p.expert_offset[e + 1] += p.expert_offset[e];
}

// Router backward by the chain rule written out: the Jacobian of the
// normalised weights and of s' = s / sum(s) with respect to the scores, then
// the score function's Jacobian, each as an explicit E x E (or K x E)
// matrix product in double.
void MoeRouteBwd(const MoeRouteBackwardParams& p) {
  const int64_t N = p.N, E = p.E, K = p.K;
  for (int64_t t = 0; t < N; ++t) {
    const float* s = p.scores + t * E;
    const int32_t* sel = p.sel + t * K;
    std::vector<double> ds(E, 0.0);
    double z = 0;
    for (int64_t k = 0; k < K; ++k) z += s[sel[k]];
    // normalize: dw_k/ds_e = c ([e == sel_k]/z - s_sel_k [e in sel]/z^2);
    // else dw_k/ds_e = c [e == sel_k].
    for (int64_t k = 0; k < K; ++k)
      for (int64_t e = 0; e < E; ++e) {
        double in_sel = 0;
        for (int64_t j = 0; j < K; ++j) in_sel += sel[j] == e;
        double J = p.normalize ? p.scale * ((sel[k] == e ? 1.0 / z : 0.0) - in_sel * s[sel[k]] / (z * z))
                               : p.scale * (sel[k] == e ? 1.0 : 0.0);
        ds[e] += p.d_weights[t * K + k] * J;
      }
    if (p.balance) {
      const float* c = p.balance + (t / p.T) * E;
      double S = 0;
      for (int64_t e = 0; e < E; ++e) S += s[e];
      for (int64_t i = 0; i < E; ++i)  // ds'_i/ds_e = [i == e]/S - s_i/S^2
        for (int64_t e = 0; e < E; ++e) ds[e] += c[i] * ((i == e ? 1.0 / S : 0.0) - s[i] / (S * S));
    }
    for (int64_t e = 0; e < E; ++e) {
      double d = 0;
      for (int64_t j = 0; j < E; ++j) {
        double J = p.sigmoid ? (j == e ? (double)s[e] * (1.0 - s[e]) : 0.0)
                             : (double)s[j] * ((j == e ? 1.0 : 0.0) - s[e]);
        d += ds[j] * J;
      }
      p.d_logits[t * E + e] = (float)d;
    }
  }
}

void MoeBalanceStats(const float* scores, const int32_t* sel, int64_t B, int64_t T, int64_t E, int64_t K,
                     double* stats) {
  for (int64_t i = 0; i < 2 * B * E; ++i) stats[i] = 0;
  for (int64_t tok = 0; tok < B * T; ++tok) {
    const int64_t b = tok / T;
    double S = 0;
    for (int64_t e = 0; e < E; ++e) S += scores[tok * E + e];
    for (int64_t e = 0; e < E; ++e) stats[(B + b) * E + e] += scores[tok * E + e] / S;
    for (int64_t k = 0; k < K; ++k) stats[b * E + sel[tok * K + k]] += 1;
  }
}

// The merge as the sum of two softmax-weighted results in double:
// lse' = log(e^lse + e^lse_b), out' = (e^lse out + e^lse_b out_b) / e^lse'.
void AttentionMerge(float* out, int64_t out_batch_stride, float* lse, int64_t lse_stride, const float* out_b,
                    const float* lse_b, int B, int rows, int H, int D) {
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < rows; ++i) {
        float& l = lse[((int64_t)b * H + h) * lse_stride + i];
        const double lb = lse_b[((int64_t)b * H + h) * rows + i];
        if (std::isinf(lb) && lb < 0) continue;
        const double m = std::max<double>(l, lb);
        const double ea = std::exp(l - m), eb = std::exp(lb - m);
        float* o = out + b * out_batch_stride + ((int64_t)i * H + h) * D;
        const float* ob = out_b + (((int64_t)b * rows + i) * H + h) * D;
        for (int d = 0; d < D; ++d) o[d] = (float)((ea * o[d] + eb * ob[d]) / (ea + eb));
        l = (float)(m + std::log(ea + eb));
      }
}

void CopyRows(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t rows, int64_t width,
              float scale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) dst[r * ld_dst + c] = scale * src[r * ld_src + c];
}
void AddScaled(const float* x, const float* y, float alpha, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = (float)((double)x[i] + (double)alpha * y[i]);
}
void EmbeddingBwd(const float* dout, const int32_t* tok, int64_t N, int64_t C, float* dtable) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) dtable[(int64_t)tok[n] * C + c] += dout[n * C + c];
}
double Sum(const float* x, int64_t n) {
  long double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return (double)s;
}

void MoeGather(const float* src, const int32_t* idx, int64_t M, int64_t C, float* dst) {
  for (int64_t i = 0; i < M; ++i) std::memcpy(dst + i * C, src + (int64_t)idx[i] * C, C * sizeof(float));
}

void MoeCombine(const float* buf, const int32_t* pos, const float* w, int64_t N, int64_t K,
                int64_t C, float* out) {
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += (w ? (double)w[t * K + k] : 1.0) * buf[(int64_t)pos[t * K + k] * C + c];
      out[t * C + c] = (float)(out[t * C + c] + acc);
    }
}

void MoeCombineBwd(const float* dout, const float* buf, const int32_t* pos, const float* w,
                   int64_t N, int64_t K, int64_t C, float* dbuf, float* dw) {
  for (int64_t t = 0; t < N; ++t)
    for (int64_t k = 0; k < K; ++k) {
      int64_t r = pos[t * K + k];
      double wk = w ? w[t * K + k] : 1.0;
      for (int64_t c = 0; c < C; ++c) dbuf[r * C + c] = (float)(wk * dout[t * C + c]);
      if (dw) {
        double acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += (double)dout[t * C + c] * buf[r * C + c];
        dw[t * K + k] = (float)acc;
      }
    }
}

void AdamW(const AdamWParams& p) {
  double bc1 = 1.0 - std::pow((double)p.beta1, (double)p.step);
  double bc2 = 1.0 - std::pow((double)p.beta2, (double)p.step);
  for (int64_t i = 0; i < p.n; ++i) {
    double g = (double)p.grad[i] * p.grad_scale;
    double m = p.beta1 * (double)p.m[i] + (1.0 - p.beta1) * g;
    double v = p.beta2 * (double)p.v[i] + (1.0 - p.beta2) * g * g;
    p.m[i] = (float)m;
    p.v[i] = (float)v;
    double upd = (m / bc1) / (std::sqrt(v / bc2) + p.eps) + p.weight_decay * (double)p.param[i];
    p.param[i] = (float)(p.param[i] - p.lr * upd);
  }
}

double Sumsq(const float* x, int64_t n) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += (double)x[i] * x[i];
  return acc;
}

void GemvF32Row(const float* W, const float* x, int64_t out, int64_t in, float* y) {
  for (int64_t o = 0; o < out; ++o) {
    double acc = 0;
    for (int64_t i = 0; i < in; ++i) acc += (double)W[o * in + i] * x[i];
    y[o] = (float)acc;
  }
}

void GemvF32(const float* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  for (int64_t m = 0; m < rows; ++m) GemvF32Row(W, x + m * in, out, in, y + m * out);
}

// IEEE half -> float, bit by bit (subnormals, inf, nan included).
float HalfToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  float mag;
  if (exp == 0) mag = std::ldexp((float)mant, -24);
  else if (exp == 31) mag = mant ? NAN : INFINITY;
  else mag = std::ldexp((float)(mant | 0x400), exp - 25);
  uint32_t bits;
  std::memcpy(&bits, &mag, 4);
  bits |= sign;
  std::memcpy(&mag, &bits, 4);
  return mag;
}

void GemvF16(const uint16_t* W, const float* x, int64_t rows, int64_t out, int64_t in, float* y) {
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += (double)HalfToFloat(W[o * in + i]) * x[m * in + i];
      y[m * out + o] = (float)acc;
    }
}

// Up to kSkinnyRows rows, each row of x is quantised with its own absmax
// scale: xq = round_half_even(x / sx), sx = absmax/127; y[o] = scale[o] * sx
// * sum_i Wq[o,i] xq[i] (exact int sum). Above, W is dequantised
// ((float)Wq * scale, rounded to fp32) and x taken as it is.
void GemvQ8(const int8_t* Wq, const float* scale, const float* x, int64_t rows, int64_t out, int64_t in,
            float* y) {
  if (rows > kSkinnyRows) {
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < in; ++i) acc += (double)((float)Wq[o * in + i] * scale[o]) * x[m * in + i];
        y[m * out + o] = (float)acc;
      }
    return;
  }
  std::vector<int32_t> xq(in);
  for (int64_t m = 0; m < rows; ++m) {
    const float* xr = x + m * in;
    float amax = 0;
    for (int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(xr[i]));
    float sx = amax / 127.f;
    float inv = amax > 0 ? 127.f / amax : 0.f;
    for (int64_t i = 0; i < in; ++i) xq[i] = (int32_t)std::nearbyint(xr[i] * inv);
    for (int64_t o = 0; o < out; ++o) {
      int64_t acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += (int64_t)Wq[o * in + i] * xq[i];
      y[m * out + o] = (float)((double)acc * scale[o] * sx);
    }
  }
}

}  // namespace
}  // namespace myriad::ref

namespace myriad {

const BackendOps& RefOps() {
  static const BackendOps ops = [] {
    BackendOps o{};
    cpu::FillHostMemoryOps(&o);
    o.gemm = ref::Gemm;
    o.gemm_bf16 = ref::GemmBf16;
    o.rmsnorm_fwd = ref::RmsnormFwd;
    o.rmsnorm_bwd = ref::RmsnormBwd;
    o.rope = ref::Rope;
    o.swiglu_fwd = ref::SwigluFwd;
    o.swiglu_bwd = ref::SwigluBwd;
    o.softmax_xent = ref::SoftmaxXent;
    o.attention_fwd = ref::AttentionFwd;
    o.attention_bwd = ref::AttentionBwd;
    o.paged_attention = ref::PagedAttention;
    o.attention_merge = ref::AttentionMerge;
    o.moe_route = ref::MoeRoute;
    o.moe_route_bwd = ref::MoeRouteBwd;
    o.moe_balance_stats = ref::MoeBalanceStats;
    o.moe_gather = ref::MoeGather;
    o.moe_combine = ref::MoeCombine;
    o.moe_combine_bwd = ref::MoeCombineBwd;
    o.dsa_indexer_topk = cpu::dsa::ref::IndexerTopK;
    o.dsa_sparse_attention = cpu::dsa::ref::SparseAttention;
    o.dsa_sparse_attention_bwd = cpu::dsa::ref::SparseAttentionBackward;
    o.dsa_indexer_loss = cpu::dsa::ref::IndexerLoss;
    o.copy_rows = ref::CopyRows;
    o.add_scaled = ref::AddScaled;
    o.embedding_bwd = ref::EmbeddingBwd;
    o.sum = ref::Sum;
    o.adamw = ref::AdamW;
    o.sumsq = ref::Sumsq;
    o.gemv_f32 = ref::GemvF32;
    o.gemv_f16 = ref::GemvF16;
    o.gemv_q8 = ref::GemvQ8;
    return o;
  }();
  return ops;
}

}  // namespace myriad
