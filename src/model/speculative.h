// Speculative decoding: a cheap drafter proposes k tokens, one forward of
// the model over them (InferenceSession::ForwardAll) verifies them, and the
// accepted prefix plus one more token is emitted. Two drafters:
//  - NgramDrafter, with no model: prompt lookup (n-gram matches in the
//    sequence's own context), for code, RAG and edits;
//  - MtpDrafter, the model's own multi-token-prediction modules (depth D),
//    chained: module 1 drafts the next token from the last hidden state,
//    module j+1 the one after from module j's output; past D the last
//    module runs on its own output (docs/speculative.md).
//
// Exactness. A draft token d is drawn from the drafter's distribution q (a
// point mass for the n-gram drafter and for greedy MTP drafts). It is
// accepted with probability min(1, p(d) / q(d)), where p is the
// distribution the sampler would draw from at that position
// (SamplingDistribution: temperature, top-k, top-p); on rejection the token
// is drawn from the residual max(0, p - q) normalised. Then every emitted
// token has exactly the distribution p of plain decoding: P(x) =
// q(x) min(1, p(x)/q(x)) + (1 - sum_y min(p(y), q(y))) (p(x) - q(x))+ / Z =
// min(p, q)(x) + (p - q)+(x) = p(x), since Z = 1 - sum min(p, q). Greedy is
// p = delta(argmax): a draft token is kept iff it is the argmax, and the
// output is identical to plain greedy decoding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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

// The multi-token-prediction drafter of one sequence, for a model with MTP
// modules (mtp_depth >= 1). It keeps the main model's hidden rows it is
// shown (Observe), each module's keys and values (a ContiguousKv over cache
// layers n_layers + j; rows at their positions, as trained) and each
// module's output rows; rows computed from draft tokens stay only while
// those drafts are accepted (Verified). Used by SpeculativeDecoder and by
// the serving engine, one per speculating request. `w` must outlive it.
class MtpDrafter {
 public:
  MtpDrafter(const InferenceWeights& w, int64_t max_len);
  // The main model's hidden rows [n, C] of positions [pos0, pos0 + n)
  // (InferenceForward's `hidden`). The first call sets the first row the
  // modules see: after a prefix-cache hit the drafter starts there.
  void Observe(int64_t pos0, int64_t n, const float* hidden);
  // Up to k tokens to follow `context`, whose last token is pending (chosen,
  // not fed); every earlier position's hidden row must have been observed.
  // Drafts are drawn from each module's SamplingDistribution under `sp`
  // (the argmax when greedy); *q receives those distributions.
  std::vector<int32_t> Draft(const std::vector<int32_t>& context, int k, const SamplingParams& sp, Rng* rng,
                             std::vector<TokenDistribution>* q);
  // After the verification of the last Draft: `accepted` of its tokens were kept.
  void Verified(int accepted);
  // Whether Draft may run for a sequence of `len` fed positions (rows observed).
  bool Ready(int64_t len) const { return first_row_ >= 0 && len > first_row_; }

 private:
  const float* Module(int j, const float* h, const int32_t* tokens, int64_t start, int64_t n, float* out);
  const InferenceWeights& w_;
  int depth_;
  int64_t C_, V_, max_len_;
  ContiguousKv cache_;
  InferenceScratch scratch_;
  std::vector<float> hidden_, logits_;      // main hidden rows [max_len, C]; the last module row's logits
  int64_t first_row_ = -1;                  // the first observed position
  std::vector<int64_t> valid_, computed_;   // per module: exact rows end, rows written end
  std::vector<std::vector<float>> out_;     // per module: output rows [max_len, C]
  int64_t drafted_at_ = -1;                 // len at the last Draft
  std::vector<int32_t> pos_;
};

// One verification of `draft` after the chosen-but-not-fed token `pending`,
// with the session holding every earlier token. Feeds [pending, draft...],
// keeps the accepted prefix in the cache (the rest is truncated away) and
// returns the tokens it emits: the accepted drafts, then one more token (the
// bonus after a fully accepted draft, or the replacement of the first
// rejected one), which is the next call's `pending` and is not fed yet.
// `q` holds each draft token's draft distribution, or is null for point
// masses. `rule` replaces AcceptOrResample (tests check that a wrong rule is
// caught).
using AcceptRule = int32_t (*)(const TokenDistribution& p, const TokenDistribution* q, int32_t draft, Rng* rng,
                               bool* accepted);
