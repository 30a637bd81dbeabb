#include "model/speculative.h"

#include <algorithm>

#include "core/check.h"

namespace myriad {

std::vector<int32_t> NgramDrafter::Draft(const std::vector<int32_t>& ctx, int k) const {
  const int64_t L = static_cast<int64_t>(ctx.size());
  if (k <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_ngram, L - 1); n >= std::max(1, min_ngram); --n) {
    // Starts s < L - n with ctx[s, s+n) == the last n tokens, most recent
    // first: the first with k tokens after it wins, else the one with most.
    int64_t best_from = -1, best_len = 0;
    for (int64_t s = L - n - 1; s >= 0; --s) {
      if (!std::equal(ctx.begin() + s, ctx.begin() + s + n, ctx.end() - n)) continue;
      const int64_t from = s + n, len = std::min<int64_t>(L - from, k);
      if (len > best_len) best_from = from, best_len = len;
      if (len == k) break;
    }
    if (best_len > 0) return std::vector<int32_t>(ctx.begin() + best_from, ctx.begin() + best_from + best_len);
  }
  return {};
}

double SpeculativeStats::AcceptanceRate() const {
  int64_t p = 0, a = 0;
  for (size_t i = 0; i < proposed.size(); ++i) p += proposed[i], a += accepted[i];
  return p ? static_cast<double>(a) / p : 0.0;
}

int32_t AcceptOrResample(const TokenDistribution& p, const TokenDistribution* q, int32_t draft, Rng* rng,
                         bool* accepted) {
  const double pd = p.ProbOf(draft), qd = q ? q->ProbOf(draft) : 1.0;
  CHECK_MSG(qd > 0, "AcceptOrResample: draft token %d has no probability under its draft distribution", draft);
  if (pd > 0 && rng->Uniform() * qd < pd) {  // U < min(1, p/q)
    *accepted = true;
    return draft;
  }
  *accepted = false;
  // The residual max(0, p - q), renormalised (p without the draft for a point mass).
  TokenDistribution r;
  double z = 0;
  for (size_t i = 0; i < p.ids.size(); ++i) {
    const double d = p.prob[i] - (q ? q->ProbOf(p.ids[i]) : (p.ids[i] == draft ? 1.0 : 0.0));
    if (d > 0) r.ids.push_back(p.ids[i]), r.prob.push_back(d), z += d;
  }
  CHECK_MSG(!r.ids.empty() && z > 0, "AcceptOrResample: a rejected draft with nothing left to draw");
  for (double& x : r.prob) x /= z;
  return r.Draw(rng->Uniform());
}

std::vector<int32_t> AcceptDraft(const float* rows, const std::vector<int32_t>& draft,
                                 const std::vector<TokenDistribution>* q, int64_t vocab, const SamplingParams& sp,
                                 Rng* rng, SpeculativeStats* stats, AcceptRule rule) {
  CHECK(!q || q->size() == draft.size());
  if (!rule) rule = AcceptOrResample;
  std::vector<int32_t> out;
  size_t i = 0;
  for (; i < draft.size(); ++i) {
    const TokenDistribution p = SamplingDistribution(rows + static_cast<int64_t>(i) * vocab, vocab, sp);
    bool ok = false;
    const int32_t t = rule(p, q ? &(*q)[i] : nullptr, draft[i], rng, &ok);
    if (stats) {
      if (stats->proposed.size() <= i) stats->proposed.resize(i + 1), stats->accepted.resize(i + 1);
      stats->proposed[i]++;
      stats->accepted[i] += ok;
    }
    out.push_back(t);
    if (!ok) break;
  }
  if (i == draft.size()) {  // all accepted: the bonus token from the last row
    out.push_back(SampleToken(rows + static_cast<int64_t>(i) * vocab, vocab, sp, rng));
  }
  if (stats) {
    stats->steps++;
    stats->emitted += static_cast<int64_t>(out.size());
  }
  return out;
}

std::vector<int32_t> VerifyDraft(InferenceSession* session, int32_t pending, const std::vector<int32_t>& draft,
                                 const std::vector<TokenDistribution>* q, int64_t vocab, const SamplingParams& sp,
                                 Rng* rng, SpeculativeStats* stats, AcceptRule rule, float* hidden) {
  std::vector<int32_t> fed = {pending};
  fed.insert(fed.end(), draft.begin(), draft.end());
  const int64_t base = session->len();
  const float* rows = session->ForwardAll(fed.data(), static_cast<int64_t>(fed.size()), hidden);
  std::vector<int32_t> out = AcceptDraft(rows, draft, q, vocab, sp, rng, stats, rule);
  // Keep pending and the accepted drafts; the last emitted token is pending.
  session->Truncate(base + static_cast<int64_t>(out.size()));
  return out;
}

