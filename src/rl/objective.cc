#include "rl/objective.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace myriad::rl {

namespace {

// ls[0, n) = log_softmax(z[0, n)) in double; returns the entropy.
double LogSoftmax(const float* z, int64_t n, std::vector<double>* ls) {
  ls->resize(n);
  double mx = z[0];
  for (int64_t v = 1; v < n; ++v) mx = std::max(mx, static_cast<double>(z[v]));
  double s = 0;
  for (int64_t v = 0; v < n; ++v) s += std::exp(static_cast<double>(z[v]) - mx);
  const double lse = mx + std::log(s);
  double h = 0;
  for (int64_t v = 0; v < n; ++v) {
    (*ls)[v] = z[v] - lse;
    h -= std::exp((*ls)[v]) * (*ls)[v];
  }
  return h;
}

// Row r's index in a table of `cells` entries (seq * T + pos), checked.
int64_t Cell(const HeadObjective::Rows& rows, int64_t r, int T, size_t cells) {
  const int64_t cell = rows.seq[r] * T + rows.pos[r];
  CHECK_MSG(cell >= 0 && cell < static_cast<int64_t>(cells), "row (sequence %lld, position %d) outside the table",
            static_cast<long long>(rows.seq[r]), rows.pos[r]);
  return cell;
}

}  // namespace

std::vector<float> GroupAdvantages(const std::vector<double>& rewards, int G, bool scale_by_std) {
  CHECK_MSG(G > 0 && rewards.size() % G == 0, "%zu rewards do not split into groups of %d", rewards.size(), G);
  std::vector<float> adv(rewards.size());
  for (size_t g0 = 0; g0 < rewards.size(); g0 += G) {
    double mean = 0;
    for (int i = 0; i < G; ++i) mean += rewards[g0 + i];
    mean /= G;
    double var = 0;
    for (int i = 0; i < G; ++i) var += (rewards[g0 + i] - mean) * (rewards[g0 + i] - mean);
    // The sample standard deviation (G - 1), as the GRPO paper's std.
    const double sd = G > 1 ? std::sqrt(var / (G - 1)) : 0.0;
    for (int i = 0; i < G; ++i) {
      const double d = rewards[g0 + i] - mean;
      adv[g0 + i] = static_cast<float>(scale_by_std ? d / (sd + 1e-4) : d);
    }
  }
  return adv;
}

bool ParseLossNorm(const std::string& s, LossNorm* out) {
  if (s == "token") *out = LossNorm::kToken;
  else if (s == "sequence") *out = LossNorm::kSequence;
  else return false;
  return true;
}

std::vector<float> TokenWeights(const std::vector<int>& prompt_len, const std::vector<int>& response_len, int T,
                                LossNorm norm) {
  CHECK_MSG(prompt_len.size() == response_len.size(), "prompt and response lengths differ in count");
  const size_t S = prompt_len.size();
  std::vector<float> c(S * T, 0.f);
  int64_t total = 0, seqs = 0;
  for (size_t s = 0; s < S; ++s) {
    total += response_len[s];
    seqs += response_len[s] > 0;
  }
  for (size_t s = 0; s < S; ++s) {
    const int p = prompt_len[s], n = response_len[s];
    CHECK_MSG(p >= 1 && n >= 0 && p + n <= T + 1, "sequence %zu: prompt %d + response %d tokens exceed %d", s, p,
              n, T + 1);
    if (n == 0) continue;
    const double w = norm == LossNorm::kToken ? 1.0 / total : 1.0 / (static_cast<double>(seqs) * n);
    for (int t = p - 1; t < p - 1 + n; ++t) c[s * T + t] = static_cast<float>(w);
  }
  return c;
}

LogprobRecorder::LogprobRecorder(int64_t num_seqs, int T)
    : T_(T), logp_(num_seqs * T, 0.f), entropy_(num_seqs * T, 0.f) {}

double LogprobRecorder::Apply(const Rows& rows, const float* logits, float* dlogits) {
  std::vector<double> ls;
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t cell = Cell(rows, r, T_, logp_.size());
    const double h = LogSoftmax(logits + r * rows.vocab, rows.vocab, &ls);
    logp_[cell] = static_cast<float>(ls[rows.target[r]]);
    entropy_[cell] = static_cast<float>(h);
  }
  return 0.0;
}

