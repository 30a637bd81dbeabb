#include "model/inference.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/half.h"
#include "ops/ops.h"

namespace myriad {

bool ParseWeightFormat(const std::string& s, WeightFormat* out) {
  if (s == "fp32" || s == "f32") return *out = WeightFormat::kF32, true;
  if (s == "fp16" || s == "f16") return *out = WeightFormat::kF16, true;
  if (s == "int8" || s == "q8") return *out = WeightFormat::kQ8, true;
  return false;
}

const char* WeightFormatName(WeightFormat f) {
  switch (f) {
    case WeightFormat::kF32: return "fp32";
    case WeightFormat::kF16: return "fp16";
    case WeightFormat::kQ8: return "int8";
  }
  return "?";
}

void InferLinear::Init(const float* w, int64_t out, int64_t in, WeightFormat fmt) {
  out_ = out; in_ = in; fmt_ = fmt; f32_ = w;
  if (fmt == WeightFormat::kF32) return;
  // The conversion runs on the host, once: the matrix comes over, its
  // reduced form goes back.
  std::vector<float> h(out * in);
  ops::CopyToHost(h.data(), w, h.size() * sizeof(float));
  if (fmt == WeightFormat::kF16) {
    std::vector<uint16_t> f16(out * in);
    for (int64_t i = 0; i < out * in; ++i) f16[i] = FloatToHalf(h[i]);
    FromHost(&f16_, f16);
  } else if (fmt == WeightFormat::kQ8) {
    std::vector<int8_t> q8(out * in);
    std::vector<float> scale(out);
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o) {
      float amax = 0;
      for (int64_t i = 0; i < in; ++i) amax = std::max(amax, std::fabs(h[o * in + i]));
      float s = amax > 0 ? amax / 127.f : 1.f;
      scale[o] = s;
      for (int64_t i = 0; i < in; ++i)
        q8[o * in + i] = static_cast<int8_t>(std::lrint(std::clamp(h[o * in + i] / s, -127.f, 127.f)));
    }
    FromHost(&q8_, q8);
    FromHost(&scale_, scale);
  }
}

void InferLinear::Apply(const float* x, int64_t n, float* y) const {
  switch (fmt_) {
    case WeightFormat::kF32:
      ops::Linear(x, f32_, n, in_, out_, y);
      return;
    case WeightFormat::kF16:  // W read once for all n rows (a blocked GEMM for prefill)
      ops::GemvF16(f16_.data(), x, n, out_, in_, y);
      return;
    case WeightFormat::kQ8:
      ops::GemvQ8(q8_.data(), scale_.data(), x, n, out_, in_, y);
      return;
  }
}

int64_t InferLinear::bytes() const {
  switch (fmt_) {
    case WeightFormat::kF32: return out_ * in_ * 4;
    case WeightFormat::kF16: return out_ * in_ * 2;
    case WeightFormat::kQ8: return out_ * in_ + out_ * 4;
  }
  return 0;
}

InferenceWeights::InferenceWeights(const Model& model, WeightFormat fmt)
    : model_(model), cfg_(model.config()), fmt_(fmt) {
  const int64_t C = cfg_.d_model;
  auto W = model.layout().Bind(const_cast<float*>(model.params()));
  biases_.resize(model.biases().size());
  for (size_t i = 0; i < biases_.size(); ++i) FromHost(&biases_[i], model.biases()[i]);
  embed_ = W.embed;
  norm_ = W.norm;
  head_.Init(W.head, cfg_.vocab_size, C, fmt);
  int bias_i = 0;  // the model's biases: MoE layers in order, then the MTP blocks'
  layers_.resize(cfg_.n_layers);
  for (int64_t l = 0; l < cfg_.n_layers; ++l) InitLayer(W.layers[l], fmt, &layers_[l], &bias_i);
  mtp_.resize(cfg_.mtp_depth);
  for (int64_t j = 0; j < cfg_.mtp_depth; ++j) {
    const auto& m = W.mtp[j];
    Mtp& M = mtp_[j];
    M.enorm = m.enorm;
    M.hnorm = m.hnorm;
    M.norm = m.norm;
    M.eh_proj.Init(m.eh_proj, C, 2 * C, fmt);
    InitLayer(m.block, fmt, &M.block, &bias_i);
  }
}

