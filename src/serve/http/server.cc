#include "serve/http/server.h"

#include "serve/http/server_internal.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "serve/http/openai.h"
#include "serve/http/server_metrics.h"
#include "serve/kvcache/tier.h"

namespace myriad::serve {


namespace {

// The hand-over between the engine thread (Push) and a connection thread.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> events;
  RequestCost cost;  // set with the final event
};

// Code points in the first `bytes` bytes of UTF-8 text (continuation bytes not counted).
int64_t CodePoints(const std::string& s, size_t bytes) {
  int64_t n = 0;
  for (size_t i = 0; i < bytes && i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
  return n;
}

// One completion request from submission to its last byte.
class Generation {
 public:
  Generation(Engine* engine, const Tokenizer* tok, std::vector<std::string> stops)
      : engine_(engine), tok_(tok), decoder_(tok), filter_(std::move(stops)) {}

  std::shared_ptr<Pending> pending = std::make_shared<Pending>();
  uint64_t id = 0;

  struct Step {
    std::string text;
    bool finished = false;
    std::vector<TokenLogprob> logprobs;  // of the tokens whose text is now shown (when asked)
  };
  // Steps carry the log-probabilities of the tokens they show.
  void want_logprobs() { want_lp_ = true; }
  // Waits up to `timeout` for events and turns them into text.
  Step Next(std::chrono::milliseconds timeout) {
    std::deque<TokenEvent> batch;
    {
      std::unique_lock<std::mutex> lock(pending->mu);
      pending->cv.wait_for(lock, timeout, [&] { return !pending->events.empty(); });
      batch.swap(pending->events);
    }
    Step s;
    for (const TokenEvent& e : batch) {
      if (finished_) break;
      if (!e.done) {
        if (TextConventions::IsControl(*tok_, e.token)) continue;
        const int64_t start = decoded_;
        const std::string piece = decoder_.Push(e.token);
        decoded_ += static_cast<int64_t>(piece.size());
        if (e.logprobs) held_lp_.push_back({ToText(*e.logprobs), start, decoded_});
        s.text += Show(filter_.Push(piece));
        ReleaseLogprobs(&s);
        if (filter_.stopped() && !cancel_sent_) {
          cancel_sent_ = true;
          stopped_by_text_ = true;
          engine_->Cancel(id);
        }
        continue;
      }
      s.text += Show(filter_.Push(decoder_.Finish()));
      s.text += Show(filter_.Flush());
      ReleaseLogprobs(&s, /*at_end=*/true);
      finished_ = true;
      finish_reason_ = stopped_by_text_ ? "stop" : e.finish_reason;
      error_ = e.error;
      usage_ = {e.prompt_tokens, e.completion_tokens, e.cached_tokens, e.draft_steps, e.draft_proposed, e.draft_accepted};
      for (const TokenLogprobs& l : e.prompt_logprobs) prompt_lp_.push_back(ToText(l));
      std::lock_guard<std::mutex> lock(pending->mu);
      cost_ = pending->cost;
    }
    if (filter_.stopped()) ReleaseLogprobs(&s, /*at_end=*/true);
    s.finished = finished_;
    return s;
  }
  // The client went away: stop the engine's work on this request.
  void CancelIfRunning() {
    if (!finished_ && !cancel_sent_) {
      cancel_sent_ = true;
      engine_->Cancel(id);
    }
  }

  bool finished() const { return finished_; }
  bool stopped_by_text() const { return stopped_by_text_; }
  const std::string& finish_reason() const { return finish_reason_; }
  const std::string& error() const { return error_; }
  const Usage& usage() const { return usage_; }
  const RequestCost& cost() const { return cost_; }
  // An echoed prompt's scored tokens (GenerationParams::prompt_logprobs),
  // from its second token, after the final event.
  const std::vector<TokenLogprob>& prompt_logprobs() const { return prompt_lp_; }

 private:
  // Log-probabilities follow the text: a token's entry goes out once its
  // text is shown (held back by a possible stop string: it waits); after a
  // stop string, the tokens whose text starts before it are kept.
  struct HeldLogprob {
    TokenLogprob lp;
    int64_t start, end;  // its bytes in the decoded text
  };
  TokenLogprob ToText(const TokenLogprobs& l) const {
    TokenLogprob t;
    t.token = tok_->DecodePiece(l.token);
    t.id = l.token;
    t.logprob = l.logprob;
    for (const auto& [id, lp] : l.top) {
      t.top.emplace_back(tok_->DecodePiece(id), lp);
      t.top_ids.emplace_back(id, lp);
    }
    return t;
  }
  const std::string& Show(const std::string& text) {
    if (want_lp_) shown_ += text;
    return text;
  }
  void ReleaseLogprobs(Step* s, bool at_end = false) {
    const int64_t shown = static_cast<int64_t>(shown_.size());
    while (!held_lp_.empty()) {
      HeldLogprob& h = held_lp_.front();
      const bool visible = at_end ? (!filter_.stopped() || h.start < shown) : h.end <= shown && !filter_.stopped();
      if (!visible) break;
      h.lp.text_offset = CodePoints(shown_, static_cast<size_t>(h.start));
      s->logprobs.push_back(std::move(h.lp));
      held_lp_.pop_front();
    }
    if (at_end) held_lp_.clear();
  }

  Engine* engine_;
  const Tokenizer* tok_;
  TokenStreamDecoder decoder_;
  bool want_lp_ = false;
  int64_t decoded_ = 0;  // bytes out of the decoder
  std::string shown_;    // the text shown so far (with logprobs only)
  std::deque<HeldLogprob> held_lp_;
  StopTextFilter filter_;
  bool finished_ = false, cancel_sent_ = false, stopped_by_text_ = false;
  std::string finish_reason_, error_;
  Usage usage_;
  RequestCost cost_;
  std::vector<TokenLogprob> prompt_lp_;
};

// Compares without an early exit, so the time taken does not reveal how
// much of a guessed key was right.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}


// A request the engine cancelled before it finished that no stop string
// ended: the drain timeout of a shutdown (or the engine stopping). Not a
// response: OpenAI has no "cancelled" finish_reason.
ApiError CancelledError(double drain_timeout_s) {
  ApiError e = ErrorForStatus(503);
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "the request was cancelled before it finished: the server is shutting down and its drain timeout "
                "(%gs) ran out (hint: retry; the output so far is not returned)", drain_timeout_s);
  e.message = buf;
  e.code = "cancelled";
  return e;
}

}  // namespace



