// Speculative decoding with a draft that needs no model: prompt lookup
// (n-gram matches in the sequence's own context), verified by one forward
// over the draft (InferenceSession::ForwardAll).
//
// Exactness. A draft token d comes from a deterministic drafter, a point
// mass q = delta(d). It is accepted with probability min(1, p(d) / q(d)) =
// p(d), where p is the distribution the sampler would draw from at that
// position (SamplingDistribution: temperature, top-k, top-p); on rejection
// the token is drawn from the residual max(0, p - q) normalised, which is p
// without d. So every emitted token has exactly the distribution p of plain
// decoding (P(d) = p(d); P(x != d) = (1 - p(d)) p(x) / (1 - p(d)) = p(x)).
// Greedy is the case p = delta(argmax): a draft token is kept iff it is the
// argmax, and the output is identical to plain greedy decoding.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "model/inference.h"
#include "model/sampler.h"

namespace myriad {

// Prompt lookup: up to k tokens that followed an earlier occurrence of the
// context's last n tokens, for n from max_ngram down to min_ngram (the
// longest n that matches wins); of its occurrences, the most recent one
// followed by k tokens, else the one followed by the most (a match near the
// end has few tokens after it); empty when nothing matches.
struct NgramDrafter {
  int max_ngram = 3;
  int min_ngram = 1;
  std::vector<int32_t> Draft(const std::vector<int32_t>& context, int k) const;
};

// Acceptance counts: proposed[i] / accepted[i] for draft position i.
struct SpeculativeStats {
  int64_t steps = 0;  // verification forwards
  std::vector<int64_t> proposed, accepted;
  int64_t emitted = 0;  // tokens produced by those steps (accepted drafts + one each)
  // Mean tokens per verification forward (1 = no gain).
  double MeanAcceptedLength() const { return steps ? static_cast<double>(emitted) / steps : 0.0; }
  double AcceptanceRate() const;
};

// One verification of `draft` after the chosen-but-not-fed token `pending`,
// with the session holding every earlier token. Feeds [pending, draft...],
// keeps the accepted prefix in the cache (the rest is truncated away) and
// returns the tokens it emits: the accepted drafts, then one more token (the
// bonus after a fully accepted draft, or the replacement of the first
// rejected one), which is the next call's `pending` and is not fed yet.
std::vector<int32_t> VerifyDraft(InferenceSession* session, int32_t pending, const std::vector<int32_t>& draft,
                                 int64_t vocab, const SamplingParams& sp, Rng* rng, SpeculativeStats* stats);

// The accept-or-resample rule above for one position: returns the token to
// emit and whether it is the draft token.
int32_t AcceptOrResample(const TokenDistribution& p, int32_t draft, Rng* rng, bool* accepted);

}  // namespace myriad
