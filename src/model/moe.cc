// Mixture-of-experts feed-forward: route, permute tokens by expert, run each
// expert's SwiGLU as dense GEMMs over its rows, and combine (dropless).
// Shapes: N tokens (B sequences of T), C width, E routed experts, K per token,
// F expert width, M = N*K permuted rows.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <omp.h>

#include "model/block.h"
#include "ops/ops.h"

namespace myriad {
namespace {

// Whether to run experts in parallel (one per thread) rather than one after
// another with multi-threaded GEMMs. MYRIAD_MOE_GROUPED=0/1 overrides.
bool GroupExperts(int64_t E) {
  static const int mode = [] {
    const char* e = std::getenv("MYRIAD_MOE_GROUPED");
    return e ? std::atoi(e) : -1;
  }();
  if (mode >= 0) return mode == 1;
  return omp_get_max_threads() > 1 && E >= 2 * omp_get_max_threads();
}

}  // namespace

void SetRouting(const ModelConfig& cfg, MoeRouteParams* rp) {
  rp->sigmoid = cfg.sigmoid_scores();
  rp->normalize = cfg.norm_topk_prob;
  rp->scale = static_cast<float>(cfg.routed_scaling_factor);
  rp->n_group = cfg.n_group;
  rp->topk_group = cfg.topk_group;
}

void MoeForward(const BlockContext& ctx, const BlockWeights<float*>& w, const float* f, int B, int T,
                MoeActs* a, float* out) {
  const ModelConfig& cfg = *ctx.cfg;
  const float* bias = ctx.bias;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg.d_model, E = cfg.n_routed_experts;
  const int64_t K = cfg.top_k, F = ctx.dims->Fe, M = N * K;
  const bool remote = ctx.hooks && ctx.hooks->ExpertsRemote();
  Fit(&a->logits, N * E); Fit(&a->scores, N * E);
  Fit(&a->sel, N * K); Fit(&a->w, N * K); Fit(&a->pos, N * K); Fit(&a->perm, M);
  Fit(&a->expert_offset, E + 1);
  Fit(&a->x, M * C); Fit(&a->y, M * C);
  if (!remote) { Fit(&a->gu, M * 2 * F); Fit(&a->h, M * F); }

  // 1. Route (scores, top-K of score + bias, weights normalised over the K)
  // and 2. permute (rows grouped by expert, tokens ascending within one):
  // one op, the rule inference uses too. The row counts come back to the
  // host to size each expert's GEMMs.
  ops::Linear(f, w.router, N, C, E, a->logits.data());
  MoeRouteParams rp;
  rp.N = N, rp.E = E, rp.K = K;
  SetRouting(cfg, &rp);
  rp.logits = a->logits.data(), rp.bias = bias, rp.scores = a->scores.data();
  rp.sel = a->sel.data(), rp.weights = a->w.data(), rp.pos = a->pos.data(), rp.perm = a->perm.data();
  rp.expert_offset = a->expert_offset.data();
  ops::MoeRoute(rp);
  a->offset_host.resize(E + 1);
  ops::CopyToHost(a->offset_host.data(), a->expert_offset.data(), (E + 1) * sizeof(int64_t));
  const std::vector<int64_t>& off = a->offset_host;
  a->load.resize(E);
  for (int64_t e = 0; e < E; ++e) a->load[e] = off[e + 1] - off[e];
  ops::MoeGather(f, a->perm.data(), M, C, a->x.data());

  // 3. Experts: y_e = down(silu(gate x_e) * up x_e) on each expert's rows.
  // Experts run side by side, one per thread, each with single-threaded GEMMs
  // (a grouped GEMM): their matrices are too small to split well.
  // With expert parallelism the rows travel to the ranks that hold their
  // experts (all-to-all) and come back in place.
  if (remote) {
    ctx.hooks->ExpertsForward(ctx.moe_block, ExpertRows{a->x.data(), off.data(), M, C, E},
                              a->y.data());
  }
  const bool grouped = GroupExperts(E);
#pragma omp parallel for schedule(dynamic, 1) if (grouped && !remote)
  for (int64_t e = 0; e < (remote ? 0 : E); ++e) {
    const int64_t o = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    // gate_proj and up_proj are adjacent in the parameter buffer: one GEMM.
    ops::Linear(a->x.data() + o * C, w.e_gate[e], n, C, 2 * F, a->gu.data() + o * 2 * F);
    ops::SwiGlu(a->gu.data() + o * 2 * F, n, F, a->h.data() + o * F);
    ops::Linear(a->h.data() + o * F, w.e_down[e], n, F, C, a->y.data() + o * C);
  }

  // 4. Combine, then the shared experts on every token.
  ops::Zero(out, N * C);
  ops::MoeCombine(a->y.data(), a->pos.data(), a->w.data(), N, K, C, out);
  if (w.s_gate) {
    const int64_t SF = ctx.dims->SF;
    Fit(&a->sgu, N * 2 * SF); Fit(&a->sh, N * SF);
    ops::Linear(f, w.s_gate, N, C, 2 * SF, a->sgu.data());
    ops::SwiGlu(a->sgu.data(), N, SF, a->sh.data());
    ops::Linear(a->sh.data(), w.s_down, N, SF, C, out, /*accumulate=*/true);
  }

  // 5. Sequence-wise balance loss: alpha * mean_b sum_i f_i P_i. Under
  // context parallelism a rank holds T of the sequence's Tg = T * cp
  // positions: the per-sequence sums are added over the cp ranks first.
  a->aux_loss = 0;
  if (cfg.aux_loss_weight > 0) {
    const int cp = ctx.hooks ? ctx.hooks->SeqShards() : 1;
    const bool sharded = cp > 1 && ctx.block < cfg.n_layers;
    const int64_t Tg = static_cast<int64_t>(T) * (sharded ? cp : 1);
    // [0, B*E): assignments per (sequence, expert); [B*E, 2*B*E): sum of s'.
    // Small control data: the host reads it back (and sums it over cp).
    const size_t ns = 2 * static_cast<size_t>(B) * E;
    Fit(&a->stats, ns);
    ops::MoeBalanceStats(a->scores.data(), a->sel.data(), B, T, E, K, a->stats.data());
    std::vector<double> stats(ns);
    ops::CopyToHost(stats.data(), a->stats.data(), ns * sizeof(double));
    if (sharded) ctx.hooks->SumSeqStats(ctx.block, stats.data(), static_cast<int64_t>(stats.size()));
    a->f_frac.resize(static_cast<size_t>(B) * E);
    for (int b = 0; b < B; ++b) {
      float* fb = a->f_frac.data() + static_cast<int64_t>(b) * E;
      const double* cnt = stats.data() + static_cast<int64_t>(b) * E;
      const double* P = stats.data() + static_cast<int64_t>(B + b) * E;
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        fb[e] = static_cast<float>(cnt[e]) * (static_cast<float>(E) / static_cast<float>(K * Tg));
        sum += fb[e] * P[e] / Tg;
      }
      a->aux_loss += cfg.aux_loss_weight * sum / B;
    }
  }
}