void InferenceWeights::RefreshBiases() {
  CHECK_MSG(model_.biases().size() == biases_.size(), "RefreshBiases: the model's MoE blocks changed");
  for (size_t i = 0; i < biases_.size(); ++i) {
    const std::vector<float>& h = model_.biases()[i];
    CHECK_MSG(h.size() == biases_[i].size(), "RefreshBiases: a selection bias changed size");
    ops::CopyToDevice(biases_[i].data(), h.data(), h.size() * sizeof(float));
  }
}

void InferenceWeights::InitLayer(const BlockWeights<float*>& w, WeightFormat fmt, Layer* Lp, int* bias_i) {
  const int64_t C = cfg_.d_model, D = cfg_.head_dim(), H = cfg_.n_heads, Hkv = cfg_.n_kv_heads;
  Layer& L = *Lp;
  L.moe = w.moe;
  L.attn_norm = w.attn_norm;
  L.ffn_norm = w.ffn_norm;
  L.bqkv = w.bq;
  L.q_norm = w.q_norm;
  L.k_norm = w.k_norm;
  if (w.mla) {
    L.mla = true;
    L.mla_w = w;
    L.wo.Init(w.wo, C, H * cfg_.v_head_dim, fmt);
  } else {
    L.wq.Init(w.wq, H * D, C, fmt);
    L.wk.Init(w.wk, Hkv * D, C, fmt);
    L.wv.Init(w.wv, Hkv * D, C, fmt);
    L.wo.Init(w.wo, C, H * D, fmt);
  }
  if (w.indexer) {
    // iq, ik and iw are adjacent in the parameter buffer (one GEMM in training too).
    CHECK(w.ik == w.iq + cfg_.dsa_index_heads * cfg_.dsa_index_dim * C &&
          w.iw == w.ik + cfg_.dsa_index_dim * C);
    L.indexer = w.iq;
  }
  if (!w.moe) {
    // gate_proj and up_proj are adjacent: one [2F, C] matrix.
    L.w_gate.Init(w.w_gate, 2 * cfg_.d_ff, C, fmt);
    L.w_down.Init(w.w_down, C, cfg_.d_ff, fmt);
  } else {
    const int64_t F = cfg_.d_expert, E = cfg_.n_routed_experts;
    L.router = w.router;
    L.bias = biases_[(*bias_i)++].data();
    L.e_gate.resize(E); L.e_down.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      L.e_gate[e].Init(w.e_gate[e], 2 * F, C, fmt);
      L.e_down[e].Init(w.e_down[e], C, F, fmt);
    }
    if (w.s_gate) {
      const int64_t SF = cfg_.n_shared_experts * F;
      L.s_gate.Init(w.s_gate, 2 * SF, C, fmt);
      L.s_down.Init(w.s_down, C, SF, fmt);
    }
  }
}

int64_t InferenceWeights::WeightBytesPerToken() const {
  int64_t b = head_.bytes();
  const ModelConfig& c = cfg_;
  // MLA's projections, read in fp32 (the o_proj is wo's).
  const int64_t mla_floats =
      (c.q_lora_rank > 0 ? c.q_lora_rank * c.d_model + c.n_heads * c.qk_head_dim() * c.q_lora_rank
                         : c.n_heads * c.qk_head_dim() * c.d_model) +
      (c.kv_lora_rank + c.qk_rope_head_dim) * c.d_model + c.n_heads * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank;
  for (const auto& L : layers_) {
    b += L.wq.bytes() + L.wk.bytes() + L.wv.bytes() + L.wo.bytes() + (L.mla ? 4 * mla_floats : 0);
    if (!L.moe) {
      b += L.w_gate.bytes() + L.w_down.bytes();
    } else {
      b += cfg_.top_k * (L.e_gate[0].bytes() + L.e_down[0].bytes());
      b += L.s_gate.bytes() + L.s_down.bytes() + cfg_.n_routed_experts * cfg_.d_model * 4;
    }
  }
  return b;
}

