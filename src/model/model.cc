#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/checksum.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace myriad {
namespace {

// The rows [r.begin, r.end) of B sequences of T rows each, as runs within
// one sequence: f(sequence b, first row i in it, offset in the range, count).
template <typename F>
void ForEachSeqRun(RowRange r, int64_t T, F&& f) {
  for (int64_t n = r.begin; n < r.end;) {
    const int64_t b = n / T, i = n % T, cnt = std::min(T - i, r.end - n);
    f(b, i, n - r.begin, cnt);
    n += cnt;
  }
}

}  // namespace

Model::Model(const ModelConfig& cfg, const ShardPlan& plan) : cfg_(cfg), layout_(cfg, plan) {
  params_.zero(layout_.total());
  grads_.zero(layout_.total());
  int nb = 0;
  for (int64_t l = 0; l < cfg.n_layers; ++l) bias_index_.push_back(cfg.is_moe_layer(l) ? nb++ : -1);
  for (int64_t j = 0; j < cfg.mtp_depth; ++j) bias_index_.push_back(cfg.mtp_block_is_moe() ? nb++ : -1);
  biases_.assign(nb, std::vector<float>(cfg.n_routed_experts, 0.f));
  bias_dev_.resize(nb);
  for (auto& b : bias_dev_) b.zero(cfg.n_routed_experts);
  load_.assign(nb, std::vector<int64_t>(cfg.n_routed_experts, 0));
  rope_.Build(cfg);
  if (cfg.dsa() && cfg.dsa_index_rope_dim > 0) index_rope_.Build(cfg.max_seq_len, cfg.dsa_index_rope_dim, cfg.rope_theta);
  l0_ = plan.layer_begin;
  l1_ = plan.layer_end < 0 ? static_cast<int>(cfg.n_layers) : plan.layer_end;
  set_slots(1);
}

void Model::InitWeights(uint64_t seed) {
  const float std = static_cast<float>(cfg_.init_std);
  // Drawn on the host (the RNG streams are host code), then copied over.
  std::vector<float> whole, host;
  for (const auto& p : layout_.params()) {
    host.resize(p.numel);
    float* w = host.data();
    auto upload = [&] { ParamsFromHost(w, p.offset, p.numel); };
    if (p.shape.size() == 1) {
      // Norm weights start at 1, projection biases at 0.
      const bool bias = p.name.size() > 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
      std::fill(w, w + p.numel, bias ? 0.f : 1.f);
      upload();
      continue;
    }
    Rng rng(seed ^ Checksum64(p.name));
    if (p.tp_dim < 0) {
      for (int64_t i = 0; i < p.numel; ++i) w[i] = std * rng.Normal();
      upload();
      continue;
    }
    // A tensor-parallel shard: draw the whole tensor, keep the slice.
    const int64_t R = p.global_shape[0], Cg = p.global_shape[1];
    whole.resize(R * Cg);
    for (auto& x : whole) x = std * rng.Normal();
    const int64_t r = p.shape[0], c = p.shape[1];
    const int64_t r0 = p.tp_dim == 0 ? p.tp_offset : 0, c0 = p.tp_dim == 1 ? p.tp_offset : 0;
    for (int64_t i = 0; i < r; ++i)
      std::memcpy(w + i * c, whole.data() + (r0 + i) * Cg + c0, c * sizeof(float));
    upload();
  }
  for (auto& b : biases_) std::fill(b.begin(), b.end(), 0.f);
}

void Model::ZeroGrads() { ops::Zero(grads_.data(), static_cast<int64_t>(grads_.size())); }

std::vector<float> Model::ParamsToHost() const { return ToHost(params_); }
void Model::ParamsToHost(std::vector<float>* out) const { ToHost(params_, out); }
std::vector<float> Model::GradsToHost() const { return ToHost(grads_); }
void Model::ParamsFromHost(const float* host, int64_t offset, int64_t n) {
  CHECK_MSG(offset >= 0 && n >= 0 && offset + n <= static_cast<int64_t>(params_.size()),
            "parameter range [%lld, %lld) outside the %zu parameters", static_cast<long long>(offset),
            static_cast<long long>(offset + n), params_.size());
  ops::CopyToDevice(params_.data() + offset, host, n * sizeof(float));
}