void HttpServer::Impl::Dispatch(const std::shared_ptr<Connection>& s, HttpRequest req) {
  const bool keep_alive = req.msg.keep_alive();
  HttpResponse res;
  auto not_allowed = [&](const char* allow) {
    res.set_header("Allow", allow);
    ApiError e = ErrorForStatus(405);
    e.message += std::string(" (hint: this route takes ") + allow + ")";
    SendError(res, e);
  };
  const http::verb method = req.msg.method();
  const std::string& path = req.path;
  // Authentication before routing; /health stays open for load balancers.
  if (!cfg.api_key.empty() && path != "/health") {
    const std::string auth = req.get_header_value(http::field::authorization);
    if (!ConstantTimeEquals(auth, "Bearer " + cfg.api_key)) {
      ApiError e = ErrorForStatus(401);
      if (auth.empty()) e.message = "no API key given (hint: send the header 'Authorization: Bearer <key>')";
      SendError(res, e);
      return s->Respond(res, keep_alive && !draining);
    }
  }
  const bool completion = path == "/v1/chat/completions" || path == "/v1/completions";
  if (completion && method == http::verb::post) {
    const Endpoint ep = path == "/v1/chat/completions" ? Endpoint::kChat : Endpoint::kCompletion;
    req.peer_gone = [s] { return s->PeerGone(); };
    net::post(*workers, [this, s, req = std::move(req), ep, keep_alive]() mutable {
      HttpResponse res;
      try {
        HandleCompletion(req, res, ep);
      } catch (const std::exception& ex) {
        ApiError e = ErrorForStatus(500);
        e.message = std::string("internal error: ") + ex.what();
        LOG_ERROR("http: %s", e.message.c_str());
        auto on_written = std::move(res.on_written);
        res = HttpResponse();
        res.on_written = std::move(on_written);
        SendError(res, e);
      }
      s->RespondFromWorker(res, keep_alive && !draining);
    });
    return;
  }
  try {
    const bool models = path == "/v1/models" || path.rfind("/v1/models/", 0) == 0;
    if (completion) {
      not_allowed("POST");
    } else if ((models || path == "/health" || path == "/metrics") && method != http::verb::get) {
      not_allowed("GET");
    } else if (models) {
      HandleModels(req, res);
    } else if (path == "/health") {
      if (draining) {
        res.status = 503;
        res.set_content(R"({"status":"draining"})", kJson);
      } else {
        res.set_content(R"({"status":"ok"})", kJson);
      }
    } else if (path == "/metrics") {
      res.set_content(PrometheusText(Snapshot()) + (front ? front->MetricsText() : ""), "text/plain; version=0.0.4");
    } else {
      SendError(res, ErrorForStatus(404));
    }
  } catch (const std::exception& ex) {
    ApiError e = ErrorForStatus(500);
    e.message = std::string("internal error: ") + ex.what();
    LOG_ERROR("http: %s", e.message.c_str());
    res = HttpResponse();
    SendError(res, e);
  }
  s->Respond(res, keep_alive && !draining);
}