namespace {

// out[n, C] = FFN(f[n, C]) of one layer. MoE: route each token (the same rule
// as training), group the n*K (token, expert) rows by expert (tokens ascending
// within an expert), run each expert once over its rows, then combine per
// token in selection order, then add the shared experts.
void Ffn(const ModelConfig& cfg, const InferenceWeights::Layer& L, const float* f, int64_t n,
         InferenceScratch* s, float* out) {
  const int64_t C = cfg.d_model;
  if (!L.moe) {
    const int64_t F = cfg.d_ff;
    s->g.resize(n * 2 * F); s->h.resize(n * F);
    L.w_gate.Apply(f, n, s->g.data());
    ops::SwiGlu(s->g.data(), n, F, s->h.data());
    L.w_down.Apply(s->h.data(), n, out);
    return;
  }
  const int64_t E = cfg.n_routed_experts, K = cfg.top_k, F = cfg.d_expert, M = n * K;
  s->scores.resize(n * E);
  ops::Linear(f, L.router, n, C, E, s->scores.data());
  s->sel.resize(M); s->wsel.resize(M); s->perm.resize(M); s->slot.resize(M); s->offset.resize(E + 1);
  MoeRouteParams rp;  // the training rule (ops::MoeRoute): the same experts, weights and row order
  rp.N = n, rp.E = E, rp.K = K;
  SetRouting(cfg, &rp);
  rp.logits = s->scores.data(), rp.bias = L.bias, rp.scores = s->scores.data();
  rp.sel = s->sel.data(), rp.weights = s->wsel.data(), rp.pos = s->slot.data(), rp.perm = s->perm.data();
  rp.expert_offset = s->offset.data();
  ops::MoeRoute(rp);
  s->count.resize(E + 1);  // rows of expert e at [count[e], count[e+1]), read back to size the GEMMs
  ops::CopyToHost(s->count.data(), s->offset.data(), (E + 1) * sizeof(int64_t));
  s->xe.resize(M * C); s->ye.resize(M * C);
  ops::MoeGather(f, s->perm.data(), M, C, s->xe.data());
  s->g.resize(M * 2 * F); s->h.resize(M * F);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = s->count[e], m = s->count[e + 1] - r0;
    if (m == 0) continue;
    L.e_gate[e].Apply(s->xe.data() + r0 * C, m, s->g.data() + r0 * 2 * F);
    ops::SwiGlu(s->g.data() + r0 * 2 * F, m, F, s->h.data() + r0 * F);
    L.e_down[e].Apply(s->h.data() + r0 * F, m, s->ye.data() + r0 * C);
  }
  ops::Zero(out, n * C);
  ops::MoeCombine(s->ye.data(), s->slot.data(), s->wsel.data(), n, K, C, out);
  if (L.s_gate.out() > 0) {
    const int64_t SF = L.s_gate.out() / 2;
    s->g.resize(n * 2 * SF); s->h.resize(n * SF); s->ye.resize(n * C);
    L.s_gate.Apply(f, n, s->g.data());
    ops::SwiGlu(s->g.data(), n, SF, s->h.data());
    L.s_down.Apply(s->h.data(), n, s->ye.data());
    ops::AddScaled(out, s->ye.data(), 1.f, n * C, out);
  }
}

// The indexer's rows of N tokens from the normed input a (as the training
// block computes them): one GEMM for qi | ki | wi, split, wi scaled.
void IndexerRows(const ModelConfig& cfg, const float* w, const float* a, int64_t N, const int32_t* pos,
                 const RopeTables& rope, InferenceScratch* s, DsaRows* rows) {
  const int64_t C = cfg.d_model, Hi = cfg.dsa_index_heads, Di = cfg.dsa_index_dim, IA = Hi * Di + Di + Hi;
  s->ia.resize(N * IA); s->qi.resize(N * Hi * Di); s->ki.resize(N * Di); s->wi.resize(N * Hi);
  ops::Linear(a, w, N, C, IA, s->ia.data());
  const float ws = 1.f / std::sqrt(static_cast<float>(Hi * Di));
  const float* r = s->ia.data();
  ops::CopyRows(r, IA, s->qi.data(), Hi * Di, N, Hi * Di);
  ops::CopyRows(r + Hi * Di, IA, s->ki.data(), Di, N, Di);
  ops::CopyRows(r + Hi * Di + Di, IA, s->wi.data(), Hi, N, Hi, ws);
  IndexerRope(cfg, s->qi.data(), s->ki.data(), N, pos, rope, false);
  rows->qi = s->qi.data(); rows->ki = s->ki.data(); rows->wi = s->wi.data();
}