void MoeBackward(const BlockContext& ctx, const BlockWeights<float*>& w,
                 const BlockWeights<float*>& gw, const float* f, int B, int T, MoeActs* a,
                 const float* d_out, float loss_scale, BlockScratch* s, float* df) {
  const ModelConfig& cfg = *ctx.cfg;
  const int64_t N = static_cast<int64_t>(B) * T, C = cfg.d_model, E = cfg.n_routed_experts;
  const int64_t K = cfg.top_k, F = ctx.dims->Fe, M = N * K;
  const bool remote = ctx.hooks && ctx.hooks->ExpertsRemote();
  Fit(&s->d_y, M * C); Fit(&s->d_w, N * K); Fit(&s->d_x, M * C);
  Fit(&s->d_logits, N * E);

  // Shared experts first: they write df.
  if (w.s_gate) {
    const int64_t SF = ctx.dims->SF;
    Fit(&s->d_h, N * SF); Fit(&s->d_gu, N * 2 * SF);
    ops::LinearBackward(d_out, a->sh.data(), w.s_down, N, SF, C, s->d_h.data(), false, gw.s_down);
    ops::SwiGluBackward(s->d_h.data(), a->sgu.data(), N, SF, s->d_gu.data());
    ops::LinearBackward(s->d_gu.data(), f, w.s_gate, N, C, 2 * SF, df, false, gw.s_gate);
  } else {
    ops::Zero(df, N * C);
  }

  // Combine backward: dy rows and d(weights).
  ops::MoeCombineBackward(d_out, a->y.data(), a->pos.data(), a->w.data(), N, K, C, s->d_y.data(),
                          s->d_w.data());
  // Experts (remote ones: dy travels to their ranks and dx comes back).
  if (remote) {
    ctx.hooks->ExpertsBackward(ctx.moe_block, s->d_y.data(), s->d_x.data());
  } else {
    Fit(&s->d_h, M * F); Fit(&s->d_gu, M * 2 * F);
  }
  const bool grouped = GroupExperts(E);
#pragma omp parallel for schedule(dynamic, 1) if (grouped && !remote)
  for (int64_t e = 0; e < (remote ? 0 : E); ++e) {
    const int64_t o = a->offset_host[e], n = a->offset_host[e + 1] - o;
    if (n == 0) continue;
    ops::LinearBackward(s->d_y.data() + o * C, a->h.data() + o * F, w.e_down[e], n, F, C,
                        s->d_h.data() + o * F, false, gw.e_down[e]);
    ops::SwiGluBackward(s->d_h.data() + o * F, a->gu.data() + o * 2 * F, n, F, s->d_gu.data() + o * 2 * F);
    ops::LinearBackward(s->d_gu.data() + o * 2 * F, a->x.data() + o * C, w.e_gate[e], n, C, 2 * F,
                        s->d_x.data() + o * C, false, gw.e_gate[e]);
  }
  // Un-permute: df[t] += sum_k dx[pos[t,k]].
  ops::MoeCombine(s->d_x.data(), a->pos.data(), nullptr, N, K, C, df);

  // Router: d(weights) -> d(scores) -> d(logits), plus the balance loss.
  const bool sigmoid = cfg.sigmoid_scores();
  // Under tensor parallelism every rank computes the balance loss from the
  // same gathered rows: each takes 1/tp of its gradient.
  const double alpha = cfg.aux_loss_weight * (ctx.hooks ? ctx.hooks->ReplicatedGradScale() : 1.f);
  const int cp = ctx.hooks ? ctx.hooks->SeqShards() : 1;
  const int64_t Tg = static_cast<int64_t>(T) * (cp > 1 && ctx.block < cfg.n_layers ? cp : 1);
  MoeRouteBackwardParams rb;
  rb.N = N, rb.E = E, rb.K = K, rb.T = T, rb.sigmoid = sigmoid;
  rb.normalize = cfg.norm_topk_prob, rb.scale = static_cast<float>(cfg.routed_scaling_factor);
  rb.scores = a->scores.data(), rb.sel = a->sel.data(), rb.weights = a->w.data();
  rb.d_weights = s->d_w.data(), rb.d_logits = s->d_logits.data();
  if (alpha > 0) {
    // L_bal = alpha/B * sum_i f_i * (1/Tg) sum_t s'_ti: coefficient
    // alpha/B * f_i / Tg per (sequence, expert), from the forward's f.
    std::vector<float> coef(a->f_frac.size());
    for (size_t i = 0; i < coef.size(); ++i)
      coef[i] = static_cast<float>(alpha / B * a->f_frac[i] / Tg * loss_scale);
    FromHost(&s->balance, coef);
    rb.balance = s->balance.data();
  }
  ops::MoeRouteBackward(rb);
  ops::LinearBackward(s->d_logits.data(), f, w.router, N, C, E, df, true, gw.router);
}

}  // namespace myriad