MtpDrafter::MtpDrafter(const InferenceWeights& w, int64_t max_len)
    : w_(w), depth_(static_cast<int>(w.config().mtp_depth)), C_(w.config().d_model), V_(w.config().vocab_size),
      max_len_(max_len), cache_(w.config(), static_cast<int>(w.config().n_layers), depth_, max_len) {
  CHECK_MSG(depth_ >= 1, "MTP drafts need a model with MTP modules (model.mtp_depth >= 1)");
  CHECK_MSG(!w.config().dsa(), "MTP drafts are not supported for DSA models");
  hidden_.resize(static_cast<size_t>(max_len * C_));
  valid_.assign(depth_, 0);
  computed_.assign(depth_, 0);
  out_.assign(depth_, std::vector<float>(static_cast<size_t>(max_len * C_)));
}

void MtpDrafter::Observe(int64_t pos0, int64_t n, const float* hidden) {
  CHECK_MSG(pos0 >= 0 && n >= 0 && pos0 + n <= max_len_, "MtpDrafter::Observe rows [%lld, %lld) outside max_len %lld",
            static_cast<long long>(pos0), static_cast<long long>(pos0 + n), static_cast<long long>(max_len_));
  if (first_row_ < 0) {
    first_row_ = pos0;
    cache_.first_row = pos0;
    valid_.assign(depth_, pos0);
    computed_.assign(depth_, pos0);
  }
  CHECK_MSG(pos0 >= first_row_, "MtpDrafter::Observe of row %lld before the first observed row %lld",
            static_cast<long long>(pos0), static_cast<long long>(first_row_));
  std::copy(hidden, hidden + n * C_, hidden_.begin() + pos0 * C_);
}

const float* MtpDrafter::Module(int j, const float* h, const int32_t* tokens, int64_t start, int64_t n, float* out) {
  pos_.resize(n);
  for (int64_t i = 0; i < n; ++i) pos_[i] = static_cast<int32_t>(start + i);
  cache_.start = start;
  cache_.n = n;
  const int64_t last = n - 1;
  logits_.resize(V_);
  MtpForward(w_, j, h, tokens, pos_.data(), n, &cache_, &last, 1, &scratch_, logits_.data(), out);
  return logits_.data();
}

std::vector<int32_t> MtpDrafter::Draft(const std::vector<int32_t>& context, int k, const SamplingParams& sp,
                                       Rng* rng, std::vector<TokenDistribution>* q) {
  const int64_t len = static_cast<int64_t>(context.size()) - 1;  // positions fed to the main model
  CHECK_MSG(first_row_ >= 0 && len > first_row_, "MtpDrafter::Draft before the main model's rows were observed");
  q->clear();
  drafted_at_ = len;
  std::vector<int32_t> ext = context, drafts;
  k = static_cast<int>(std::min<int64_t>(k, max_len_ - len - 1));
  auto draw = [&](const float* logits) {
    TokenDistribution d = SamplingDistribution(logits, V_, sp);
    const int32_t t = sp.temperature <= 0.f ? d.ids[0] : d.Draw(rng->Uniform());
    q->push_back(std::move(d));
    drafts.push_back(t);
    ext.push_back(t);
  };
  // Module j, rows [valid_j, len): row i reads the previous level's row i
  // and token i + j + 1 (drafts for the last j rows); its last row drafts
  // token len + j + 1.
  for (int j = 0; j < depth_ && static_cast<int>(drafts.size()) < k; ++j) {
    const int64_t r0 = valid_[j], n = len - r0;
    CHECK(n >= 1);
    const float* h = j == 0 ? hidden_.data() + r0 * C_ : out_[j - 1].data() + r0 * C_;
    draw(Module(j, h, ext.data() + r0 + j + 1, r0, n, out_[j].data() + r0 * C_));
    computed_[j] = len;
  }
  // Past the depth: the last module on its own previous output.
  for (int64_t r = len; static_cast<int>(drafts.size()) < k; ++r) {
    const int j = depth_ - 1;
    draw(Module(j, out_[j].data() + (r - 1) * C_, ext.data() + r + j + 1, r, 1, out_[j].data() + r * C_));
    computed_[j] = r + 1;
  }
  return drafts;
}