// MLA's absorbed query of N tokens: per head h, qa[:, h] = [q_nope_h W_UK_h
// (kv_lora_rank) | q_pe_h (qk_rope_head_dim)], with W_UK_h [nope, r] the
// k_nope rows of head h in kv_b [H*(nope + v), r]; scores against the latent
// rows [c_kv | k_pe] are then q_nope.k_nope + q_pe.k_pe (docs/open-models.md).
void MlaAbsorbQuery(const ModelConfig& cfg, const float* kv_b, const float* q, int64_t N, float* qa) {
  const int64_t H = cfg.n_heads, Dn = cfg.qk_nope_head_dim, Dr = cfg.qk_rope_head_dim, Dv = cfg.v_head_dim;
  const int64_t Dqk = Dn + Dr, R = cfg.kv_lora_rank, W = R + Dr;
  for (int64_t h = 0; h < H; ++h)
    ops::Gemm(Trans::kNo, Trans::kNo, N, R, Dn, 1.f, q + h * Dqk, H * Dqk, kv_b + h * (Dn + Dv) * R, R, 0.f,
              qa + h * W, H * W);
  ops::CopyRows(q + Dn, Dqk, qa + R, W, N * H, Dr);
}

// att [N, H*v] from the attention over latent rows att_lat [N, H, r + rope]:
// per head its softmax-weighted c_kv (the first r dims) times W_UV_h^T, the
// v rows of head h in kv_b.
void MlaValueUp(const ModelConfig& cfg, const float* kv_b, const float* att_lat, int64_t N, float* att) {
  const int64_t H = cfg.n_heads, Dn = cfg.qk_nope_head_dim, Dr = cfg.qk_rope_head_dim, Dv = cfg.v_head_dim;
  const int64_t R = cfg.kv_lora_rank, W = R + Dr;
  for (int64_t h = 0; h < H; ++h)
    ops::Gemm(Trans::kNo, Trans::kYes, N, Dv, R, 1.f, att_lat + h * W, H * W, kv_b + (h * (Dn + Dv) + Dn) * R, R, 0.f,
              att + h * Dv, H * Dv);
}

}  // namespace

IndexerParams SequenceIndexer(const ModelConfig& cfg, int64_t n, int64_t Tk, const float* qi, const float* ki,
                              const float* wi, int32_t* idx) {
  IndexerParams ip;
  ip.B = 1; ip.Tq = static_cast<int>(n); ip.Tk = static_cast<int>(Tk);
  ip.Hi = static_cast<int>(cfg.dsa_index_heads); ip.Di = static_cast<int>(cfg.dsa_index_dim);
  ip.K = static_cast<int>(cfg.dsa_topk);
  ip.precision = cfg.dsa_index_precision == "int8" ? IndexerPrecision::kInt8 : IndexerPrecision::kFp32;
  ip.qi_batch_stride = n * ip.Hi * ip.Di; ip.ki_batch_stride = Tk * ip.Di;
  ip.wi_batch_stride = n * ip.Hi; ip.idx_batch_stride = n * ip.K;
  ip.qi = qi; ip.ki = ki; ip.wi = wi; ip.idx = idx;
  return ip;
}