GrpoObjective::GrpoObjective(PolicyLossConfig cfg, int T, std::vector<float> coef, std::vector<float> old_logp,
                             std::vector<float> ref_logp, std::vector<float> advantages)
    : cfg_(cfg), T_(T), coef_(std::move(coef)), old_(std::move(old_logp)), ref_(std::move(ref_logp)),
      adv_(std::move(advantages)) {
  CHECK_MSG(old_.size() == coef_.size(), "GRPO: %zu behaviour logprobs for %zu tokens", old_.size(), coef_.size());
  CHECK_MSG(cfg_.kl_beta == 0 || ref_.size() == coef_.size(), "GRPO: a KL term needs the reference's logprobs");
  CHECK_MSG(adv_.size() * T_ == coef_.size(), "GRPO: %zu advantages for %zu sequences", adv_.size(),
            coef_.size() / T_);
}

double GrpoObjective::Apply(const Rows& rows, const float* logits, float* dlogits) {
  const int64_t V = rows.vocab;
  std::vector<double> ls;
  double sum = 0;
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t cell = Cell(rows, r, T_, coef_.size());
    const double c = coef_[cell];
    if (c == 0) continue;
    const double h = LogSoftmax(logits + r * V, V, &ls);
    const int32_t y = rows.target[r];
    // logp as fp32, as every logprob table holds it: the first inner step's
    // ratio against a recorded table is exactly 1.
    const double lp = static_cast<float>(ls[y]);
    const double ratio = std::exp(lp - old_[cell]);
    const double a = adv_[rows.seq[r]];
    const double lo = 1 - cfg_.clip_low, hi = 1 + cfg_.clip_high;
    const double clipped_ratio = std::min(std::max(ratio, lo), hi);
    const double unclipped = ratio * a, clipped = clipped_ratio * a;
    // -min(rA, clip(r)A): d/dlogp is -rA where the unclipped term is the
    // minimum (ties included: there clip(r) = r), 0 where the clipped one is.
    const bool use_unclipped = unclipped <= clipped;
    double term = -std::min(unclipped, clipped);
    double g = use_unclipped ? -ratio * a : 0.0;  // d term / d logp
    double k3 = 0;
    if (cfg_.kl_beta != 0) {
      const double d = ref_[cell] - lp;
      k3 = std::exp(d) - d - 1;
      term += cfg_.kl_beta * k3;
      g += cfg_.kl_beta * (1 - std::exp(d));
    }
    sum += c * term;
    stats_.tokens++;
    stats_.loss += c * term;
    stats_.clipped += use_unclipped ? 0 : 1;
    stats_.ratio_sum += ratio;
    stats_.ratio_min = stats_.tokens == 1 ? ratio : std::min(stats_.ratio_min, ratio);
    stats_.ratio_max = stats_.tokens == 1 ? ratio : std::max(stats_.ratio_max, ratio);
    stats_.kl_sum += k3;
    stats_.entropy_sum += h;
    if (dlogits) {
      // d logp_y / d z_v = [v == y] - p_v.
      float* d = dlogits + r * V;
      const double cg = c * g;
      for (int64_t v = 0; v < V; ++v) d[v] = static_cast<float>(-cg * std::exp(ls[v]));
      d[y] += static_cast<float>(cg);
    }
  }
  return sum;
}

bool ParseDistillLoss(const std::string& s, DistillLoss* out) {
  if (s == "reverse_kl") *out = DistillLoss::kReverseKl;
  else if (s == "forward_kl") *out = DistillLoss::kForwardKl;
  else if (s == "jsd") *out = DistillLoss::kJsd;
  else return false;
  return true;
}

DistillObjective::DistillObjective(DistillLoss loss, int T, std::vector<float> coef,
                                   std::shared_ptr<const TeacherRows> teacher)
    : loss_(loss), T_(T), coef_(std::move(coef)), teacher_(std::move(teacher)) {
  CHECK_MSG(teacher_ != nullptr, "distillation without a teacher");
  const size_t cells = coef_.size();
  if (teacher_->top_k == 0)
    CHECK_MSG(teacher_->logits.size() == cells * teacher_->vocab, "teacher logits do not cover the batch");
  else
    CHECK_MSG(teacher_->ids.size() == cells * teacher_->top_k && teacher_->logprobs.size() == cells * teacher_->top_k,
              "teacher top-k rows do not cover the batch");
}