// With `hidden` [draft.size() + 1, C] also the fed rows' hidden states.
std::vector<int32_t> VerifyDraft(InferenceSession* session, int32_t pending, const std::vector<int32_t>& draft,
                                 const std::vector<TokenDistribution>* q, int64_t vocab, const SamplingParams& sp,
                                 Rng* rng, SpeculativeStats* stats, AcceptRule rule = nullptr,
                                 float* hidden = nullptr);
// The accepted prefix plus one of rows [draft.size() + 1, V] of logits (the
// verification forward's): the part of VerifyDraft the engine shares.
std::vector<int32_t> AcceptDraft(const float* rows, const std::vector<int32_t>& draft,
                                 const std::vector<TokenDistribution>* q, int64_t vocab, const SamplingParams& sp,
                                 Rng* rng, SpeculativeStats* stats, AcceptRule rule = nullptr);

// The accept-or-resample rule above for one position: returns the token to
// emit and whether it is the draft token. q: the draft's distribution (null:
// a point mass on `draft`).
int32_t AcceptOrResample(const TokenDistribution& p, const TokenDistribution* q, int32_t draft, Rng* rng,
                         bool* accepted);

// Which drafter speculates: none, prompt lookup, MTP, or per step the
// n-gram draft when the context repeats (a match of max_ngram tokens with a
// full draft after it) and MTP otherwise (n-gram alone without MTP modules).
enum class DraftMode { kOff, kNgram, kMtp, kAuto };
// "off" | "ngram" | "mtp" | "auto"; false when unknown.
bool ParseDraftMode(const std::string& s, DraftMode* out);
const char* DraftModeName(DraftMode m);

// auto's choice for one step: the n-gram draft (already made, up to k
// tokens) when the context repeats at full length, else MTP.
bool AutoPrefersNgram(const NgramDrafter& ngram, const std::vector<int32_t>& context,
                      const std::vector<int32_t>& draft, int k);

// Speculative decoding of one sequence in an InferenceSession: the loop
// `myriad generate`, the tests and the benchmarks share.
class SpeculativeDecoder {
 public:
  // mtp/auto on a model without MTP modules fail (CHECK; callers check
  // HasMtp first). Feed the prompt with Prefill: MTP drafts read the
  // session's hidden states from the first position.
  SpeculativeDecoder(InferenceSession* session, DraftMode mode, int draft_tokens);
  // session->Forward of the prompt as a fresh sequence (session len 0),
  // keeping its hidden rows for MTP drafts; returns the last row's logits.
  const float* Prefill(const std::vector<int32_t>& prompt);
  static bool HasMtp(const ModelConfig& cfg) { return cfg.mtp_depth >= 1 && !cfg.dsa(); }
  // One verification: `context` is every token so far, the last one pending
  // (chosen, not fed; the prompt itself is fed with Prefill).
  // Drafts at most min(draft_tokens, max_new - 1) tokens (room permitting)
  // and returns the tokens to emit (at least one), the last of which is the
  // next call's pending token.
  std::vector<int32_t> Step(const std::vector<int32_t>& context, int max_new, const SamplingParams& sp, Rng* rng);
  const SpeculativeStats& stats() const { return stats_; }
  // Verifications that used each drafter (auto).
  int64_t ngram_steps() const { return ngram_steps_; }
  int64_t mtp_steps() const { return mtp_steps_; }
  // Tests: a different accept rule (VerifyDraft's `rule`).
  void set_rule(AcceptRule rule) { rule_ = rule; }

 private:
  InferenceSession* s_;
  DraftMode mode_;
  int k_;
  NgramDrafter ngram_;
  std::unique_ptr<MtpDrafter> mtp_;
  std::vector<float> hidden_;
  SpeculativeStats stats_;
  int64_t ngram_steps_ = 0, mtp_steps_ = 0;
  AcceptRule rule_ = nullptr;
};

}  // namespace myriad