void Model::ClearExpertLoad() {
  for (auto& l : load_) std::fill(l.begin(), l.end(), 0);
}

void Model::ApplyBiasUpdate() {
  const float rate = static_cast<float>(cfg_.bias_update_rate);
  for (size_t i = 0; i < biases_.size(); ++i) {
    double mean = 0;
    for (auto c : load_[i]) mean += static_cast<double>(c);
    mean /= static_cast<double>(load_[i].size());
    for (size_t e = 0; e < load_[i].size(); ++e) {
      double diff = mean - static_cast<double>(load_[i][e]);
      float sign = diff > 0 ? 1.f : (diff < 0 ? -1.f : 0.f);
      biases_[i][e] += rate * sign;
    }
  }
  ClearExpertLoad();
}

BlockContext Model::Context(int block_index, const int32_t* pos) {
  BlockContext ctx;
  ctx.cfg = &cfg_;
  ctx.rope = &rope_;
  ctx.index_rope = &index_rope_;
  ctx.pos = pos;
  int bi = bias_index_[block_index];
  ctx.bias = bi >= 0 ? bias_dev_[bi].data() : nullptr;
  ctx.scratch = &scratch_;
  ctx.dims = &layout_.dims();
  ctx.hooks = hooks_;
  ctx.moe_block = bi;
  ctx.block = block_index;
  return ctx;
}

BlockContext Model::MainContext(int l, Slot& S) {
  BlockContext ctx = Context(l, S.pos.data());
  if (cfg_.dsa()) {
    ctx.dsa_group = &S.acts[l - l % cfg_.dsa_index_share];
    ctx.dsa_dense = dsa_dense_;
  }
  return ctx;
}

void Model::set_slots(int n) {
  slots_.resize(n);
  for (Slot& s : slots_) {
    s.resid.resize(cfg_.n_layers + 1);
    s.acts.resize(cfg_.n_layers);
    s.mtp.resize(cfg_.mtp_depth);
    s.mtp_pos.resize(cfg_.mtp_depth);
    s.mtp_etok.resize(cfg_.mtp_depth);
    s.mtp_tgt.resize(cfg_.mtp_depth);
  }
}

int64_t Model::BoundaryFloats(int B, int T) const {
  const int cp = hooks_ ? hooks_->SeqShards() : 1;
  const int64_t N = static_cast<int64_t>(B) * (T / cp);
  const int64_t rows = hooks_ && hooks_->SeqParallel() ? hooks_->OwnRows(N).size() : N;
  return rows * cfg_.d_model;
}

LossParts Model::Step(const int32_t* tokens, int B, int T, bool backward, float loss_scale) {
  LossParts out;
  StageForward(0, tokens, B, T, nullptr, backward, loss_scale, &out);
  if (backward) StageBackward(0, nullptr, loss_scale);
  // The indexers' KL (computed in backward; not part of total: its
  // gradient reaches the indexers only).
  if (backward) out.indexer = IndexerLoss(0);
  return out;
}

double Model::IndexerLoss(int slot) const {
  const int64_t n = cfg_.dsa_indexer_layers();
  if (n == 0) return 0;
  double sum = 0;
  for (int l = l0_; l < l1_; ++l)
    if (cfg_.dsa_indexer_layer(l)) sum += slots_[slot].acts[l].indexer_loss;
  return sum / static_cast<double>(n);
}