void HttpServer::Impl::HandleModels(const HttpRequest& req, HttpResponse& res) {
  // Extensions: vocab_size (the model's ids), tokenizer_size,
  // vocab_fingerprint and context_length, what a client comparing token ids
  // with this model (a distillation student) checks first.
  json model = {{"id", cfg.model_name},          {"object", "model"},
                {"created", started_unix},       {"owned_by", "myriad"},
                {"vocab_size", vocab_size()},    {"tokenizer_size", tok->vocab_size()},
                {"vocab_fingerprint", vocab_fingerprint}, {"context_length", cfg.context_tokens}};
  if (req.path == "/v1/models" || req.path == "/v1/models/") {
    res.set_content(json({{"object", "list"}, {"data", json::array({model})}}).dump(), kJson);
    return;
  }
  std::string id = req.path.substr(std::string("/v1/models/").size());
  if (id != cfg.model_name) {
    ApiError e;
    e.status = 404;
    e.message = "The model '" + id + "' does not exist (hint: this server serves '" + cfg.model_name + "')";
    e.code = "model_not_found";
    e.param = "model";
    SendError(res, e);
    return;
  }
  res.set_content(model.dump(), kJson);
}

void HttpServer::Impl::HandleCompletion(const HttpRequest& req, HttpResponse& res, Endpoint ep) {
  if (draining) {
    SendError(res, ErrorForStatus(503));
    return;
  }
  CompletionRequest cr;
  ApiError err;
  if (!ParseCompletionRequest(req.body(), ep, &cr, &err)) {
    SendError(res, err);
    return;
  }
  if (cr.model != cfg.model_name) {
    err.status = 404;
    err.message = "The model '" + cr.model + "' does not exist (hint: this server serves '" + cfg.model_name + "')";
    err.code = "model_not_found";
    err.param = "model";
    SendError(res, err);
    return;
  }

  // An edge front answers here or elsewhere (myriad serve --edge).
  LocalRoute local;
  if (front) {
    std::optional<FrontReply> reply = front->Handle(ep, cr, req.body(), req.peer_gone, &local);
    if (reply) {
      res.status = reply->status;
      res.content_type = reply->content_type;
      res.body = std::move(reply->body);
      for (auto& h : reply->headers) res.set_header(h.first, h.second);
      if (reply->stream) {
        {
          std::lock_guard<std::mutex> lock(acct->mu);
          acct->active_http++;
        }
        res.on_written = [acct = acct] {
          std::lock_guard<std::mutex> lock(acct->mu);
          acct->active_http--;
          acct->idle_cv.notify_all();
        };
        res.stream = [stream = std::move(reply->stream)](const ChunkWriter& write) { stream(write); };
      }
      return;
    }
    for (auto& h : local.headers) res.set_header(h.first, h.second);
  }

  // The prompt, framed as in `myriad generate` (TextConventions).
  std::vector<int32_t> ids;
  std::string echo_text;
  if (ep == Endpoint::kCompletion && cr.prompt_is_tokens) {
    // Ids the model has (a sampled sequence may hold ids past the tokenizer's: its text is U+FFFD).
    for (int32_t t : cr.prompt_tokens)
      if (t >= vocab_size()) {
        err.status = 400;
        err.param = "prompt";
        err.message = "'prompt' token id " + std::to_string(t) + " is outside the vocabulary (size " +
                      std::to_string(vocab_size()) + ")";
        SendError(res, err);
        return;
      }
    ids = cr.prompt_tokens;
    if (cr.echo) echo_text = tok->Decode(ids);
  } else {
    std::string prompt_text = cr.prompt_text;
    if (ep == Endpoint::kChat) {
      auto rendered = chat_template.Render(cr.messages);
      if (!rendered.ok()) {
        err.status = 400;
        err.param = "messages";
        err.message = "the model's chat template refused these messages: " + rendered.status().message();
        SendError(res, err);
        return;
      }
      prompt_text = std::move(rendered).value();
    }
    if (!(ep == Endpoint::kChat && chat_template.writes_own_bos())) ids = text.prompt_prefix;
    tok->EncodeTo(prompt_text, &ids);
    if (cr.echo) echo_text = prompt_text;
  }
  const int64_t context = cfg.context_tokens > 0 ? cfg.context_tokens : INT32_MAX;
  const int64_t prompt_len = static_cast<int64_t>(ids.size());
  // A prompt only scored (echo + logprobs, max_tokens 0) may fill the context.
  const bool score_only = ep == Endpoint::kCompletion && cr.echo && cr.logprobs >= 0 && cr.max_tokens == 0;
  if (prompt_len > context || (prompt_len == context && !score_only)) {
    err.status = 400;
    err.param = ep == Endpoint::kChat ? "messages" : "prompt";
    err.code = "context_length_exceeded";
    err.message = "the prompt is " + std::to_string(prompt_len) + " tokens and this model's context is " +
                  std::to_string(context) + " tokens (hint: shorten the prompt)";
    SendError(res, err);
    return;
  }

  GenerationParams gp;
  // Output is clamped to what fits in the context and in the KV pool
  // (finish_reason "length"), so a small pool (--kv-blocks) serves every
  // prompt that leaves room for a reply, whatever max_tokens says.
  int64_t room = context - prompt_len;
  const int64_t pool_tokens = engine->stats().kv_blocks_total * kBlockTokens;
  if (pool_tokens > 0) {
    if (pool_tokens - prompt_len < (score_only ? 0 : 1)) {
      err.status = 400;
      err.param = ep == Endpoint::kChat ? "messages" : "prompt";
      err.message = "the prompt (" + std::to_string(prompt_len) + " tokens) leaves no room for a reply in this "
                    "server's KV pool of " + std::to_string(pool_tokens) + " tokens (hint: a shorter prompt, or "
                    "restart myriad serve with a larger --kv-blocks)";
      SendError(res, err);
      return;
    }
    room = std::min(room, pool_tokens - prompt_len);
  }
  gp.max_tokens = static_cast<int>(std::min<int64_t>(cr.max_tokens.value_or(room), room));
  gp.sampling.temperature = cr.temperature;
  gp.sampling.top_p = cr.top_p;
  gp.sampling.top_k = cr.top_k;
  const uint64_t n = request_counter.fetch_add(1);
  gp.seed = cr.seed ? *cr.seed : (id_salt ^ (n * 0xD1B54A32D192ED03ull));
  for (int32_t id : text.stop_ids) gp.stop_token_seqs.push_back({id});
  for (const auto& s : cr.stop) {
    std::vector<int32_t> seq = tok->Encode(s);
    if (!seq.empty()) gp.stop_token_seqs.push_back(std::move(seq));
  }

  gp.logprobs = cr.logprobs;
  // echo with logprobs scores the prompt too (completions only; max_tokens 0: only that).
  const bool score_prompt = ep == Endpoint::kCompletion && cr.echo && cr.logprobs >= 0;
  if (score_prompt) {
    if (prompt_len < 2) {
      err.status = 400;
      err.param = "prompt";
      err.message = "'echo' with 'logprobs' scores the prompt, which needs at least 2 tokens (the first has no "
                    "log-probability); this one has " + std::to_string(prompt_len);
      SendError(res, err);
      return;
    }
    gp.prompt_logprobs = cr.logprobs;
  }
  auto gen = std::make_shared<Generation>(engine, tok, cr.stop);
  if (cr.logprobs >= 0) gen->want_logprobs();
  const bool want_logprobs = cr.logprobs >= 0;
  ResponseMeta meta{ep, NewId(ep, n), std::chrono::duration_cast<std::chrono::seconds>(
                                          std::chrono::system_clock::now().time_since_epoch()).count(),
                    cfg.model_name, local.route};

  // Count this response as active before submitting, so Shutdown waits for
  // it, until its last byte is written (or the write failed).
  {
    std::lock_guard<std::mutex> lock(acct->mu);
    acct->active_http++;
  }
  res.on_written = [acct = acct] {
    std::lock_guard<std::mutex> lock(acct->mu);
    acct->active_http--;
    acct->idle_cv.notify_all();
  };
  std::shared_ptr<Pending> pending = gen->pending;
  auto submitted = engine->Submit(ids, gp, [pending, acct = acct](
                                               const TokenEvent& e) {
    if (e.done) {
      RequestCost c = acct->ledger.Charge(e.prompt_tokens, e.cached_tokens, e.completion_tokens);
      std::lock_guard<std::mutex> lock(pending->mu);
      pending->cost = c;
    }
    {
      std::lock_guard<std::mutex> lock(pending->mu);
      pending->events.push_back(e);
    }
    pending->cv.notify_one();
  });
  if (!submitted.ok()) {
    const std::string m = submitted.status().message();
    // The engine says "queue full" for back-pressure and "shutting down"
    // while stopping; anything else is about this request (400).
    if (m.find("queue full") != std::string::npos) {
      {
        std::lock_guard<std::mutex> lock(acct->mu);
        acct->counters.rejected_busy++;
      }
      ApiError busy = ErrorForStatus(429);
      busy.message += ": " + m;
      res.set_header("Retry-After", std::to_string(cfg.retry_after_s));
      SendError(res, busy);
    } else if (m.find("shutting down") != std::string::npos) {
      SendError(res, ErrorForStatus(503));
    } else {
      err.status = 400;
      err.message = m;
      if (m.find("too long") != std::string::npos) err.code = "context_length_exceeded";
      SendError(res, err);
    }
    return;
  }
  gen->id = *submitted;
  {
    std::lock_guard<std::mutex> lock(acct->mu);
    acct->running_ids.insert(gen->id);
  }
  auto on_finished = [acct = acct, gen, front = front, local] {
    if (front && gen->finished() && gen->finish_reason() != "error" && gen->finish_reason() != "cancelled")
      front->LocalDone(local, gen->usage());
    std::lock_guard<std::mutex> lock(acct->mu);
    acct->running_ids.erase(gen->id);
    if (gen->finish_reason() == "error") acct->counters.completions_failed++;
    else if (!gen->finished() || gen->finish_reason() == "cancelled") acct->counters.completions_cancelled++;
    else acct->counters.completions_ok++;
    if (gen->stopped_by_text()) acct->counters.stopped_by_text++;
  };

  if (!cr.stream) {
    std::string text = echo_text;
    std::vector<TokenLogprob> logprobs;
    // Nothing is written until the end, so the client's connection is
    // watched meanwhile: a client that went away cancels its request.
    while (true) {
      auto step = gen->Next(std::chrono::milliseconds(100));
      text += step.text;
      for (auto& l : step.logprobs) logprobs.push_back(std::move(l));
      if (step.finished) break;
      if (req.peer_gone && req.peer_gone()) gen->CancelIfRunning();
    }
    if (score_prompt) {
      // The prompt's tokens first, every one of them (the framing's control
      // tokens too: they were scored), offsets counted in their pieces'
      // code points; then the generated ones, after the echoed text.
      std::vector<TokenLogprob> all;
      TokenLogprob first;
      first.token = tok->DecodePiece(ids[0]);
      first.id = ids[0];
      first.scored = false;
      all.push_back(std::move(first));
      for (const TokenLogprob& l : gen->prompt_logprobs()) all.push_back(l);
      int64_t offset = 0;
      for (TokenLogprob& l : all) {
        l.text_offset = offset;
        if (!TextConventions::IsControl(*tok, l.id)) offset += CodePoints(l.token, l.token.size());
      }
      const int64_t echo_points = CodePoints(echo_text, echo_text.size());
      for (TokenLogprob& l : logprobs) {
        l.text_offset += echo_points;
        all.push_back(std::move(l));
      }
      logprobs = std::move(all);
    }
    on_finished();
    if (gen->finish_reason() == "error") {
      ApiError e;
      e.status = 500;
      e.type = "server_error";
      e.message = "generation failed: " + gen->error();
      SendError(res, e);
      return;
    }
    if (gen->finish_reason() == "cancelled") {
      SendError(res, CancelledError(cfg.drain_timeout_s));
      return;
    }
    const auto& prices = acct->ledger.prices();
    char cost_buf[48];
    std::snprintf(cost_buf, sizeof cost_buf, "%.9f", gen->cost().total());
    res.set_header("X-Myriad-Cost", cost_buf);
    res.set_header("X-Myriad-Currency", prices.currency);
    json body = ResponseJson(meta, text, gen->finish_reason(), gen->usage(), CostJson(gen->cost(), prices.currency),
                             want_logprobs ? LogprobsJson(ep, logprobs) : json(nullptr));
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
    return;
  }

  // Streaming, on the worker: the role (chat) and echo first, then whatever
  // tokens arrive, a keep-alive comment after sse_keepalive_ms without any;
  // a failed write means the client is gone and cancels the request.
  const bool include_usage = cr.include_usage;
  const std::string currency = acct->ledger.prices().currency;
  const auto keepalive = std::chrono::milliseconds(std::max(10, cfg.sse_keepalive_ms));
  const double drain_timeout_s = cfg.drain_timeout_s;
  res.content_type = "text/event-stream";
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.stream = [gen, meta, echo_text, include_usage, currency, keepalive, drain_timeout_s, want_logprobs,
                on_finished](const ChunkWriter& write) {
    std::string out;
    if (meta.endpoint == Endpoint::kChat) out += SseData(ChunkJson(meta, "", true, ""));
    if (!echo_text.empty()) out += SseData(ChunkJson(meta, echo_text, false, ""));
    bool ok = out.empty() || write(out);
    while (ok && !gen->finished()) {
      out.clear();
      auto step = gen->Next(keepalive);
      if (!step.text.empty() || !step.logprobs.empty())
        out += SseData(ChunkJson(meta, step.text, false, "",
                                 want_logprobs ? LogprobsJson(meta.endpoint, step.logprobs) : json(nullptr)));
      if (step.finished) {
        if (gen->finish_reason() == "error" || gen->finish_reason() == "cancelled") {
          // An error event (OpenAI's SDKs raise it), then the end.
          ApiError e;
          if (gen->finish_reason() == "error") {
            e.status = 500;
            e.type = "server_error";
            e.message = "generation failed: " + gen->error();
          } else {
            e = CancelledError(drain_timeout_s);
          }
          out += "data: " + ErrorJson(e) + "\n\n";
        } else {
          out += SseData(ChunkJson(meta, "", false, gen->finish_reason()));
          if (include_usage) out += SseData(UsageChunkJson(meta, gen->usage(), CostJson(gen->cost(), currency)));
        }
        out += kSseDone;
      }
      if (out.empty()) out = ": keep-alive\n\n";  // SSE comment: also probes the connection
      ok = write(out);
    }
    if (!gen->finished()) {
      gen->CancelIfRunning();
      // Wait for the engine's final event so the request is accounted once.
      for (int i = 0; i < 600 && !gen->finished(); ++i) gen->Next(std::chrono::milliseconds(100));
    }
    on_finished();
  };
}

