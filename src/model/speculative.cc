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

int32_t AcceptOrResample(const TokenDistribution& p, int32_t draft, Rng* rng, bool* accepted) {
  const double pd = p.ProbOf(draft);
  if (pd > 0 && rng->Uniform() < pd) {
    *accepted = true;
    return draft;
  }
  *accepted = false;
  // The residual: p without the draft token, renormalised.
  TokenDistribution r;
  for (size_t i = 0; i < p.ids.size(); ++i)
    if (p.ids[i] != draft) r.ids.push_back(p.ids[i]), r.prob.push_back(p.prob[i] / (1.0 - pd));
  CHECK_MSG(!r.ids.empty(), "AcceptOrResample: a rejected draft with nothing left to draw");
  return r.Draw(rng->Uniform());
}

std::vector<int32_t> VerifyDraft(InferenceSession* session, int32_t pending, const std::vector<int32_t>& draft,
                                 int64_t vocab, const SamplingParams& sp, Rng* rng, SpeculativeStats* stats) {
  std::vector<int32_t> fed = {pending};
  fed.insert(fed.end(), draft.begin(), draft.end());
  const int64_t base = session->len();
  const float* rows = session->ForwardAll(fed.data(), static_cast<int64_t>(fed.size()));
  std::vector<int32_t> out;
  size_t i = 0;
  for (; i < draft.size(); ++i) {
    const TokenDistribution p = SamplingDistribution(rows + static_cast<int64_t>(i) * vocab, vocab, sp);
    bool ok = false;
    const int32_t t = AcceptOrResample(p, draft[i], rng, &ok);
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
  // Keep pending and the accepted drafts; the last emitted token is pending.
  session->Truncate(base + 1 + static_cast<int64_t>(out.size()) - 1);
  if (stats) {
    stats->steps++;
    stats->emitted += static_cast<int64_t>(out.size());
  }
  return out;
}

}  // namespace myriad
