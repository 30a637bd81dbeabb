// A distillation teacher behind a `myriad serve` endpoint: the student's
// sequences are sent as token-id prompts to /v1/completions with echo and
// logprobs (max_tokens 0), and the server scores every token given the ones
// before it, returning the top-k ids and log-probabilities at each position
// (docs/rl.md, "Remote teachers"). The divergence is then taken over those
// k tokens (TeacherRows with top_k > 0).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"
#include "model/sampler.h"

namespace myriad::rl {

struct RemoteTeacherOptions {
  int top_k = 5;            // alternatives per position (the completions API allows 1..5)
  double timeout_s = 120;   // one request, end to end
  int concurrency = 8;      // requests in flight at once
  std::string api_key;      // the server's --api-key, if it has one
};

class RemoteTeacher {
 public:
  // GET /v1/models: the one model id, its vocabulary (the model's size,
  // checked against the student model's `vocab_size`, and the tokenizer's
  // fingerprint against `student`'s: ids must mean the same bytes) and its
  // context length. Errors name the URL and say what to fix.
  static Result<RemoteTeacher> Connect(const std::string& url, const Tokenizer& student, int64_t vocab_size,
                                       const RemoteTeacherOptions& options);

  // For each sequence of n >= 2 tokens, n-1 entries: entry j is the
  // teacher's distribution after tokens [0, j] (predicting token j+1), its
  // `top` the top_k (id, logprob) pairs, most likely first. A request the
  // server refuses as busy (429, 503) is retried with back-off.
  Result<std::vector<std::vector<TokenLogprobs>>> Score(const std::vector<std::vector<int32_t>>& seqs) const;

  const std::string& url() const { return url_; }
  const std::string& model() const { return model_; }
  int64_t context_length() const { return context_; }
  int top_k() const { return opt_.top_k; }

 private:
  static Result<RemoteTeacher> ConnectImpl(const std::string& url, const Tokenizer& student, int64_t vocab_size,
                                           const RemoteTeacherOptions& options);
  Result<std::vector<TokenLogprobs>> ScoreOne(const std::vector<int32_t>& seq) const;
  Result<std::vector<TokenLogprobs>> ScoreOneImpl(const std::vector<int32_t>& seq) const;
  std::string url_, model_;
  int64_t context_ = 0, vocab_ = 0;  // vocab_: the models' vocab_size (ids below it)
  RemoteTeacherOptions opt_;
};

}  // namespace myriad::rl