void DsaAttend(const ModelConfig& cfg, int64_t n, int64_t Tk, const float* q, const float* k,
               const float* v, const float* ki, const float* qi, const float* wi, bool select,
               Buf<int32_t>* idx, float* att) {
  const int64_t D = cfg.head_dim(), H = cfg.n_heads, Hkv = cfg.n_kv_heads;
  AttentionParams p;
  p.B = 1; p.Tq = static_cast<int>(n); p.Tk = static_cast<int>(Tk);
  p.H = static_cast<int>(H); p.Hkv = static_cast<int>(Hkv); p.D = static_cast<int>(D);
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  p.causal = true;
  p.q_batch_stride = n * H * D; p.kv_batch_stride = Tk * Hkv * D; p.out_batch_stride = n * H * D;
  p.q = q; p.k = k; p.v = v; p.out = att; p.lse = nullptr;
  if (Tk <= cfg.dsa_topk) {  // every key selected: dense, as the training block does
    ops::Attention(p);
    return;
  }
  const int K = static_cast<int>(cfg.dsa_topk);
  if (select) {
    idx->resize(static_cast<size_t>(n) * K);  // every entry written (-1 pads)
    ops::IndexerTopK(SequenceIndexer(cfg, n, Tk, qi, ki, wi, idx->data()));
  }
  CHECK_MSG(idx->size() == static_cast<size_t>(n) * K, "DSA: a layer without its group's selection");
  SparseAttentionParams sp;
  sp.B = 1; sp.Tq = p.Tq; sp.Tk = p.Tk; sp.H = p.H; sp.Hkv = p.Hkv; sp.D = p.D; sp.K = K;
  sp.scale = p.scale;
  sp.q_batch_stride = p.q_batch_stride; sp.kv_batch_stride = p.kv_batch_stride;
  sp.out_batch_stride = p.out_batch_stride; sp.idx_batch_stride = n * K;
  sp.q = q; sp.k = k; sp.v = v; sp.idx = idx->data(); sp.out = att; sp.lse = nullptr;
  ops::SparseAttention(sp);
}

