#include "model/block.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "ops/ops.h"

namespace myriad {

namespace {
// Plain RoPE's inverse frequencies theta^(-2i/D), i < D/2, in double.
std::vector<double> PlainInvFreq(double theta, int64_t D) {
  std::vector<double> inv(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
  return inv;
}
}  // namespace

void RopeTables::Build(int64_t max_pos, int64_t D, double theta) { Build(max_pos, PlainInvFreq(theta, D), 1.0); }

void RopeTables::Build(int64_t max_pos, const std::vector<double>& inv_freq, double mscale) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  std::vector<float> c(max_pos * half), sn(max_pos * half);  // built on the host, then copied
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double ang = static_cast<double>(p) * inv_freq[i];
      c[p * half + i] = static_cast<float>(std::cos(ang) * mscale);
      sn[p * half + i] = static_cast<float>(std::sin(ang) * mscale);
    }
  FromHost(&cos, c);
  FromHost(&sin, sn);
}

namespace {
// yarn's attention scale: 0.1 * m * ln(s) + 1 for s > 1.
double YarnMscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }
}  // namespace

std::vector<double> RopeInvFreq(const ModelConfig& cfg, int64_t D) {
  const int64_t half = D / 2;
  const double theta = cfg.rope_theta, f = cfg.rope_factor;
  std::vector<double> inv = PlainInvFreq(theta, D);
  const double orig = static_cast<double>(cfg.rope_original_max_pos > 0 ? cfg.rope_original_max_pos : cfg.max_seq_len);
  if (cfg.rope_scaling == "linear") {
    for (double& v : inv) v /= f;
  } else if (cfg.rope_scaling == "llama3") {
    // Long wavelengths (beyond orig / low_freq_factor) slow down by the
    // factor, short ones (below orig / high_freq_factor) stay; in between,
    // a linear blend in orig / wavelength.
    const double lo = cfg.rope_low_freq_factor, hi = cfg.rope_high_freq_factor;
    const double low_wavelen = orig / lo, high_wavelen = orig / hi;
    for (double& v : inv) {
      const double wavelen = 2 * M_PI / v;
      if (wavelen > low_wavelen) {
        v /= f;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (orig / wavelen - lo) / (hi - lo);
        v = (1 - smooth) * v / f + smooth * v;
      }
    }
  } else if (cfg.rope_scaling == "yarn") {
    // Dims that turn fewer than beta_slow times over the original context
    // are interpolated (divided by the factor), those that turn more than
    // beta_fast times are kept, with a linear ramp between the two.
    auto corr_dim = [&](double rotations) {
      return static_cast<double>(D) * std::log(orig / (rotations * 2 * M_PI)) / (2 * std::log(theta));
    };
    double low = corr_dim(cfg.rope_beta_fast), high = corr_dim(cfg.rope_beta_slow);
    if (cfg.rope_truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(D - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolate = 1 - ramp;
      inv[i] = inv[i] / f * (1 - extrapolate) + inv[i] * extrapolate;
    }
  }
  return inv;
}

double RopeAttentionFactor(const ModelConfig& cfg) {
  if (cfg.rope_scaling != "yarn") return 1.0;
  return cfg.rope_attention_factor > 0 ? cfg.rope_attention_factor : YarnMscale(cfg.rope_factor, 1.0);
}

void RopeTables::Build(const ModelConfig& cfg) {
  Build(cfg.max_seq_len, RopeInvFreq(cfg, cfg.rope_dim()), RopeAttentionFactor(cfg));
}

float AttentionScale(const ModelConfig& cfg) {
  double s = 1.0 / std::sqrt(static_cast<double>(cfg.qk_head_dim()));
  if (cfg.mla() && cfg.rope_scaling != "none" && cfg.rope_mscale_all_dim > 0) {
    const double m = YarnMscale(cfg.rope_factor, cfg.rope_mscale_all_dim);
    s *= m * m;
  }
  return static_cast<float>(s);
}

void MlaProject(const ModelConfig& cfg, const BlockWeights<float*>& w, const float* a, int64_t N,
                const int32_t* pos, const RopeTables& rope, MlaRows* r, float* q) {
  const int64_t C = cfg.d_model, H = cfg.n_heads, Dn = cfg.qk_nope_head_dim, Dr = cfg.qk_rope_head_dim;
  const int64_t Dqk = Dn + Dr, R = cfg.kv_lora_rank, Qr = cfg.q_lora_rank;
  if (Qr > 0) {
    Fit(&r->cq_pre, N * Qr); Fit(&r->cq, N * Qr); Fit(&r->rstd_cq, N);
    ops::Linear(a, w.q_a, N, C, Qr, r->cq_pre.data());
    ops::RmsNorm(r->cq_pre.data(), w.q_a_norm, kMlaNormEps, N, Qr, r->cq.data(), r->rstd_cq.data());
    ops::Linear(r->cq.data(), w.q_b, N, Qr, H * Dqk, q);
  } else {
    ops::Linear(a, w.wq, N, C, H * Dqk, q);
  }
  Fit(&r->lat, N * (R + Dr)); Fit(&r->c_pre, N * R); Fit(&r->c, N * R); Fit(&r->rstd_c, N);
  ops::Linear(a, w.kv_a, N, C, R + Dr, r->lat.data());
  // c_kv's norm reads its rows out of the latent rows (the norm wants them contiguous).
  ops::CopyRows(r->lat.data(), R + Dr, r->c_pre.data(), R, N, R);
  ops::RmsNorm(r->c_pre.data(), w.kv_a_norm, kMlaNormEps, N, R, r->c.data(), r->rstd_c.data());
  ops::Rope(q + Dn, N, static_cast<int>(H), static_cast<int>(Dr), pos, rope.cos.data(), rope.sin.data(), false, Dqk);
  ops::Rope(r->lat.data() + R, N, 1, static_cast<int>(Dr), pos, rope.cos.data(), rope.sin.data(), false, R + Dr);
}

// The rotation of the first dsa_index_rope_dim dims of each head (Di apart).
void IndexerRope(const ModelConfig& cfg, float* qi, float* ki, int64_t N, const int32_t* pos,
                 const RopeTables& t, bool inverse) {
  const int64_t Hi = cfg.dsa_index_heads, Di = cfg.dsa_index_dim;
  const int R = static_cast<int>(cfg.dsa_index_rope_dim);
  if (R <= 0 || N == 0) return;
  ops::Rope(qi, N, static_cast<int>(Hi), R, pos, t.cos.data(), t.sin.data(), inverse, Di);
  ops::Rope(ki, N, 1, R, pos, t.cos.data(), t.sin.data(), inverse, Di);
}


namespace {
const float* Ones(int64_t N, Buf<float>* ones) {
  if (static_cast<int64_t>(ones->size()) < N) FromHost(ones, std::vector<float>(N, 1.f));
  return ones->data();
}
}  // namespace

void AddBias(const float* b, int64_t N, int64_t out, float* y, Buf<float>* ones) {
  ops::Linear(Ones(N, ones), b, N, 1, out, y, /*accumulate=*/true);
}

void BiasBackward(const float* dy, int64_t N, int64_t out, float* db, Buf<float>* ones) {
  // No dx: the weight argument is not read (db stands in for it).
  ops::LinearBackward(dy, Ones(N, ones), db, N, 1, out, nullptr, false, db);
}

namespace {

AttentionParams MakeAttention(const BlockContext& ctx, BlockActs* a) {
  const int H = static_cast<int>(ctx.dims->H), Hkv = static_cast<int>(ctx.dims->Hkv);
  const int D = static_cast<int>(ctx.cfg->head_dim());
  AttentionParams p;
  p.B = a->B; p.Tq = a->T; p.Tk = a->T; p.H = H; p.Hkv = Hkv; p.D = D;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  p.causal = true;
  p.q_batch_stride = static_cast<int64_t>(a->T) * H * D;
  p.kv_batch_stride = static_cast<int64_t>(a->T) * Hkv * D;
  p.out_batch_stride = p.q_batch_stride;
  p.q = a->q.data(); p.k = a->k.data(); p.v = a->v.data();
  p.out = a->att.data(); p.lse = a->lse.data();
  return p;
}

// DSA index parameters over this block's acts.
IndexerParams MakeIndexer(const ModelConfig& cfg, BlockActs* a, int K) {
  const int Hi = static_cast<int>(cfg.dsa_index_heads), Di = static_cast<int>(cfg.dsa_index_dim);
  const int64_t IA = static_cast<int64_t>(Hi) * Di + Di + Hi;
  IndexerParams p;
  p.B = a->B; p.Tq = a->T; p.Tk = a->T; p.Hi = Hi; p.Di = Di; p.K = K;
  p.precision = cfg.dsa_index_precision == "int8" ? IndexerPrecision::kInt8
                                                   : IndexerPrecision::kFp32;
  // qi, ki, wi live interleaved in the rows of ia: strides per token of IA.
  // The ops take contiguous arrays, so they are split into the tail of ia.
  const int64_t N = static_cast<int64_t>(a->B) * a->T;
  float* base = a->ia.data() + N * IA;  // [N*Hi*Di | N*Di | N*Hi] after the rows
  p.qi = base;
  p.ki = base + N * Hi * Di;
  p.wi = base + N * (Hi * Di + Di);
  p.qi_batch_stride = static_cast<int64_t>(a->T) * Hi * Di;
  p.ki_batch_stride = static_cast<int64_t>(a->T) * Di;
  p.wi_batch_stride = static_cast<int64_t>(a->T) * Hi;
  p.idx_batch_stride = static_cast<int64_t>(a->T) * K;
  p.idx = a->idx.data();
  return p;
}

SparseAttentionParams MakeSparse(const AttentionParams& d, const int32_t* idx, int K) {
  SparseAttentionParams p;
  p.B = d.B; p.Tq = d.Tq; p.Tk = d.Tk; p.H = d.H; p.Hkv = d.Hkv; p.D = d.D; p.K = K;
  p.scale = d.scale;
  p.q_batch_stride = d.q_batch_stride; p.kv_batch_stride = d.kv_batch_stride;
  p.out_batch_stride = d.out_batch_stride; p.idx_batch_stride = static_cast<int64_t>(d.Tq) * K;
  p.q = d.q; p.k = d.k; p.v = d.v; p.idx = idx; p.out = d.out; p.lse = d.lse;
  return p;
}

// The indexer of the first layer of a sharing group: projections, then the
// selection (or, dense, every causal key).
void DsaSelect(const BlockContext& ctx, const BlockWeights<float*>& w, const float* a_in, BlockActs* a) {
  const ModelConfig& cfg = *ctx.cfg;
  const int B = a->B, T = a->T;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg.d_model;
  const int64_t Hi = cfg.dsa_index_heads, Di = cfg.dsa_index_dim, IA = Hi * Di + Di + Hi;
  const int K = static_cast<int>(std::min<int64_t>(cfg.dsa_topk, T));
  a->sparse = !ctx.dsa_dense && K < T;
  a->K = a->sparse ? K : T;
  Fit(&a->ia, 2 * N * IA);
  Fit(&a->idx, static_cast<size_t>(N) * a->K);
  // One GEMM for qi | ki | wi (adjacent weights), then split into arrays.
  ops::Linear(a_in, w.iq, N, C, IA, a->ia.data());
  float* qi = a->ia.data() + N * IA;
  float* ki = qi + N * Hi * Di;
  float* wi = ki + N * Di;
  const float* rows = a->ia.data();
  // Per-head weights scaled by 1/sqrt(Hi*Di) keep the scores O(1) at init.
  const float ws = 1.f / std::sqrt(static_cast<float>(Hi * Di));
  ops::CopyRows(rows, IA, qi, Hi * Di, N, Hi * Di);
  ops::CopyRows(rows + Hi * Di, IA, ki, Di, N, Di);
  ops::CopyRows(rows + Hi * Di + Di, IA, wi, Hi, N, Hi, ws);
  if (cfg.dsa_index_rope_dim > 0) IndexerRope(cfg, qi, ki, N, ctx.pos, *ctx.index_rope, false);
  if (a->sparse) {
    ops::IndexerTopK(MakeIndexer(cfg, a, a->K));
  } else {
    // Every key s <= t (ascending), -1 after: dense attention, and the
    // indexer learns the dense distribution.
    // (Index data, built on the host and copied over.)
    std::vector<int32_t> idx(static_cast<size_t>(N) * T);
    for (int64_t n = 0; n < N; ++n) {
      const int t = static_cast<int>(n % T);
      for (int s = 0; s < T; ++s) idx[n * T + s] = s <= t ? s : -1;
    }
    ops::CopyToDevice(a->idx.data(), idx.data(), idx.size() * sizeof(int32_t));
  }
}

}  // namespace

namespace {

// MLA in training, unabsorbed: each head's k = [k_nope | k_pe] and v come
// from kv_b c_kv, k_pe shared by the heads. The flash attention op takes one
// head width, so q, k and v are padded with zeros to Da = max(nope + rope,
// v): zero columns change neither the scores nor the v part of the output.
int64_t MlaPadWidth(const ModelConfig& cfg) { return std::max(cfg.qk_head_dim(), cfg.v_head_dim); }

AttentionParams MlaAttentionParams(const BlockContext& ctx, BlockActs* a) {
  const int H = static_cast<int>(ctx.cfg->n_heads), Da = static_cast<int>(MlaPadWidth(*ctx.cfg));
  AttentionParams p;
  p.B = a->B; p.Tq = a->T; p.Tk = a->T; p.H = H; p.Hkv = H; p.D = Da;
  p.scale = AttentionScale(*ctx.cfg);
  p.causal = true;
  p.q_batch_stride = p.kv_batch_stride = p.out_batch_stride = static_cast<int64_t>(a->T) * H * Da;
  p.q = a->q.data(); p.k = a->k.data(); p.v = a->v.data();
  p.out = a->att_pad.data(); p.lse = a->lse.data();
  return p;
}

// a->att [N, H*v] = MLA attention of the normed input a_in [N, C].
void MlaForward(const BlockContext& ctx, const BlockWeights<float*>& w, const float* a_in, BlockActs* a) {
  const ModelConfig& cfg = *ctx.cfg;
  const int64_t N = static_cast<int64_t>(a->B) * a->T, H = cfg.n_heads, NH = N * H;
  const int64_t Dn = cfg.qk_nope_head_dim, Dr = cfg.qk_rope_head_dim, Dv = cfg.v_head_dim;
  const int64_t Dqk = Dn + Dr, R = cfg.kv_lora_rank, Da = MlaPadWidth(cfg);
  Fit(&a->q, NH * Da); Fit(&a->k, NH * Da); Fit(&a->v, NH * Da); Fit(&a->att_pad, NH * Da);
  Fit(&a->kv_up, NH * (Dn + Dv)); Fit(&a->att, NH * Dv);
  Buf<float>& qc = ctx.scratch->qkv;  // q before padding (when padded)
  float* q = a->q.data();
  if (Da > Dqk) {
    Fit(&qc, NH * Dqk);
    q = qc.data();
  }
  MlaProject(cfg, w, a_in, N, ctx.pos, *ctx.rope, &a->mla, q);
  if (Da > Dqk) {
    ops::Zero(a->q.data(), NH * Da);
    ops::Zero(a->k.data(), NH * Da);
    ops::CopyRows(q, Dqk, a->q.data(), Da, NH, Dqk);
  }
  if (Da > Dv) ops::Zero(a->v.data(), NH * Da);
  ops::Linear(a->mla.c.data(), w.kv_b, N, R, H * (Dn + Dv), a->kv_up.data());
  ops::CopyRows(a->kv_up.data(), Dn + Dv, a->k.data(), Da, NH, Dn);
  for (int64_t h = 0; h < H; ++h)
    ops::CopyRows(a->mla.lat.data() + R, R + Dr, a->k.data() + h * Da + Dn, H * Da, N, Dr);
  ops::CopyRows(a->kv_up.data() + Dn, Dn + Dv, a->v.data(), Da, NH, Dv);
  ops::Attention(MlaAttentionParams(ctx, a));
  ops::CopyRows(a->att_pad.data(), Da, a->att.data(), Dv, NH, Dv);
}

// d_a [N, C] (writes) from d_att [N, H*v]; accumulates the MLA weights' grads.
void MlaBackward(const BlockContext& ctx, const BlockWeights<float*>& w, const BlockWeights<float*>& gw,
                 BlockActs* a, const float* a_in, const float* d_att, BlockScratch* s, float* d_a) {
  const ModelConfig& cfg = *ctx.cfg;
  const int64_t N = static_cast<int64_t>(a->B) * a->T, H = cfg.n_heads, NH = N * H, C = cfg.d_model;
  const int64_t Dn = cfg.qk_nope_head_dim, Dr = cfg.qk_rope_head_dim, Dv = cfg.v_head_dim;
  const int64_t Dqk = Dn + Dr, R = cfg.kv_lora_rank, Qr = cfg.q_lora_rank, Da = MlaPadWidth(cfg);
  const MlaRows& m = a->mla;
  Fit(&s->d_pad, NH * Da); Fit(&s->d_q, NH * Da); Fit(&s->d_k, NH * Da); Fit(&s->d_v, NH * Da);
  if (Da > Dv) ops::Zero(s->d_pad.data(), NH * Da);
  ops::CopyRows(d_att, Dv, s->d_pad.data(), Da, NH, Dv);
  AttentionBackwardParams bp;
  bp.fwd = MlaAttentionParams(ctx, a);
  bp.dout = s->d_pad.data();
  bp.dq = s->d_q.data(); bp.dk = s->d_k.data(); bp.dv = s->d_v.data();
  ops::AttentionBackward(bp);
  // q: drop the padding, rotate the rope part's gradient back.
  float* dq = s->d_q.data();
  if (Da > Dqk) {
    Fit(&s->d_qkv, NH * Dqk);
    ops::CopyRows(s->d_q.data(), Da, s->d_qkv.data(), Dqk, NH, Dqk);
    dq = s->d_qkv.data();
  }
  ops::Rope(dq + Dn, N, static_cast<int>(H), static_cast<int>(Dr), ctx.pos, ctx.rope->cos.data(),
            ctx.rope->sin.data(), true, Dqk);
  // kv_b's output: each head's [k_nope | v] gradient.
  Fit(&s->d_kv_up, NH * (Dn + Dv));
  ops::CopyRows(s->d_k.data(), Da, s->d_kv_up.data(), Dn + Dv, NH, Dn);
  ops::CopyRows(s->d_v.data(), Da, s->d_kv_up.data() + Dn, Dn + Dv, NH, Dv);
  // k_pe is shared: its gradient is the sum over the heads, rotated back.
  Fit(&s->d_kpe, 2 * N * Dr);
  float* d_kpe = s->d_kpe.data();
  float* d_head = d_kpe + N * Dr;
  ops::CopyRows(s->d_k.data() + Dn, H * Da, d_kpe, Dr, N, Dr);
  for (int64_t h = 1; h < H; ++h) {
    ops::CopyRows(s->d_k.data() + h * Da + Dn, H * Da, d_head, Dr, N, Dr);
    ops::AddScaled(d_kpe, d_head, 1.f, N * Dr, d_kpe);
  }
  ops::Rope(d_kpe, N, 1, static_cast<int>(Dr), ctx.pos, ctx.rope->cos.data(), ctx.rope->sin.data(), true);
  // c_kv = norm(c_pre): through kv_b and the norm into the latent row's gradient.
  Fit(&s->d_lat, N * (R + Dr)); Fit(&s->d_low, 2 * N * std::max(R, Qr));
  float* d_c = s->d_low.data();
  float* d_pre = d_c + N * std::max(R, Qr);
  ops::LinearBackward(s->d_kv_up.data(), m.c.data(), w.kv_b, N, R, H * (Dn + Dv), d_c, false, gw.kv_b);
  ops::Zero(d_pre, N * R);
  ops::RmsNormBackward(d_c, m.c_pre.data(), w.kv_a_norm, m.rstd_c.data(), N, R, d_pre, gw.kv_a_norm);
  ops::CopyRows(d_pre, R, s->d_lat.data(), R + Dr, N, R);
  ops::CopyRows(d_kpe, Dr, s->d_lat.data() + R, R + Dr, N, Dr);
  ops::LinearBackward(s->d_lat.data(), a_in, w.kv_a, N, C, R + Dr, d_a, false, gw.kv_a);
  if (Qr > 0) {
    ops::LinearBackward(dq, m.cq.data(), w.q_b, N, Qr, H * Dqk, d_c, false, gw.q_b);
    ops::Zero(d_pre, N * Qr);
    ops::RmsNormBackward(d_c, m.cq_pre.data(), w.q_a_norm, m.rstd_cq.data(), N, Qr, d_pre, gw.q_a_norm);
    ops::LinearBackward(d_pre, a_in, w.q_a, N, C, Qr, d_a, true, gw.q_a);
  } else {
    ops::LinearBackward(dq, a_in, w.wq, N, C, H * Dqk, d_a, true, gw.wq);
  }
}

}  // namespace

void SplitQkv(const float* qkv, int64_t N, int64_t qd, int64_t kvd, float* q, float* k, float* v) {
  const int64_t row = qd + 2 * kvd;
  ops::CopyRows(qkv, row, q, qd, N, qd);
  ops::CopyRows(qkv + qd, row, k, kvd, N, kvd);
  ops::CopyRows(qkv + qd + kvd, row, v, kvd, N, kvd);
}

void JoinQkv(const float* q, const float* k, const float* v, int64_t N, int64_t qd, int64_t kvd, float* qkv) {
  const int64_t row = qd + 2 * kvd;
  ops::CopyRows(q, qd, qkv, row, N, qd);
  ops::CopyRows(k, kvd, qkv + qd, row, N, kvd);
  ops::CopyRows(v, kvd, qkv + qd + kvd, row, N, kvd);
}

void BlockForward(const BlockContext& ctx, const BlockWeights<float*>& w, const float* x_in,
                  int B, int T, BlockActs* a, float* x_out) {
  const ModelConfig& cfg = *ctx.cfg;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg.d_model;
  const int H = static_cast<int>(ctx.dims->H), Hkv = static_cast<int>(ctx.dims->Hkv);
  const int D = static_cast<int>(cfg.head_dim());
  const float eps = static_cast<float>(cfg.norm_eps);
  // Sequence parallelism: x_in, x_out and the norms hold this rank's Ns rows;
  // attention and FFN run on all N rows (gathered) with this rank's shard of
  // heads and widths, and their partial outputs are reduce-scattered.
  const bool sp = ctx.hooks && ctx.hooks->SeqParallel();
  const int64_t Ns = sp ? ctx.hooks->OwnRows(N).size() : N;
  a->B = B; a->T = T; a->x_in = x_in;
  Fit(&a->a, Ns * C); Fit(&a->rstd1, Ns);
  if (!w.mla) { Fit(&a->q, N * H * D); Fit(&a->k, N * Hkv * D); Fit(&a->v, N * Hkv * D); Fit(&a->att, N * H * D); }
  Fit(&a->lse, static_cast<size_t>(B) * H * T);
  const int64_t att_width = w.mla ? H * cfg.v_head_dim : static_cast<int64_t>(H) * D;  // o_proj's input
  Fit(&a->x_mid, Ns * C); Fit(&a->f, Ns * C); Fit(&a->rstd2, Ns); Fit(&a->ffn_out, Ns * C);
  Buf<float>& part = ctx.scratch->part;
  if (sp) { Fit(&a->a_full, N * C); Fit(&a->f_full, N * C); Fit(&part, N * C); }

  // Attention: a = norm(x); q,k,v = proj(a); rope; att = softmax(qk^T)v.
  ops::RmsNorm(x_in, w.attn_norm, eps, Ns, C, a->a.data(), a->rstd1.data());
  if (sp) ctx.hooks->GatherRows(a->a.data(), a->a_full.data(), N, C);
  const float* a_in = sp ? a->a_full.data() : a->a.data();
  if (w.mla) {
    MlaForward(ctx, w, a_in, a);
  } else {
    // q_proj, k_proj and v_proj are adjacent in the parameter buffer: one GEMM.
    CHECK(w.wk == w.wq + static_cast<int64_t>(H) * D * C && w.wv == w.wk + static_cast<int64_t>(Hkv) * D * C);
    const int64_t QKV = static_cast<int64_t>(H + 2 * Hkv) * D;
    Buf<float>& qkv = ctx.scratch->qkv;
    Fit(&qkv, N * QKV);
    ops::Linear(a_in, w.wq, N, C, QKV, qkv.data());
    if (w.bq) AddBias(w.bq, N, QKV, qkv.data(), &ctx.scratch->ones);
    if (w.q_norm) {
      // Qwen3: each head's q and k RMS-normed (weights [D], shared by the heads).
      Fit(&a->q_pre, N * H * D); Fit(&a->k_pre, N * Hkv * D); Fit(&a->rstd_q, N * H); Fit(&a->rstd_k, N * Hkv);
      SplitQkv(qkv.data(), N, H * D, Hkv * D, a->q_pre.data(), a->k_pre.data(), a->v.data());
      ops::RmsNorm(a->q_pre.data(), w.q_norm, eps, N * H, D, a->q.data(), a->rstd_q.data());
      ops::RmsNorm(a->k_pre.data(), w.k_norm, eps, N * Hkv, D, a->k.data(), a->rstd_k.data());
    } else {
      SplitQkv(qkv.data(), N, H * D, Hkv * D, a->q.data(), a->k.data(), a->v.data());
    }
    ops::Rope(a->q.data(), N, H, D, ctx.pos, ctx.rope->cos.data(), ctx.rope->sin.data(), false);
    ops::Rope(a->k.data(), N, Hkv, D, ctx.pos, ctx.rope->cos.data(), ctx.rope->sin.data(), false);
    const AttentionParams ap = MakeAttention(ctx, a);
    if (ctx.dsa_group) {
      // DSA: the group's first layer selects; every layer of the group attends
      // to those keys (dense when every key is selected).
      if (w.indexer) DsaSelect(ctx, w, a_in, a);
      BlockActs* g = ctx.dsa_group;
      a->idx_used = g->idx.data();
      a->K = g->K;
      a->sparse = g->sparse;
      if (a->sparse) ops::SparseAttention(MakeSparse(ap, a->idx_used, a->K));
      else ops::Attention(ap);
    } else if (!ctx.hooks || !ctx.hooks->AttentionForward(ctx.block, ap)) {
      ops::Attention(ap);
    }
  }
  // x_mid = x_in + att @ Wo^T (summed over tp ranks' heads).
  if (!sp) {
    ops::Copy(x_in, N * C, a->x_mid.data());
    ops::Linear(a->att.data(), w.wo, N, att_width, C, a->x_mid.data(), /*accumulate=*/true);
  } else {
    ops::Linear(a->att.data(), w.wo, N, att_width, C, part.data());
    ctx.hooks->ReduceScatterRows(part.data(), a->x_mid.data(), N, C);
    ops::AddScaled(a->x_mid.data(), x_in, 1.f, Ns * C, a->x_mid.data());
  }

  // FFN on f = norm(x_mid).
  ops::RmsNorm(a->x_mid.data(), w.ffn_norm, eps, Ns, C, a->f.data(), a->rstd2.data());
  if (sp) ctx.hooks->GatherRows(a->f.data(), a->f_full.data(), N, C);
  const float* f_in = sp ? a->f_full.data() : a->f.data();
  float* ffn = sp ? part.data() : a->ffn_out.data();
  if (!w.moe) {
    const int64_t F = ctx.dims->F;
    // gate_proj and up_proj are adjacent in the parameter buffer: one GEMM.
    CHECK(w.w_up == w.w_gate + F * C);
    Fit(&a->gu, N * 2 * F); Fit(&a->h, N * F);
    ops::Linear(f_in, w.w_gate, N, C, 2 * F, a->gu.data());
    ops::SwiGlu(a->gu.data(), N, F, a->h.data());
    ops::Linear(a->h.data(), w.w_down, N, F, C, ffn);
  } else {
    MoeForward(ctx, w, f_in, B, T, &a->moe, ffn);
  }
  if (sp) ctx.hooks->ReduceScatterRows(part.data(), a->ffn_out.data(), N, C);
  ops::AddScaled(a->x_mid.data(), a->ffn_out.data(), 1.f, Ns * C, x_out);
}

void BlockBackward(const BlockContext& ctx, const BlockWeights<float*>& w,
                   const BlockWeights<float*>& gw, BlockActs* a, const float* d_out,
                   float loss_scale, BlockScratch* s, float* d_in) {
  const ModelConfig& cfg = *ctx.cfg;
  const int B = a->B, T = a->T;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg.d_model;
  const int H = static_cast<int>(ctx.dims->H), Hkv = static_cast<int>(ctx.dims->Hkv);
  const int D = static_cast<int>(cfg.head_dim());
  // Sequence parallelism mirrors the forward: gathers become reduce-scatters
  // and the other way round.
  const bool sp = ctx.hooks && ctx.hooks->SeqParallel();
  const int64_t Ns = sp ? ctx.hooks->OwnRows(N).size() : N;
  Fit(&s->d_mid, Ns * C); Fit(&s->d_f, N * C);
  if (sp) { Fit(&s->d_full, N * C); Fit(&s->d_own, Ns * C); }
  const float* dO = d_out;
  if (sp) {
    ctx.hooks->GatherRows(d_out, s->d_full.data(), N, C);
    dO = s->d_full.data();
  }
  const float* f_in = sp ? a->f_full.data() : a->f.data();

  // FFN: d_f = dFFN/df; d_mid = d_out + RmsNorm' (d_f).
  if (!w.moe) {
    const int64_t F = ctx.dims->F;
    Fit(&s->d_h, N * F); Fit(&s->d_gu, N * 2 * F);
    ops::LinearBackward(dO, a->h.data(), w.w_down, N, F, C, s->d_h.data(), false, gw.w_down);
    ops::SwiGluBackward(s->d_h.data(), a->gu.data(), N, F, s->d_gu.data());
    ops::LinearBackward(s->d_gu.data(), f_in, w.w_gate, N, C, 2 * F, s->d_f.data(), false, gw.w_gate);
  } else {
    MoeBackward(ctx, w, gw, f_in, B, T, &a->moe, dO, loss_scale, s, s->d_f.data());
  }
  const float* d_f = s->d_f.data();
  if (sp) {
    ctx.hooks->ReduceScatterRows(s->d_f.data(), s->d_own.data(), N, C);
    d_f = s->d_own.data();
  }
  ops::Copy(d_out, Ns * C, s->d_mid.data());
  ops::RmsNormBackward(d_f, a->x_mid.data(), w.ffn_norm, a->rstd2.data(), Ns, C, s->d_mid.data(), gw.ffn_norm);

  // Attention.
  const int64_t att_width = w.mla ? H * cfg.v_head_dim : static_cast<int64_t>(H) * D;  // o_proj's input
  Fit(&s->d_att, N * std::max<int64_t>(att_width, H * D)); Fit(&s->d_a, N * C);
  if (!w.mla) { Fit(&s->d_q, N * H * D); Fit(&s->d_k, N * Hkv * D); Fit(&s->d_v, N * Hkv * D); }
  const float* dM = s->d_mid.data();
  if (sp) {
    ctx.hooks->GatherRows(s->d_mid.data(), s->d_full.data(), N, C);
    dM = s->d_full.data();
  }
  ops::LinearBackward(dM, a->att.data(), w.wo, N, att_width, C, s->d_att.data(), false, gw.wo);
  if (w.mla) {
    MlaBackward(ctx, w, gw, a, sp ? a->a_full.data() : a->a.data(), s->d_att.data(), s, s->d_a.data());
  } else {
    AttentionBackwardParams bp;
    bp.fwd = MakeAttention(ctx, a);
    bp.dout = s->d_att.data();
    bp.dq = s->d_q.data(); bp.dk = s->d_k.data(); bp.dv = s->d_v.data();
    if (ctx.dsa_group && a->sparse) {
      SparseAttentionBackwardParams sb;
      sb.fwd = MakeSparse(bp.fwd, a->idx_used, a->K);
      sb.dout = bp.dout;
      sb.dq = bp.dq; sb.dk = bp.dk; sb.dv = bp.dv;
      ops::SparseAttentionBackward(sb);
    } else if (ctx.dsa_group || !ctx.hooks || !ctx.hooks->AttentionBackward(ctx.block, bp)) {
      ops::AttentionBackward(bp);
    }
    if (ctx.dsa_group && w.indexer) {
      // The indexer learns this layer's attention distribution (KL); its
      // gradient reaches only its own weights (the input is detached).
      const int64_t Hi = cfg.dsa_index_heads, Di = cfg.dsa_index_dim, IA = Hi * Di + Di + Hi;
      IndexerLossParams lp;
      lp.indexer = MakeIndexer(cfg, a, a->K);
      lp.attn = MakeSparse(bp.fwd, a->idx.data(), a->K);
      Buf<float>& dia = s->d_qkv;  // free until below
      Fit(&dia, 2 * N * IA);
      float* dqi = dia.data() + N * IA;
      float* dki = dqi + N * Hi * Di;
      float* dwi = dki + N * Di;
      lp.dqi = dqi; lp.dki = dki; lp.dwi = dwi;
      lp.grad_scale = loss_scale;
      a->indexer_loss = ops::IndexerLoss(lp);
      // Gradients of the rotated qi, ki back to before the rotation.
      if (cfg.dsa_index_rope_dim > 0) IndexerRope(cfg, dqi, dki, N, ctx.pos, *ctx.index_rope, true);
      const float ws = 1.f / std::sqrt(static_cast<float>(Hi * Di));
      float* rows = dia.data();
      ops::CopyRows(dqi, Hi * Di, rows, IA, N, Hi * Di);
      ops::CopyRows(dki, Di, rows + Hi * Di, IA, N, Di);
      ops::CopyRows(dwi, Hi, rows + Hi * Di + Di, IA, N, Hi, ws);
      const float* a_in_i = sp ? a->a_full.data() : a->a.data();
      ops::LinearBackward(rows, a_in_i, w.iq, N, C, IA, nullptr, false, gw.iq);
    }
    ops::Rope(s->d_q.data(), N, H, D, ctx.pos, ctx.rope->cos.data(), ctx.rope->sin.data(), true);
    ops::Rope(s->d_k.data(), N, Hkv, D, ctx.pos, ctx.rope->cos.data(), ctx.rope->sin.data(), true);
    const int64_t QKV = static_cast<int64_t>(H + 2 * Hkv) * D;
    Fit(&s->d_qkv, N * QKV);
    if (w.q_norm) {
      // Through the per-head norms: d_qkv's q and k parts from d_q, d_k (the
      // pre-norm gradients go to d_att and d_a, free until below).
      Fit(&s->d_a, std::max<int64_t>(N * C, N * Hkv * D));
      float* dqp = s->d_att.data();
      float* dkp = s->d_a.data();
      ops::Zero(dqp, N * H * D);
      ops::Zero(dkp, N * Hkv * D);
      ops::RmsNormBackward(s->d_q.data(), a->q_pre.data(), w.q_norm, a->rstd_q.data(), N * H, D, dqp, gw.q_norm);
      ops::RmsNormBackward(s->d_k.data(), a->k_pre.data(), w.k_norm, a->rstd_k.data(), N * Hkv, D, dkp, gw.k_norm);
      JoinQkv(dqp, dkp, s->d_v.data(), N, H * D, Hkv * D, s->d_qkv.data());
    } else {
      JoinQkv(s->d_q.data(), s->d_k.data(), s->d_v.data(), N, H * D, Hkv * D, s->d_qkv.data());
    }
    if (w.bq) BiasBackward(s->d_qkv.data(), N, QKV, gw.bq, &s->ones);
    const float* a_in = sp ? a->a_full.data() : a->a.data();
    ops::LinearBackward(s->d_qkv.data(), a_in, w.wq, N, C, QKV, s->d_a.data(), false, gw.wq);
  }
  const float* d_a = s->d_a.data();
  if (sp) {
    ctx.hooks->ReduceScatterRows(s->d_a.data(), s->d_own.data(), N, C);
    d_a = s->d_own.data();
  }
  ops::Copy(s->d_mid.data(), Ns * C, d_in);
  ops::RmsNormBackward(d_a, a->x_in, w.attn_norm, a->rstd1.data(), Ns, C, d_in, gw.attn_norm);
}

}  // namespace myriad