void HttpServer::Impl::WaitIdle(double seconds) {
  std::unique_lock<std::mutex> lock(acct->mu);
  acct->idle_cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return acct->active_http == 0; });
}

HttpServer::HttpServer(Engine* engine, const Tokenizer* tokenizer, ChatTemplate chat_template, PriceTable prices,
                       ServerConfig cfg)
    : impl_(std::make_unique<Impl>(engine, tokenizer, std::move(chat_template), std::move(prices), std::move(cfg))) {}

HttpServer::~HttpServer() { Shutdown(); }

Status HttpServer::Start() {
  Impl& m = *impl_;
  const std::string where =
      m.cfg.port == 0 ? m.cfg.host + " to any port" : m.cfg.host + ":" + std::to_string(m.cfg.port);
  beast::error_code ec;
  tcp::resolver resolver(m.ioc);
  auto found = resolver.resolve(m.cfg.host, std::to_string(m.cfg.port),
                                tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty())
    return Status::Error("cannot bind " + where + ": the host does not resolve (" + ec.message() +
                         "; hint: check --host)");
  const tcp::endpoint ep = found.begin()->endpoint();
  m.acceptor.emplace(m.ioc);
  m.acceptor->open(ep.protocol(), ec);
  if (!ec) m.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor->bind(ep, ec);
  // A deep backlog: a burst of clients must not overflow it and be reset.
  if (!ec) m.acceptor->listen(1024, ec);
  if (ec) {
    m.acceptor.reset();
    const char* hint = m.cfg.port == 0 ? "; hint: check --host)"
                                       : "; hint: the port is in use or the address is not local; try another --port)";
    return Status::Error("cannot bind " + where + " (" + ec.message() + hint);
  }
  m.bound_port = m.acceptor->local_endpoint().port();
  m.workers = std::make_unique<net::thread_pool>(static_cast<size_t>(std::max(1, m.cfg.http_threads)));
  m.accept_retry.emplace(m.ioc);
  m.work.emplace(m.ioc.get_executor());
  m.Accept();
  m.io_thread = std::thread([&m] { m.ioc.run(); });
  return Status::Ok();
}