void MtpDrafter::Verified(int accepted) {
  CHECK_MSG(drafted_at_ >= 0, "MtpDrafter::Verified without a Draft");
  // Row i of module j read tokens up to i + j + 1: exact while those drafts
  // were accepted; rows past the depth (on approximate inputs) never are.
  for (int j = 0; j < depth_; ++j)
    valid_[j] = std::max<int64_t>(first_row_, std::min({computed_[j], drafted_at_, drafted_at_ + accepted - j}));
  drafted_at_ = -1;
}

bool ParseDraftMode(const std::string& s, DraftMode* out) {
  if (s == "off") return *out = DraftMode::kOff, true;
  if (s == "ngram") return *out = DraftMode::kNgram, true;
  if (s == "mtp") return *out = DraftMode::kMtp, true;
  if (s == "auto") return *out = DraftMode::kAuto, true;
  return false;
}

const char* DraftModeName(DraftMode m) {
  switch (m) {
    case DraftMode::kOff: return "off";
    case DraftMode::kNgram: return "ngram";
    case DraftMode::kMtp: return "mtp";
    case DraftMode::kAuto: return "auto";
  }
  return "?";
}

bool AutoPrefersNgram(const NgramDrafter& ngram, const std::vector<int32_t>& context,
                      const std::vector<int32_t>& draft, int k) {
  return static_cast<int>(draft.size()) == k && context.size() > static_cast<size_t>(ngram.max_ngram) &&
         !NgramDrafter{ngram.max_ngram, ngram.max_ngram}.Draft(context, 1).empty();
}

SpeculativeDecoder::SpeculativeDecoder(InferenceSession* session, DraftMode mode, int draft_tokens)
    : s_(session), mode_(mode), k_(std::max(0, draft_tokens)) {
  if (mode_ == DraftMode::kAuto && !HasMtp(session->config())) mode_ = DraftMode::kNgram;
  if (mode_ == DraftMode::kMtp || mode_ == DraftMode::kAuto)
    CHECK_MSG(HasMtp(session->config()), "--speculative mtp needs a model with MTP modules (model.mtp_depth >= 1)");
}

const float* SpeculativeDecoder::Prefill(const std::vector<int32_t>& prompt) {
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (mode_ != DraftMode::kMtp && mode_ != DraftMode::kAuto) return s_->Forward(prompt.data(), n);
  CHECK_MSG(s_->len() == 0, "SpeculativeDecoder::Prefill: the session holds %lld tokens already",
            static_cast<long long>(s_->len()));
  hidden_.resize(static_cast<size_t>(n * s_->config().d_model));
  const float* lg = s_->Forward(prompt.data(), n, hidden_.data());
  mtp_ = std::make_unique<MtpDrafter>(s_->weights(), s_->max_len());  // a fresh sequence
  mtp_->Observe(0, n, hidden_.data());
  return lg;
}

std::vector<int32_t> SpeculativeDecoder::Step(const std::vector<int32_t>& context, int max_new, const SamplingParams& sp,
                                              Rng* rng) {
  CHECK_MSG(mtp_ || (mode_ != DraftMode::kMtp && mode_ != DraftMode::kAuto),
            "SpeculativeDecoder::Step before Prefill: MTP drafts need the prompt's hidden rows");
  const int64_t V = s_->config().vocab_size;
  const int64_t room = s_->max_len() - s_->len() - 1;  // after the pending token
  const int k = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>({k_, room, max_new - 1})));
  std::vector<int32_t> draft;
  std::vector<TokenDistribution> q;
  bool use_mtp = false;
  if (k > 0 && mode_ != DraftMode::kOff) {
    if (mode_ != DraftMode::kMtp) draft = ngram_.Draft(context, k);
    if (mode_ == DraftMode::kMtp || (mode_ == DraftMode::kAuto && !AutoPrefersNgram(ngram_, context, draft, k))) {
      draft = mtp_->Draft(context, k, sp, rng, &q);
      use_mtp = true;
    }
  }
  (use_mtp ? mtp_steps_ : ngram_steps_) += draft.empty() ? 0 : 1;
  const int64_t base = s_->len();
  if (mtp_) hidden_.resize(static_cast<size_t>((draft.size() + 1) * s_->config().d_model));
  std::vector<int32_t> out = VerifyDraft(s_, context.back(), draft, use_mtp ? &q : nullptr, V, sp, rng, &stats_, rule_,
                                         mtp_ ? hidden_.data() : nullptr);
  if (mtp_) mtp_->Observe(base, static_cast<int64_t>(draft.size()) + 1, hidden_.data());
  // (After an n-gram step under auto the MTP caches catch up from the
  // observed hidden rows at their next draft.)
  if (use_mtp) mtp_->Verified(static_cast<int>(out.size()) - 1);
  return out;
}

}  // namespace myriad
