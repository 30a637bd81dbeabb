#include "rl/remote_teacher.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve/http/client.h"

namespace myriad::rl {
namespace {

using nlohmann::json;

// The server's error message, when the body is an OpenAI error object.
std::string ErrorText(const serve::HttpReply& r) {
  const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message"))
    return j["error"]["message"].get<std::string>();
  return r.body.substr(0, 200);
}

}  // namespace

Result<RemoteTeacher> RemoteTeacher::Connect(const std::string& url, const Tokenizer& student, int64_t vocab_size,
                                             const RemoteTeacherOptions& options) {
  try {
    return ConnectImpl(url, student, vocab_size, options);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    return Status::Error("remote teacher " + url + ": unexpected /v1/models reply: " + e.what());
  }
}

Result<RemoteTeacher> RemoteTeacher::ConnectImpl(const std::string& url, const Tokenizer& student,
                                                 int64_t vocab_size, const RemoteTeacherOptions& options) {
  if (options.top_k < 1 || options.top_k > 5)
    return Status::Error("remote teacher " + url + ": top_k = " + std::to_string(options.top_k) +
                         " (the completions API gives 1..5 alternatives per token)");
  RemoteTeacher t;
  t.url_ = url;
  while (!t.url_.empty() && t.url_.back() == '/') t.url_.pop_back();
  t.opt_ = options;
  const std::string hint = " (hint: start the teacher with `myriad serve --ckpt TEACHER --port N` and name it as "
                           "http://HOST:N)";
  auto got = serve::HttpCall(t.url_ + "/v1/models", "GET", "", options.timeout_s, options.api_key);
  if (!got.ok()) return Status::Error("remote teacher: " + got.status().message() + hint);
  if (got->status != 200)
    return Status::Error("remote teacher " + t.url_ + "/v1/models: HTTP " + std::to_string(got->status) + ": " +
                         ErrorText(*got) + (got->status == 401 ? " (hint: distill.api_key_env)" : ""));
  const json j = json::parse(got->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].size() != 1 ||
      !j["data"][0].is_object() || !j["data"][0].contains("id"))
    return Status::Error("remote teacher " + t.url_ + "/v1/models: not one model's listing: " +
                         got->body.substr(0, 200));
  const json& m = j["data"][0];
  t.model_ = m["id"].get<std::string>();
  if (!m.contains("vocab_size") || !m.contains("vocab_fingerprint"))
    return Status::Error("remote teacher " + t.url_ + ": its /v1/models gives no vocab_size and "
                         "vocab_fingerprint (hint: the teacher must be a `myriad serve`, which reports them)");
  const int64_t vocab = m["vocab_size"].get<int64_t>();
  if (vocab != vocab_size)
    return Status::Error("remote teacher " + t.url_ + ": its model has vocab_size " + std::to_string(vocab) +
                         ", the student's " + std::to_string(vocab_size) +
                         " (hint: distillation compares next-token distributions id by id; teacher and student "
                         "must share one tokenizer and vocab_size)");
  const std::string theirs = m["vocab_fingerprint"].get<std::string>(), ours = student.VocabFingerprint();
  if (theirs != ours)
    return Status::Error("remote teacher " + t.url_ + ": its tokenizer maps ids to other bytes than the "
                         "student's (vocab_fingerprint " + theirs + " vs " + ours +
                         "; hint: teacher and student must share one tokenizer)");
  t.context_ = m.value("context_length", int64_t{0});
  t.vocab_ = vocab_size;
  return t;
}

Result<std::vector<TokenLogprobs>> RemoteTeacher::ScoreOne(const std::vector<int32_t>& seq) const {
  try {
    return ScoreOneImpl(seq);
  } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
    return Status::Error("remote teacher " + url_ + ": unexpected reply: " + e.what());
  }
}