double DistillObjective::Apply(const Rows& rows, const float* logits, float* dlogits) {
  const int64_t V = rows.vocab;
  CHECK_MSG(teacher_->vocab == V, "teacher vocabulary %lld != student's %lld",
            static_cast<long long>(teacher_->vocab), static_cast<long long>(V));
  const int K = teacher_->top_k;
  std::vector<double> ls, lt;
  std::vector<float> zs, zt;
  double sum = 0;
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t cell = Cell(rows, r, T_, coef_.size());
    const double c = coef_[cell];
    if (c == 0) continue;
    const float* z = logits + r * V;
    const double h = LogSoftmax(z, V, &ls);
    // The support: every token (full teacher) or the teacher's top k, both
    // distributions renormalised there.
    int64_t n = V;
    if (K == 0) {
      LogSoftmax(teacher_->logits.data() + cell * V, V, &lt);
    } else {
      n = K;
      zs.resize(K);
      zt.resize(K);
      for (int i = 0; i < K; ++i) {
        const int32_t id = teacher_->ids[cell * K + i];
        CHECK_MSG(id >= 0 && id < V, "teacher token id %d outside the vocabulary", id);
        zs[i] = z[id];
        zt[i] = teacher_->logprobs[cell * K + i];
      }
      LogSoftmax(zs.data(), K, &ls);
      LogSoftmax(zt.data(), K, &lt);
    }
    // term and g_u = d term / d z_u over the support.
    double term = 0;
    std::vector<double> g(n);
    if (loss_ == DistillLoss::kReverseKl) {
      for (int64_t u = 0; u < n; ++u) term += std::exp(ls[u]) * (ls[u] - lt[u]);
      for (int64_t u = 0; u < n; ++u) g[u] = std::exp(ls[u]) * ((ls[u] - lt[u]) - term);
    } else if (loss_ == DistillLoss::kForwardKl) {
      for (int64_t u = 0; u < n; ++u) term += std::exp(lt[u]) * (lt[u] - ls[u]);
      for (int64_t u = 0; u < n; ++u) g[u] = std::exp(ls[u]) - std::exp(lt[u]);
    } else {
      // JSD: d/dp_v = log(p_v / m_v) / 2, through the softmax.
      double mean_g = 0;
      for (int64_t u = 0; u < n; ++u) {
        const double p = std::exp(ls[u]), q = std::exp(lt[u]);
        const double lm = std::log(0.5 * (p + q));
        term += 0.5 * p * (ls[u] - lm) + 0.5 * q * (lt[u] - lm);
        g[u] = 0.5 * (ls[u] - lm);
        mean_g += p * g[u];
      }
      for (int64_t u = 0; u < n; ++u) g[u] = std::exp(ls[u]) * (g[u] - mean_g);
    }
    sum += c * term;
    stats_.tokens++;
    stats_.loss += c * term;
    stats_.kl_sum += term;
    stats_.entropy_sum += h;
    if (dlogits) {
      float* d = dlogits + r * V;
      for (int64_t u = 0; u < n; ++u) d[K == 0 ? u : teacher_->ids[cell * K + u]] += static_cast<float>(c * g[u]);
    }
  }
  return sum;
}

NllObjective::NllObjective(int T, std::vector<float> coef) : T_(T), coef_(std::move(coef)) {}

double NllObjective::Apply(const Rows& rows, const float* logits, float* dlogits) {
  const int64_t V = rows.vocab;
  std::vector<double> ls;
  double sum = 0;
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t cell = Cell(rows, r, T_, coef_.size());
    const double c = coef_[cell];
    if (c == 0) continue;
    const double h = LogSoftmax(logits + r * V, V, &ls);
    const int32_t y = rows.target[r];
    sum += c * -ls[y];
    ++stats_.tokens;
    stats_.loss += c * -ls[y];
    stats_.entropy_sum += h;
    if (dlogits) {
      // d(-log p_y)/dz_v = p_v - [v == y]
      float* d = dlogits + r * V;
      for (int64_t v = 0; v < V; ++v) d[v] += static_cast<float>(c * std::exp(ls[v]));
      d[y] -= static_cast<float>(c);
    }
  }
  return sum;
}

double LogitsRecorder::Apply(const Rows& rows, const float* logits, float*) {
  CHECK_MSG(out_->top_k == 0 && out_->vocab == rows.vocab, "LogitsRecorder: a table of vocab %lld for logits of %lld",
            static_cast<long long>(out_->vocab), static_cast<long long>(rows.vocab));
  const size_t cells = out_->logits.size() / static_cast<size_t>(rows.vocab);
  for (int64_t r = 0; r < rows.n; ++r) {
    const int64_t cell = Cell(rows, r, T_, cells);
    std::copy(logits + r * rows.vocab, logits + (r + 1) * rows.vocab, out_->logits.begin() + cell * rows.vocab);
  }
  return 0.0;
}

double SumObjective::Apply(const Rows& rows, const float* logits, float* dlogits) {
  const size_t cells = static_cast<size_t>(rows.n * rows.vocab);
  double sum = 0;
  for (auto& [obj, w] : parts_) {
    if (dlogits) tmp_.assign(cells, 0.f);
    sum += w * obj->Apply(rows, logits, dlogits ? tmp_.data() : nullptr);
    if (dlogits)
      for (size_t i = 0; i < cells; ++i) dlogits[i] += static_cast<float>(w * tmp_[i]);
  }
  return sum;
}

}  // namespace myriad::rl