namespace {

// One block over the N rows of s->x (in place): attention through `attn` as
// cache layer `cache_layer`, then the FFN. pos: device positions.
void LayerForward(const InferenceWeights& w, const InferenceWeights::Layer& L, int cache_layer, int64_t N,
                  const int32_t* pos, KvAttention* attn, InferenceScratch* s) {
  const ModelConfig& cfg = w.config();
  const int64_t C = cfg.d_model, D = cfg.head_dim(), H = cfg.n_heads, Hkv = cfg.n_kv_heads;
  const float eps = static_cast<float>(cfg.norm_eps);
  const RopeTables& rope = w.model().rope();
  s->a.resize(N * C); s->q.resize(N * H * D); s->att.resize(N * H * D);
  s->k.resize(N * Hkv * D); s->v.resize(N * Hkv * D);
  s->f.resize(N * C); s->tmp.resize(N * C); s->rstd.resize(N);
  ops::RmsNorm(s->x.data(), L.attn_norm, eps, N, C, s->a.data(), s->rstd.data());
  if (L.mla) {
    // The absorbed form: the cache holds each token's latent row only.
    const int64_t R = cfg.kv_lora_rank, Dr = cfg.qk_rope_head_dim, Wl = R + Dr;
    s->q.resize(N * H * cfg.qk_head_dim()); s->qa.resize(N * H * Wl); s->lat.resize(N * Wl);
    s->att_lat.resize(N * H * Wl); s->att.resize(N * H * cfg.v_head_dim);
    MlaProject(cfg, L.mla_w, s->a.data(), N, pos, rope, &s->mla, s->q.data());
    MlaAbsorbQuery(cfg, L.mla_w.kv_b, s->q.data(), N, s->qa.data());
    ops::CopyRows(s->mla.c.data(), R, s->lat.data(), Wl, N, R);
    ops::CopyRows(s->mla.lat.data() + R, Wl, s->lat.data() + R, Wl, N, Dr);
    attn->Attend(cache_layer, s->qa.data(), s->lat.data(), s->lat.data(), s->att_lat.data(), nullptr);
    MlaValueUp(cfg, L.mla_w.kv_b, s->att_lat.data(), N, s->att.data());
  } else {
    L.wq.Apply(s->a.data(), N, s->q.data());
    L.wk.Apply(s->a.data(), N, s->k.data());
    L.wv.Apply(s->a.data(), N, s->v.data());
    if (L.bqkv) {
      AddBias(L.bqkv, N, H * D, s->q.data(), &s->ones);
      AddBias(L.bqkv + H * D, N, Hkv * D, s->k.data(), &s->ones);
      AddBias(L.bqkv + (H + Hkv) * D, N, Hkv * D, s->v.data(), &s->ones);
    }
    if (L.q_norm) {  // per head, as training: rows of D
      s->qn.resize(N * H * D); s->rstd_h.resize(N * H);
      ops::Copy(s->q.data(), N * H * D, s->qn.data());
      ops::RmsNorm(s->qn.data(), L.q_norm, eps, N * H, D, s->q.data(), s->rstd_h.data());
      ops::Copy(s->k.data(), N * Hkv * D, s->qn.data());
      ops::RmsNorm(s->qn.data(), L.k_norm, eps, N * Hkv, D, s->k.data(), s->rstd_h.data());
    }
    ops::Rope(s->q.data(), N, H, D, pos, rope.cos.data(), rope.sin.data(), false);
    ops::Rope(s->k.data(), N, Hkv, D, pos, rope.cos.data(), rope.sin.data(), false);
    DsaRows rows;
    if (L.indexer) IndexerRows(cfg, L.indexer, s->a.data(), N, pos, w.model().index_rope(), s, &rows);
    attn->Attend(cache_layer, s->q.data(), s->k.data(), s->v.data(), s->att.data(), L.indexer ? &rows : nullptr);
  }
  L.wo.Apply(s->att.data(), N, s->tmp.data());
  ops::AddScaled(s->x.data(), s->tmp.data(), 1.f, N * C, s->x.data());
  ops::RmsNorm(s->x.data(), L.ffn_norm, eps, N, C, s->f.data(), s->rstd.data());
  Ffn(cfg, L, s->f.data(), N, s, s->tmp.data());
  ops::AddScaled(s->x.data(), s->tmp.data(), 1.f, N * C, s->x.data());
}

// Tokens and positions are host data: checked here, then copied to s->tok, s->pos.
void UploadTokens(const ModelConfig& cfg, const int32_t* tokens, const int32_t* pos, int64_t N, InferenceScratch* s) {
  for (int64_t i = 0; i < N; ++i) {
    CHECK_MSG(tokens[i] >= 0 && tokens[i] < cfg.vocab_size, "token id %d out of range", tokens[i]);
    CHECK_MSG(pos[i] >= 0 && pos[i] < cfg.max_seq_len, "position %d out of range", pos[i]);
  }
  s->tok.resize(N); s->pos.resize(N);
  ops::CopyToDevice(s->tok.data(), tokens, N * sizeof(int32_t));
  ops::CopyToDevice(s->pos.data(), pos, N * sizeof(int32_t));
}

// The logits [n_out, V] of rows out_rows of s->x (N rows), through `norm`
// and the head, copied to the host.
void HeadRows(const InferenceWeights& w, const float* norm, int64_t N, const int64_t* out_rows, int64_t n_out,
              InferenceScratch* s, float* logits) {
  const ModelConfig& cfg = w.config();
  const int64_t C = cfg.d_model;
  std::vector<int32_t> rows(n_out);
  for (int64_t r = 0; r < n_out; ++r) {
    CHECK(out_rows[r] >= 0 && out_rows[r] < N);
    rows[r] = static_cast<int32_t>(out_rows[r]);
  }
  s->rows.resize(n_out); s->last.resize(n_out * C);
  ops::CopyToDevice(s->rows.data(), rows.data(), n_out * sizeof(int32_t));
  ops::MoeGather(s->x.data(), s->rows.data(), n_out, C, s->last.data());
  s->rstd.resize(std::max(N, n_out));
  s->a.resize(std::max(N, n_out) * C);
  ops::RmsNorm(s->last.data(), norm, static_cast<float>(cfg.norm_eps), n_out, C, s->a.data(), s->rstd.data());
  s->logits.resize(n_out * cfg.vocab_size);
  w.head().Apply(s->a.data(), n_out, s->logits.data());
  ops::CopyToHost(logits, s->logits.data(), n_out * cfg.vocab_size * sizeof(float));  // the sampler's
}

}  // namespace