Result<std::vector<TokenLogprobs>> RemoteTeacher::ScoreOneImpl(const std::vector<int32_t>& seq) const {
  const std::string what = "remote teacher " + url_;
  if (seq.size() < 2) return Status::Error(what + ": a sequence to score needs at least 2 tokens");
  const json body = {{"model", model_}, {"prompt", seq},       {"echo", true},
                     {"logprobs", opt_.top_k}, {"max_tokens", 0}, {"temperature", 0}};
  const std::string text = body.dump();
  serve::HttpReply r;
  for (int attempt = 0;; ++attempt) {
    ASSIGN_OR_RETURN(r, serve::HttpCall(url_ + "/v1/completions", "POST", text, opt_.timeout_s, opt_.api_key));
    const bool busy = r.status == 429 || r.status == 503;
    if (!busy || attempt == 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100 << attempt));
  }
  if (r.status != 200)
    return Status::Error(what + ": HTTP " + std::to_string(r.status) + " scoring " + std::to_string(seq.size()) +
                         " tokens: " + ErrorText(r));
  const json j = json::parse(r.body, nullptr, false);
  const json* lp = nullptr;
  if (j.is_object() && j.contains("choices") && j["choices"].is_array() && !j["choices"].empty() &&
      j["choices"][0].is_object() && j["choices"][0].contains("logprobs"))
    lp = &j["choices"][0]["logprobs"];
  if (!lp || !lp->is_object() || !lp->contains("token_ids") || !lp->contains("top_logprobs_ids"))
    return Status::Error(what + ": the reply has no logprobs.token_ids / top_logprobs_ids: " + r.body.substr(0, 200));
  const json& ids = (*lp)["token_ids"];
  const json& tops = (*lp)["top_logprobs_ids"];
  if (!ids.is_array() || !tops.is_array() || ids.size() != seq.size() || tops.size() != seq.size())
    return Status::Error(what + ": scored " + std::to_string(ids.size()) + " tokens of the " +
                         std::to_string(seq.size()) + " sent");
  static const json kNone = json::array();
  const json& tls = lp->contains("token_logprobs") ? lp->at("token_logprobs") : kNone;
  std::vector<TokenLogprobs> out(seq.size() - 1);
  for (size_t i = 1; i < seq.size(); ++i) {
    if (ids[i].get<int64_t>() != seq[i])
      return Status::Error(what + ": token " + std::to_string(i) + " came back as id " + ids[i].dump() + ", sent " +
                           std::to_string(seq[i]));
    const json& t = tops[i];
    if (!t.is_array() || static_cast<int>(t.size()) != opt_.top_k)
      return Status::Error(what + ": token " + std::to_string(i) + " has " + (t.is_array() ? std::to_string(t.size()) : "no") +
                           " alternatives, asked for " + std::to_string(opt_.top_k));
    TokenLogprobs& e = out[i - 1];
    e.token = seq[i];
    e.logprob = tls.is_array() && i < tls.size() && tls[i].is_number() ? tls[i].get<float>() : 0.f;
    for (const json& pair : t) {
      const int64_t id = pair.at(0).get<int64_t>();
      if (id < 0 || id >= vocab_)
        return Status::Error(what + ": token " + std::to_string(i) + "'s alternative " + std::to_string(id) +
                             " is outside the vocabulary of " + std::to_string(vocab_));
      e.top.emplace_back(static_cast<int32_t>(id), pair.at(1).get<float>());
    }
  }
  return out;
}

Result<std::vector<std::vector<TokenLogprobs>>> RemoteTeacher::Score(const std::vector<std::vector<int32_t>>& seqs) const {
  std::vector<std::vector<TokenLogprobs>> out(seqs.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first = Status::Ok();
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < seqs.size();) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first.ok()) return;
      }
      auto got = ScoreOne(seqs[i]);
      if (!got.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = got.status();
        return;
      }
      out[i] = std::move(got).value();
    }
  };
  const int n = std::max(1, std::min<int>(opt_.concurrency, static_cast<int>(seqs.size())));
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) threads.emplace_back(work);
  for (auto& th : threads) th.join();
  if (!first.ok()) return first;
  return out;
}

}  // namespace myriad::rl
