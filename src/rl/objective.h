// The post-training objectives on the model's head (HeadObjective in
// model/model.h): GRPO's clipped policy-gradient loss with an optional k3 KL
// to a reference policy, on-policy distillation (reverse KL, forward KL or
// JSD to a teacher's next-token distribution), a forward-only recorder of
// token logprobs, and a weighted sum of objectives. Per-token data are
// tables over the batch's sequences and positions: index seq * T + pos,
// where position t predicts token t+1. docs/rl.md has the equations;
// tests/golden/rl_reference.py is their PyTorch twin.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/model.h"

namespace myriad::rl {

// Group-normalised advantages: rewards [P * G] (G samples per prompt, prompt
// by prompt) -> (r - mean_group) / (std_group + eps), or r - mean_group when
// !scale_by_std (a group whose rewards are all equal gets 0 either way).
std::vector<float> GroupAdvantages(const std::vector<double>& rewards, int G, bool scale_by_std = true);

// How a batch's per-token loss terms are averaged.
enum class LossNorm {
  kToken,     // sum over every response token of the batch / their number
  kSequence,  // mean over sequences of each sequence's mean over its tokens
};
bool ParseLossNorm(const std::string& s, LossNorm* out);  // "token" | "sequence"

// Weights c[seq * T + pos] for sequences whose response tokens are
// [prompt_len, prompt_len + response_len) of their T+1 tokens: positions
// prompt_len-1 .. prompt_len+response_len-2 get weight, the prompt and the
// padding none.
std::vector<float> TokenWeights(const std::vector<int>& prompt_len, const std::vector<int>& response_len, int T,
                                LossNorm norm);

// What an objective saw over its Apply calls since the last Reset (weighted
// tokens only: rows with c > 0).
struct ObjectiveStats {
  int64_t tokens = 0;
  double loss = 0;       // sum of c * term
  double clipped = 0;    // tokens whose ratio was clipped (GRPO): the gradient is zero there
  double ratio_sum = 0, ratio_min = 0, ratio_max = 0;
  double kl_sum = 0;     // GRPO: k3 to the reference; distillation: the divergence
  double entropy_sum = 0;
  double clip_fraction() const { return tokens ? clipped / tokens : 0; }
  double mean_ratio() const { return tokens ? ratio_sum / tokens : 0; }
  double mean_kl() const { return tokens ? kl_sum / tokens : 0; }
  double mean_entropy() const { return tokens ? entropy_sum / tokens : 0; }
};

// Records log p(token t+1 | ..t) and the entropy at every row it sees; its
// loss is 0 (forward only).
class LogprobRecorder : public HeadObjective {
 public:
  LogprobRecorder(int64_t num_seqs, int T);
  double Apply(const Rows& rows, const float* logits, float* dlogits) override;
  const std::vector<float>& logp() const { return logp_; }
  const std::vector<float>& entropy() const { return entropy_; }

 private:
  int T_;
  std::vector<float> logp_, entropy_;
};

struct PolicyLossConfig {
  double clip_low = 0.2;   // ratio clipped to [1 - clip_low, 1 + clip_high]
  double clip_high = 0.28;
  double kl_beta = 0.0;    // weight of the k3 KL to the reference policy (0: none)
};

// GRPO: sum_t c_t * (-min(r_t A_s, clip(r_t) A_s) + beta * k3_t), with
// r_t = exp(logp_t - old_t) (old: the behaviour policy's logprob) and
// k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1.
class GrpoObjective : public HeadObjective {
 public:
  // Tables of num_seqs * T: coef, old_logp, ref_logp (empty when beta = 0);
  // advantages per sequence.
  GrpoObjective(PolicyLossConfig cfg, int T, std::vector<float> coef, std::vector<float> old_logp,
                std::vector<float> ref_logp, std::vector<float> advantages);
  double Apply(const Rows& rows, const float* logits, float* dlogits) override;
  const ObjectiveStats& stats() const { return stats_; }
  void Reset() { stats_ = ObjectiveStats{}; }

 private:
  PolicyLossConfig cfg_;
  int T_;
  std::vector<float> coef_, old_, ref_, adv_;
  ObjectiveStats stats_;
};

enum class DistillLoss { kReverseKl, kForwardKl, kJsd };
bool ParseDistillLoss(const std::string& s, DistillLoss* out);  // "reverse_kl" | "forward_kl" | "jsd"

// A teacher's view of one row: its full next-token logits (in-process
// teacher), or its top-k ids and logprobs (a remote teacher: the divergence
// is then over those k tokens, both distributions renormalised on them).
struct TeacherRows {
  int64_t vocab = 0;
  int top_k = 0;                  // 0: full logits
  std::vector<float> logits;      // [num_seqs * T, vocab] when top_k == 0
  std::vector<int32_t> ids;       // [num_seqs * T, top_k] otherwise
  std::vector<float> logprobs;    // [num_seqs * T, top_k]
};

// sum_t c_t * D(student_t, teacher_t).
class DistillObjective : public HeadObjective {
 public:
  DistillObjective(DistillLoss loss, int T, std::vector<float> coef, std::shared_ptr<const TeacherRows> teacher);
  double Apply(const Rows& rows, const float* logits, float* dlogits) override;
  const ObjectiveStats& stats() const { return stats_; }
  void Reset() { stats_ = ObjectiveStats{}; }

 private:
  DistillLoss loss_;
  int T_;
  std::vector<float> coef_;
  std::shared_ptr<const TeacherRows> teacher_;
  ObjectiveStats stats_;
};

// Supervised fine-tuning: sum_t c_t * -log p(token t+1) (the SFT baseline
// and off-policy distillation on teacher samples).
class NllObjective : public HeadObjective {
 public:
  NllObjective(int T, std::vector<float> coef);
  double Apply(const Rows& rows, const float* logits, float* dlogits) override;
  const ObjectiveStats& stats() const { return stats_; }
  void Reset() { stats_ = ObjectiveStats{}; }

 private:
  int T_;
  std::vector<float> coef_;
  ObjectiveStats stats_;
};

// Forward only: copies the logits of every row it sees into a teacher's
// full-distribution table (rows[cell] = logits), cells seq * T + pos.
class LogitsRecorder : public HeadObjective {
 public:
  LogitsRecorder(int T, TeacherRows* out) : T_(T), out_(out) {}
  double Apply(const Rows& rows, const float* logits, float* dlogits) override;

 private:
  int T_;
  TeacherRows* out_;
};

// sum_i w_i * objective_i (e.g. distillation mixed with a verifier reward's
// policy gradient). The parts are not owned.
class SumObjective : public HeadObjective {
 public:
  explicit SumObjective(std::vector<std::pair<HeadObjective*, double>> parts) : parts_(std::move(parts)) {}
  double Apply(const Rows& rows, const float* logits, float* dlogits) override;

 private:
  std::vector<std::pair<HeadObjective*, double>> parts_;
  std::vector<float> tmp_;
};

}  // namespace myriad::rl