void InferenceForward(const InferenceWeights& w, const int32_t* tokens, const int32_t* pos, int64_t N,
                      KvAttention* attn, const int64_t* out_rows, int64_t n_out, InferenceScratch* s,
                      float* logits, float* hidden) {
  const ModelConfig& cfg = w.config();
  const int64_t C = cfg.d_model;
  UploadTokens(cfg, tokens, pos, N, s);
  s->x.resize(N * C);
  ops::MoeGather(w.embed(), s->tok.data(), N, C, s->x.data());  // the embedding: a gather of table rows
  for (int l = 0; l < static_cast<int>(w.layers().size()); ++l)
    LayerForward(w, w.layers()[l], l, N, s->pos.data(), attn, s);
  if (hidden) {  // what MTP module 1 reads: the last residual, or its final norm
    if (cfg.mtp_after_final_norm) {
      s->a.resize(N * C); s->rstd.resize(N);
      ops::RmsNorm(s->x.data(), w.norm(), static_cast<float>(cfg.norm_eps), N, C, s->a.data(), s->rstd.data());
      ops::CopyToHost(hidden, s->a.data(), N * C * sizeof(float));
    } else {
      ops::CopyToHost(hidden, s->x.data(), N * C * sizeof(float));
    }
  }
  // Only the requested rows' logits are needed.
  HeadRows(w, w.norm(), N, out_rows, n_out, s, logits);
}

void MtpForward(const InferenceWeights& w, int j, const float* h, const int32_t* tokens, const int32_t* pos,
                int64_t N, KvAttention* attn, const int64_t* out_rows, int64_t n_out, InferenceScratch* s,
                float* logits, float* out_hidden) {
  const ModelConfig& cfg = w.config();
  CHECK_MSG(j >= 0 && j < static_cast<int>(w.mtp().size()), "MTP module %d of %zu", j, w.mtp().size());
  const auto& M = w.mtp()[j];
  const int64_t C = cfg.d_model;
  const float eps = static_cast<float>(cfg.norm_eps);
  UploadTokens(cfg, tokens, pos, N, s);
  // cat = [RmsNorm(h, hnorm) | RmsNorm(embed(t), enorm)], then eh_proj.
  s->xe.resize(N * C); s->ye.resize(N * 2 * C); s->a.resize(N * C); s->rstd.resize(N);
  ops::CopyToDevice(s->xe.data(), h, N * C * sizeof(float));
  ops::RmsNorm(s->xe.data(), M.hnorm, eps, N, C, s->a.data(), s->rstd.data());
  ops::CopyRows(s->a.data(), C, s->ye.data(), 2 * C, N, C);
  ops::MoeGather(w.embed(), s->tok.data(), N, C, s->xe.data());
  ops::RmsNorm(s->xe.data(), M.enorm, eps, N, C, s->a.data(), s->rstd.data());
  ops::CopyRows(s->a.data(), C, s->ye.data() + C, 2 * C, N, C);
  s->x.resize(N * C);
  M.eh_proj.Apply(s->ye.data(), N, s->x.data());
  LayerForward(w, M.block, static_cast<int>(cfg.n_layers) + j, N, s->pos.data(), attn, s);
  if (out_hidden) ops::CopyToHost(out_hidden, s->x.data(), N * C * sizeof(float));
  HeadRows(w, M.norm, N, out_rows, n_out, s, logits);
}

ContiguousKv::ContiguousKv(const ModelConfig& cfg, int layer0, int n_layers, int64_t max_len)
    : cfg_(cfg), layer0_(layer0), max_len_(max_len) {
  const int64_t kvd = cfg.kv_cache_heads() * cfg.kv_cache_dim();
  k_.resize(n_layers);
  v_.resize(cfg.kv_cache_v_is_k() ? 0 : n_layers);
  ki_.resize(layer0 == 0 ? cfg.dsa_indexer_layers() : 0);
  for (auto& b : k_) b.zero(max_len * kvd);
  for (auto& b : v_) b.zero(max_len * kvd);
  for (auto& b : ki_) b.zero(max_len * cfg.dsa_index_dim);
}