const float* Model::StageForward(int slot, const int32_t* tokens, int B, int T, const float* x_in, bool backward,
                                 float loss_scale, LossParts* loss) {
  CHECK_MSG(T <= cfg_.max_seq_len, "sequence length %d exceeds max_seq_len", T);
  Slot& S = slots_[slot];
  if (hooks_) hooks_->SetSlot(slot);
  const ShardPlan& plan = layout_.plan();
  // Context parallelism: this rank holds Tl = T/cp positions of each sequence.
  const int cp = hooks_ ? hooks_->SeqShards() : 1;
  CHECK_MSG(T % cp == 0, "sequence length %d does not split over %d context-parallel ranks", T, cp);
  const int Tl = T / cp;
  const int64_t N = static_cast<int64_t>(B) * Tl, C = cfg_.d_model, V = cfg_.vocab_size;
  const int L = static_cast<int>(cfg_.n_layers), Dm = static_cast<int>(cfg_.mtp_depth);
  S.B = B; S.T = T; S.tokens = tokens;
  ModelWeights<float*> W = layout_.Bind(params_.data());
  const float eps = static_cast<float>(cfg_.norm_eps);
  // Sequence parallelism (tensor parallel ranks): this rank holds rows
  // [own.begin, own.end) of each [rows, C] residual stream; without it, all.
  const bool sp = hooks_ && hooks_->SeqParallel();
  auto own_rows = [&](int64_t rows) { return sp ? hooks_->OwnRows(rows) : RowRange{0, rows}; };
  const RowRange own = own_rows(N);
  const int64_t Ns = own.size();

  // Inputs, targets, positions (of this rank's positions under cp).
  std::vector<int32_t> lpos(Tl);
  if (cp > 1) hooks_->LocalPositions(T, lpos.data());
  else for (int t = 0; t < T; ++t) lpos[t] = t;
  // Built on the host (tokens are host data), checked, then copied over.
  std::vector<int32_t> h_ids(3 * N);  // inputs | targets | positions
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < Tl; ++t) {
      const int p = lpos[t];
      const int64_t n = static_cast<int64_t>(b) * Tl + t;
      h_ids[n] = tokens[static_cast<int64_t>(b) * (T + 1) + p];
      h_ids[N + n] = tokens[static_cast<int64_t>(b) * (T + 1) + p + 1];
      h_ids[2 * N + n] = p;
    }
  for (int64_t n = 0; n < N; ++n)
    CHECK_MSG(h_ids[n] >= 0 && h_ids[n] < V, "token id %d out of range", h_ids[n]);
  Fit(&S.inputs, N); Fit(&S.targets, N); Fit(&S.pos, N);
  ops::CopyToDevice(S.inputs.data(), h_ids.data(), N * sizeof(int32_t));
  ops::CopyToDevice(S.targets.data(), h_ids.data() + N, N * sizeof(int32_t));
  ops::CopyToDevice(S.pos.data(), h_ids.data() + 2 * N, N * sizeof(int32_t));

  // The selection biases (host master copies) to the device.
  for (size_t i = 0; i < biases_.size(); ++i) FromHost(&bias_dev_[i], biases_[i]);

  // ---- Forward: embed -> blocks -> norm -> head -> loss.
  if (hooks_) hooks_->BeforeStep(backward);
  for (int l = l0_; l <= l1_; ++l) Fit(&S.resid[l], Ns * C);
  if (plan.first_stage) {
    ops::MoeGather(W.embed, S.inputs.data() + own.begin, Ns, C, S.resid[l0_].data());
  } else {
    ops::Copy(x_in, Ns * C, S.resid[l0_].data());
  }
  for (int l = l0_; l < l1_; ++l) {
    if (hooks_) hooks_->BeforeBlockForward(l);
    BlockForward(MainContext(l, S), W.layers[l], S.resid[l].data(), B, Tl, &S.acts[l], S.resid[l + 1].data());
    if (hooks_) hooks_->AfterBlockForward(l);
  }
  if (!plan.last_stage) {
    // This stage's share of the balance losses and loads.
    for (int l = l0_; l < l1_; ++l) {
      const int idx = bias_index_[l];
      if (idx < 0) continue;
      loss->aux += S.acts[l].moe.aux_loss;
      for (size_t e = 0; e < S.acts[l].moe.load.size(); ++e) load_[idx][e] += S.acts[l].moe.load[e];
    }
    loss->total = loss->aux;
    return S.resid[l1_].data();
  }
  Fit(&S.final_norm, Ns * C); Fit(&S.final_rstd, Ns); Fit(&S.logits, Ns * V); Fit(&S.losses, Ns);
  ops::RmsNorm(S.resid[L].data(), W.norm, eps, Ns, C, S.final_norm.data(), S.final_rstd.data());
  ops::Linear(S.final_norm.data(), W.head, Ns, C, V, S.logits.data());
  const int64_t Ntot = N * cp;  // tokens of the B whole sequences
  LossParts& out = *loss;
  S.mtp_run = objective_ ? 0 : Dm;
  if (objective_) {
    // The objective on the host copy of this rank's rows; its gradient back
    // into the logits buffer, as SoftmaxXent leaves it.
    std::vector<float> lg(static_cast<size_t>(Ns * V)), dl;
    ops::CopyToHost(lg.data(), S.logits.data(), Ns * V * sizeof(float));
    std::vector<int64_t> seq(Ns);
    std::vector<int32_t> pos(Ns), tgt(Ns);
    for (int64_t r = 0; r < Ns; ++r) {
      const int64_t n = own.begin + r;
      seq[r] = objective_seq_base_ + n / Tl;
      pos[r] = lpos[n % Tl];
      tgt[r] = h_ids[N + n];
    }
    if (backward) dl.assign(lg.size(), 0.f);
    HeadObjective::Rows rows{Ns, V, seq.data(), pos.data(), tgt.data()};
    const double sum = objective_->Apply(rows, lg.data(), backward ? dl.data() : nullptr);
    if (backward) ops::CopyToDevice(S.logits.data(), dl.data(), Ns * V * sizeof(float));
    out.main += sum / static_cast<double>(loss_scale);
  } else {
    ops::SoftmaxXent(S.logits.data(), S.targets.data() + own.begin, Ns, V, loss_scale / static_cast<float>(Ntot),
                     S.losses.data(), backward ? S.logits.data() : nullptr);
    out.main += ops::Sum(S.losses.data(), Ns);
    out.main /= static_cast<double>(Ntot);
  }

  // ---- MTP modules: module k predicts token i+k+1 from h^{k-1}_i and x[i+k].
  // Under context parallelism they run on whole sequences (gathered), the
  // same on every cp rank, each rank carrying 1/cp of their loss.
  const double mtp_w = Dm > 0 ? cfg_.mtp_loss_weight / Dm / cp : 0.0;
  for (int j = 0; j < S.mtp_run; ++j) {
    const int k = j + 1, Tk = T - k, Tprev = T - j;
    CHECK_MSG(Tk >= 1, "sequence length %d too short for mtp_depth %d", T, Dm);
    const int64_t Nk = static_cast<int64_t>(B) * Tk;
    const RowRange ok = own_rows(Nk);
    const int64_t Nko = ok.size();
    MtpActs& m = S.mtp[j];
    const auto& mw = W.mtp[j];
    // The previous level's output, all rows (gathered under sequence parallelism).
    // (Module 1 reads the final norm's output under mtp_after_final_norm.)
    const float* hprev = j > 0 ? S.mtp[j - 1].out.data()
                         : cfg_.mtp_after_final_norm ? S.final_norm.data() : S.resid[L].data();
    const int64_t prev_rows = j == 0 ? N : static_cast<int64_t>(B) * Tprev;  // this rank's rows of it
    if (sp) {
      Fit(&m.h_full, prev_rows * C);
      hooks_->GatherRows(hprev, m.h_full.data(), prev_rows, C);
      hprev = m.h_full.data();
    }
    if (j == 0 && cp > 1) {
      Fit(&m.h_seq, static_cast<int64_t>(B) * T * C);
      hooks_->GatherSeq(hprev, m.h_seq.data(), B, T, C);
      hprev = m.h_seq.data();
    }
    Fit(&m.h_in, Nko * C); Fit(&m.hn, Nko * C); Fit(&m.rstd_h, Nko); Fit(&m.e, Nko * C);
    Fit(&m.en, Nko * C); Fit(&m.rstd_e, Nko); Fit(&m.cat, Nko * 2 * C); Fit(&m.hp, Nko * C);
    Fit(&m.out, Nko * C); Fit(&m.nrm, Nko * C); Fit(&m.rstd_n, Nko); Fit(&m.logits, Nko * V);
    Fit(&m.losses, Nko);
    Buf<int32_t>& etok = S.mtp_etok[j];
    Buf<int32_t>& tgt = S.mtp_tgt[j];
    Fit(&etok, Nko);
    Fit(&tgt, Nko);
    Fit(&S.mtp_pos[j], Nk);
    std::vector<int32_t> h_ids(Nk + 2 * Nko);  // positions | embedded tokens | targets
    for (int64_t n = 0; n < Nk; ++n) h_ids[n] = static_cast<int32_t>(n % Tk);
    for (int64_t n = ok.begin; n < ok.end; ++n) {
      const int64_t b = n / Tk, i = n % Tk, r = n - ok.begin;
      h_ids[Nk + r] = tokens[b * (T + 1) + i + k];
      h_ids[Nk + Nko + r] = tokens[b * (T + 1) + i + k + 1];
    }
    ops::CopyToDevice(S.mtp_pos[j].data(), h_ids.data(), Nk * sizeof(int32_t));
    ops::CopyToDevice(etok.data(), h_ids.data() + Nk, Nko * sizeof(int32_t));
    ops::CopyToDevice(tgt.data(), h_ids.data() + Nk + Nko, Nko * sizeof(int32_t));
    // h_in: rows i < Tk of each sequence of the previous level (Tprev rows
    // each), this rank's range of them; one copy per sequence it touches.
    ForEachSeqRun(ok, Tk, [&](int64_t b, int64_t i, int64_t r, int64_t cnt) {
      ops::Copy(hprev + (b * Tprev + i) * C, cnt * C, m.h_in.data() + r * C);
    });
    ops::RmsNorm(m.h_in.data(), mw.hnorm, eps, Nko, C, m.hn.data(), m.rstd_h.data());
    ops::MoeGather(W.embed, etok.data(), Nko, C, m.e.data());
    ops::RmsNorm(m.e.data(), mw.enorm, eps, Nko, C, m.en.data(), m.rstd_e.data());
    ops::CopyRows(m.hn.data(), C, m.cat.data(), 2 * C, Nko, C);
    ops::CopyRows(m.en.data(), C, m.cat.data() + C, 2 * C, Nko, C);
    ops::Linear(m.cat.data(), mw.eh_proj, Nko, 2 * C, C, m.hp.data());
    if (hooks_) hooks_->BeforeBlockForward(L + j);
    BlockForward(Context(L + j, S.mtp_pos[j].data()), mw.block, m.hp.data(), B, Tk, &m.block, m.out.data());
    if (hooks_) hooks_->AfterBlockForward(L + j);
    ops::RmsNorm(m.out.data(), mw.norm, eps, Nko, C, m.nrm.data(), m.rstd_n.data());
    ops::Linear(m.nrm.data(), W.head, Nko, C, V, m.logits.data());
    ops::SoftmaxXent(m.logits.data(), tgt.data(), Nko, V,
                     static_cast<float>(loss_scale * mtp_w / static_cast<double>(Nk)),
                     m.losses.data(), backward ? m.logits.data() : nullptr);
    const double lk = ops::Sum(m.losses.data(), Nko);
    out.mtp += mtp_w * lk / static_cast<double>(Nk);
  }
  if (sp || cp > 1) {
    double v[2] = {out.main, out.mtp};
    hooks_->SumLosses(v, 2);
    out.main = v[0];
    out.mtp = v[1];
  }

  // ---- Balance losses and loads (this stage's blocks).
  for (int bi = 0; bi < static_cast<int>(bias_index_.size()); ++bi) {
    int idx = bias_index_[bi];
    if (idx < 0 || (bi < L && (bi < l0_ || bi >= l1_)) || bi >= L + S.mtp_run) continue;
    const MoeActs& ma = bi < L ? S.acts[bi].moe : S.mtp[bi - L].block.moe;
    out.aux += ma.aux_loss;
    for (size_t e = 0; e < ma.load.size(); ++e) load_[idx][e] += ma.load[e];
  }
  out.total = out.main + out.mtp + out.aux;
  return nullptr;
}