int HttpServer::port() const { return impl_->bound_port; }

void HttpServer::SetFront(CompletionFront* front) { impl_->front = front; }

std::string HttpServer::url() const {
  const std::string& h = impl_->cfg.host;
  return "http://" + (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(port());
}

void HttpServer::Shutdown() {
  Impl& m = *impl_;
  std::call_once(m.shutdown_once, [&m] {
    m.draining = true;
    m.WaitIdle(m.cfg.drain_timeout_s);
    std::vector<uint64_t> left;
    {
      std::lock_guard<std::mutex> lock(m.acct->mu);
      left.assign(m.acct->running_ids.begin(), m.acct->running_ids.end());
    }
    if (!left.empty()) {
      LOG_WARN("serve: %zu requests still running after %gs; cancelling them", left.size(), m.cfg.drain_timeout_s);
      for (uint64_t id : left) m.engine->Cancel(id);
      // A moment for their answers (503, or an error event) to go out; a
      // client that does not read them is cut off below.
      m.WaitIdle(1);
    }
    if (!m.io_thread.joinable()) return;
    // Stop accepting and close every connection (idle, slow or mid-response):
    // pending reads end, a worker's next write fails.
    net::post(m.ioc, [&m] {
      beast::error_code ignored;
      m.acceptor->close(ignored);
      m.accept_retry->cancel();
      std::vector<std::shared_ptr<Connection>> open;
      {
        std::lock_guard<std::mutex> lock(m.sessions_mu);
        for (auto& [p, w] : m.sessions)
          if (auto s = w.lock()) open.push_back(std::move(s));
      }
      for (auto& s : open) net::post(s->executor(), [s] { s->Close(); });
    });
    m.workers->join();
    m.work.reset();
    m.ioc.stop();
    m.io_thread.join();
  });
}

ServerCounters HttpServer::counters() const {
  std::lock_guard<std::mutex> lock(impl_->acct->mu);
  return impl_->acct->counters;
}

BillingLedger::Totals HttpServer::billing() const { return impl_->acct->ledger.totals(); }

ServerSnapshot HttpServer::Impl::Snapshot() {
  ServerSnapshot snap;
  snap.engine = engine->stats();
  {
    std::lock_guard<std::mutex> lock(acct->mu);
    snap.counters = acct->counters;
    snap.responses_by_status = acct->responses_by_status;
  }
  snap.billing = acct->ledger.totals();
  snap.prices = acct->ledger.prices();
  return snap;
}

std::string HttpServer::MetricsText() {
  return PrometheusText(impl_->Snapshot()) + (impl_->front ? impl_->front->MetricsText() : "");
}
std::string HttpServer::Summary() { return SummaryText(impl_->Snapshot()); }

}  // namespace myriad::serve