void ContiguousKv::Attend(int layer, const float* q, const float* k, const float* v, float* att, const DsaRows* dsa) {
  const int64_t D = cfg_.kv_cache_dim(), H = cfg_.n_heads, Hkv = cfg_.kv_cache_heads(), kvd = Hkv * D;
  const int l = layer - layer0_;
  CHECK_MSG(l >= 0 && l < static_cast<int>(k_.size()), "ContiguousKv: layer %d outside [%d, %d)", layer, layer0_,
            layer0_ + static_cast<int>(k_.size()));
  CHECK(start >= first_row && start + n <= max_len_);
  ops::Copy(k, n * kvd, k_[l].data() + start * kvd);
  if (!cfg_.kv_cache_v_is_k()) ops::Copy(v, n * kvd, v_[l].data() + start * kvd);
  const float* v_cache = cfg_.kv_cache_v_is_k() ? k_[l].data() : v_[l].data();
  if (cfg_.dsa()) {
    CHECK_MSG(first_row == 0 && !ki_.empty(), "ContiguousKv: DSA layers need the model's own cache");
    const int64_t Di = cfg_.dsa_index_dim;
    Buf<float>& ki = ki_[l / cfg_.dsa_index_share];
    if (dsa) ops::Copy(dsa->ki, n * Di, ki.data() + start * Di);
    DsaAttend(cfg_, n, start + n, q, k_[l].data(), v_[l].data(), ki.data(), dsa ? dsa->qi : nullptr,
              dsa ? dsa->wi : nullptr, dsa != nullptr, &idx_, att);
    return;
  }
  // Keys [first_row, start + n): the new rows are the last n (causal).
  AttentionParams p;
  p.B = 1; p.Tq = static_cast<int>(n); p.Tk = static_cast<int>(start + n - first_row);
  p.H = static_cast<int>(H); p.Hkv = static_cast<int>(Hkv); p.D = static_cast<int>(D);
  p.scale = AttentionScale(cfg_);
  p.causal = true;
  p.q_batch_stride = n * H * D; p.kv_batch_stride = max_len_ * kvd; p.out_batch_stride = n * H * D;
  p.q = q; p.k = k_[l].data() + first_row * kvd; p.v = v_cache + first_row * kvd; p.out = att; p.lse = nullptr;
  ops::Attention(p);
}

InferenceSession::InferenceSession(const Model& model, int64_t max_len, WeightFormat fmt)
    : cfg_(model.config()), max_len_(std::min<int64_t>(max_len, model.config().max_seq_len)),
      weights_(model, fmt), cache_(std::make_unique<ContiguousKv>(cfg_, 0, static_cast<int>(cfg_.n_layers), max_len_)) {}

InferenceSession::~InferenceSession() = default;

const float* InferenceSession::Run(const int32_t* tokens, int64_t n, bool all_rows, float* hidden) {
  CHECK_MSG(n > 0 && len_ + n <= max_len_, "context of %lld tokens exceeds max_len %lld",
            static_cast<long long>(len_ + n), static_cast<long long>(max_len_));
  pos_.resize(n);
  for (int64_t i = 0; i < n; ++i) pos_[i] = static_cast<int32_t>(len_ + i);
  cache_->start = len_;
  cache_->n = n;
  std::vector<int64_t> rows;
  if (all_rows) {
    rows.resize(n);
    for (int64_t i = 0; i < n; ++i) rows[i] = i;
  } else {
    rows = {n - 1};
  }
  logits_.resize(rows.size() * cfg_.vocab_size);
  InferenceForward(weights_, tokens, pos_.data(), n, cache_.get(), rows.data(), static_cast<int64_t>(rows.size()),
                   &scratch_, logits_.data(), hidden);
  len_ += n;
  return logits_.data();
}

const float* InferenceSession::Forward(const int32_t* tokens, int64_t n, float* hidden) {
  return Run(tokens, n, false, hidden);
}

const float* InferenceSession::ForwardAll(const int32_t* tokens, int64_t n, float* hidden) {
  return Run(tokens, n, true, hidden);
}

void InferenceSession::Truncate(int64_t len) {
  CHECK_MSG(len >= 0 && len <= len_, "Truncate(%lld) outside [0, %lld]", static_cast<long long>(len),
            static_cast<long long>(len_));
  len_ = len;
}

}  // namespace myriad