std::vector<float> Model::logits() const { return ToHost(slots_[0].logits); }

std::vector<float> Model::mtp_logits(int j) const { return ToHost(slots_[0].mtp.at(j).logits); }

const float* Model::StageBackward(int slot, const float* d_out_stage, float loss_scale) {
  Slot& S = slots_[slot];
  if (hooks_) hooks_->SetSlot(slot);
  const ShardPlan& plan = layout_.plan();
  const int B = S.B, T = S.T;
  const int cp = hooks_ ? hooks_->SeqShards() : 1;
  const int Tl = T / cp;
  const int64_t N = static_cast<int64_t>(B) * Tl, C = cfg_.d_model, V = cfg_.vocab_size;
  const int L = static_cast<int>(cfg_.n_layers);
  ModelWeights<float*> W = layout_.Bind(params_.data());
  ModelWeights<float*> G = layout_.Bind(grads_.data());
  const bool sp = hooks_ && hooks_->SeqParallel();
  auto own_rows = [&](int64_t rows) { return sp ? hooks_->OwnRows(rows) : RowRange{0, rows}; };
  const RowRange own = own_rows(N);
  const int64_t Ns = own.size();
  Fit(&d_resid_a_, Ns * C); Fit(&d_resid_b_, Ns * C);

  if (!plan.last_stage) {
    ops::Copy(d_out_stage, Ns * C, d_resid_a_.data());
  } else {
    // ---- d_chain_ holds d(previous level's output) over all of its rows
    // [B*Tprev, C]: each MTP module's d(h_in) scattered back to the rows it
    // was copied from (reduce-scattered to own rows under sequence parallelism).
    Buf<float>& d_chain = d_chain_;
    d_chain.clear();
    // d_own [own_rows(rows), C] = the chain's own rows (main: cp-local rows).
    auto take_chain = [&](int64_t rows, float* d_own, bool main) {
      const RowRange r = own_rows(rows);
      if (d_chain.empty()) {
        ops::Zero(d_own, r.size() * C);
        return;
      }
      const float* src = d_chain.data();
      if (main && cp > 1) {  // whole sequences -> summed over cp, this rank's positions
        Fit(&d_seq_, rows * C);
        hooks_->ReduceScatterSeq(d_chain.data(), d_seq_.data(), B, T, C);
        src = d_seq_.data();
      }
      if (sp) hooks_->ReduceScatterRows(src, d_own, rows, C);
      else ops::Copy(src, rows * C, d_own);
    };
    for (int j = S.mtp_run - 1; j >= 0; --j) {
      const int k = j + 1, Tk = T - k, Tprev = T - j;
      const int64_t Nk = static_cast<int64_t>(B) * Tk;
      const RowRange ok = own_rows(Nk);
      const int64_t Nko = ok.size();
      MtpActs& m = S.mtp[j];
      const auto& mw = W.mtp[j];
      const auto& mg = G.mtp[j];
      Fit(&d_tmp_, Nko * C);
      Fit(&m.d_out, Nko * C);
      take_chain(Nk, m.d_out.data(), false);
      auto& d_out = m.d_out;
      // Own loss: head and final norm.
      ops::LinearBackward(m.logits.data(), m.nrm.data(), W.head, Nko, C, V, d_tmp_.data(), false, G.head);
      ops::RmsNormBackward(d_tmp_.data(), m.out.data(), mw.norm, m.rstd_n.data(), Nko, C, d_out.data(), mg.norm);
      Fit(&m.d_hp, Nko * C);
      Fit(&m.d_cat, Nko * 2 * C);
      auto& d_hp = m.d_hp;
      auto& d_cat = m.d_cat;
      if (hooks_) hooks_->BeforeBlockBackward(L + j);
      // (Its balance loss, like its main loss, is 1/cp of the replicated module's.)
      BlockBackward(Context(L + j, S.mtp_pos[j].data()), mw.block, mg.block, &m.block, d_out.data(),
                    loss_scale / static_cast<float>(cp), &scratch_, d_hp.data());
      if (hooks_) hooks_->AfterBlockBackward(L + j);
      ops::LinearBackward(d_hp.data(), m.cat.data(), mw.eh_proj, Nko, 2 * C, C, d_cat.data(), false, mg.eh_proj);
      Fit(&m.d_hn, Nko * C);
      Fit(&m.d_en, Nko * C);
      Fit(&m.d_e, Nko * C);
      ops::Zero(m.d_e.data(), Nko * C);
      auto& d_hn = m.d_hn;
      auto& d_en = m.d_en;
      auto& d_e = m.d_e;
      ops::CopyRows(d_cat.data(), 2 * C, d_hn.data(), C, Nko, C);
      ops::CopyRows(d_cat.data() + C, 2 * C, d_en.data(), C, Nko, C);
      ops::RmsNormBackward(d_en.data(), m.e.data(), mw.enorm, m.rstd_e.data(), Nko, C, d_e.data(), mg.enorm);
      ops::EmbeddingBackward(d_e.data(), S.mtp_etok[j].data(), Nko, C, G.embed);
      // d(h_in) of the own rows, then back to the previous level's rows.
      Fit(&m.d_hin, Nko * C);
      ops::Zero(m.d_hin.data(), Nko * C);
      ops::RmsNormBackward(d_hn.data(), m.h_in.data(), mw.hnorm, m.rstd_h.data(), Nko, C, m.d_hin.data(), mg.hnorm);
      d_chain.zero(static_cast<size_t>(B) * Tprev * C);
      ForEachSeqRun(ok, Tk, [&](int64_t b, int64_t i, int64_t r, int64_t cnt) {
        ops::Copy(m.d_hin.data() + r * C, cnt * C, d_chain.data() + (b * Tprev + i) * C);
      });
    }

    // Main head and final norm.
    Fit(&d_tmp_, Ns * C);
    ops::LinearBackward(S.logits.data(), S.final_norm.data(), W.head, Ns, C, V, d_tmp_.data(), false, G.head);
    if (cfg_.mtp_after_final_norm) {  // the MTP chain's gradient is the final norm output's too
      take_chain(N, d_resid_b_.data(), true);
      ops::AddScaled(d_tmp_.data(), d_resid_b_.data(), 1.f, Ns * C, d_tmp_.data());
      ops::Zero(d_resid_a_.data(), Ns * C);
    } else {
      take_chain(N, d_resid_a_.data(), true);
    }
    ops::RmsNormBackward(d_tmp_.data(), S.resid[L].data(), W.norm, S.final_rstd.data(), Ns, C,
                         d_resid_a_.data(), G.norm);
  }
  // The blocks in reverse.
  float* d_cur = d_resid_a_.data();
  float* d_prev = d_resid_b_.data();
  for (int l = l1_ - 1; l >= l0_; --l) {
    if (hooks_) hooks_->BeforeBlockBackward(l);
    BlockBackward(MainContext(l, S), W.layers[l], G.layers[l], &S.acts[l], d_cur, loss_scale, &scratch_, d_prev);
    if (hooks_) hooks_->AfterBlockBackward(l);
    std::swap(d_cur, d_prev);
  }
  const float* d_in = d_cur;
  if (plan.first_stage) {
    ops::EmbeddingBackward(d_cur, S.inputs.data() + own.begin, Ns, C, G.embed);
    d_in = nullptr;
  }
  if (hooks_) hooks_->AfterBackward();
  return d_in;
}

}  // namespace myriad
