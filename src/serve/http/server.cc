#include "serve/http/server.h"

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

using nlohmann::json;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kJson = "application/json";

// State shared with engine callbacks, which may outlive a request's handler
// (a client that went away) and must not touch the server after it is gone.
struct Accounts {
  explicit Accounts(PriceTable p) : ledger(std::move(p)) {}
  BillingLedger ledger;
  mutable std::mutex mu;
  ServerCounters counters;
  std::map<int, int64_t> responses_by_status;
  std::set<uint64_t> running_ids;  // submitted, final event not yet seen
  std::condition_variable idle_cv;  // signalled when a request finishes
  int64_t active_http = 0;          // completion responses not yet fully written
};

// The hand-over between the engine thread (Push) and a connection thread.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TokenEvent> events;
  RequestCost cost;  // set with the final event
};

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

 private:
  // Log-probabilities follow the text: a token's entry goes out once its
  // text is shown (held back by a possible stop string: it waits); after a
  // stop string, the tokens whose text starts before it are kept.
  struct HeldLogprob {
    TokenLogprob lp;
    int64_t start, end;  // its bytes in the decoded text
  };
  static int64_t CodePoints(const std::string& s, size_t bytes) {
    int64_t n = 0;
    for (size_t i = 0; i < bytes && i < s.size(); ++i) n += (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
    return n;
  }
  TokenLogprob ToText(const TokenLogprobs& l) const {
    TokenLogprob t;
    t.token = tok_->DecodePiece(l.token);
    t.logprob = l.logprob;
    for (const auto& [id, lp] : l.top) t.top.emplace_back(tok_->DecodePiece(id), lp);
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
};

// Compares without an early exit, so the time taken does not reveal how
// much of a guessed key was right.
bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// What a handler sees of a request.
struct HttpRequest {
  http::request<http::string_body> msg;
  std::string path;  // the target without its query

  const std::string& body() const { return msg.body(); }
  std::string get_header_value(http::field f) const { return std::string(msg[f]); }
};

// Bytes of a streamed response, written from a worker thread; false when the
// connection is gone.
using ChunkWriter = std::function<bool(const std::string&)>;

// What a handler produces: a whole response, or a head and a stream function
// that writes the body in chunks (run on a worker thread).
struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::function<void(const ChunkWriter&)> stream;
  std::function<void()> on_written;  // run once the response is written or abandoned

  void set_header(const std::string& k, const std::string& v) { headers.emplace_back(k, v); }
  void set_content(std::string b, const char* type) {
    body = std::move(b);
    content_type = type;
  }
};

void SendError(HttpResponse& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ErrorJson(e), kJson);
}

ApiError ErrorWithMessage(int status, const std::string& message) {
  ApiError e = ErrorForStatus(status);
  e.message = message;
  return e;
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

// HTTP/1.1 text of a whole response, or of the head alone (`chunked`: the
// body follows in chunks).
template <class Body>
void FillHead(http::response<Body>& m, const HttpResponse& r, bool keep_alive) {
  if (!r.content_type.empty()) m.set(http::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) m.set(k, v);
  m.keep_alive(keep_alive);
}

std::string WholeResponse(const HttpResponse& r, unsigned version, bool keep_alive) {
  http::response<http::string_body> m{static_cast<http::status>(r.status), version};
  FillHead(m, r, keep_alive);
  m.body() = r.body;
  m.prepare_payload();
  std::ostringstream os;
  os << m;
  return std::move(os).str();
}

std::string StreamHead(const HttpResponse& r, unsigned version, bool keep_alive) {
  http::response<http::empty_body> m{static_cast<http::status>(r.status), version};
  FillHead(m, r, keep_alive);
  if (version >= 11) m.chunked(true);
  std::ostringstream os;
  os << m.base();
  return std::move(os).str();
}

std::string Chunk(const std::string& data) {
  char len[24];
  std::snprintf(len, sizeof len, "%zx\r\n", data.size());
  return len + data + "\r\n";
}

std::chrono::steady_clock::duration Seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(std::max(0.0, s)));
}

constexpr size_t kHeaderLimit = 32 << 10;  // request line and fields; more is 431

class Session;

}  // namespace

struct HttpServer::Impl {
  Engine* engine;
  const Tokenizer* tok;
  ChatTemplate chat_template;
  ServerConfig cfg;
  TextConventions text;  // prompt framing and stop ids
  std::shared_ptr<Accounts> acct;
  int bound_port = 0;
  std::atomic<bool> draining{false};
  std::once_flag shutdown_once;
  int64_t started_unix = 0;
  std::atomic<uint64_t> request_counter{0};
  uint64_t id_salt = 0;

  // The network, in destruction order (last first): the I/O context
  // destroys handlers that hold sessions, whose destructors use `sessions`.
  std::mutex sessions_mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
  net::io_context ioc{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_retry;
  std::unique_ptr<net::thread_pool> workers;  // completions run here
  std::thread io_thread;

  Impl(Engine* e, const Tokenizer* t, ChatTemplate ct, PriceTable prices, ServerConfig c)
      : engine(e), tok(t), chat_template(std::move(ct)), cfg(std::move(c)),
        text(TextConventions::For(*t, cfg.model_eos_ids)), acct(std::make_shared<Accounts>(std::move(prices))) {
    std::random_device rd;
    id_salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    started_unix = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  }

  std::string NewId(Endpoint ep, uint64_t n) {
    char buf[64];
    uint64_t x = (n + 1) * 0x9E3779B97F4A7C15ull ^ id_salt;
    std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", ep == Endpoint::kChat ? "chatcmpl" : "cmpl",
                  static_cast<unsigned long long>(x), static_cast<unsigned long long>(n & 0xffffffffu));
    return buf;
  }

  void Accept();
  // On the I/O thread: authentication and routing; completions go to a worker.
  void Dispatch(const std::shared_ptr<Session>& s, HttpRequest req);
  void HandleCompletion(const HttpRequest& req, HttpResponse& res, Endpoint ep);
  void HandleModels(const HttpRequest& req, HttpResponse& res);
  void CountRequest() {
    std::lock_guard<std::mutex> lock(acct->mu);
    acct->counters.http_requests++;
  }
  void CountResponse(int status) {
    std::lock_guard<std::mutex> lock(acct->mu);
    acct->responses_by_status[status]++;
    if (status >= 400 && status != 429 && status != 503 && status != 401) acct->counters.bad_requests++;
  }
  void WaitIdle(double seconds);
  ServerSnapshot Snapshot();  // what /metrics and the summary report
};

namespace {

// One connection, driven on its strand of the I/O thread: wait for a request
// (idle deadline), read its head (header deadline) and body (body deadline,
// size limit), answer it (inline, or on a worker for a completion), then the
// next one: pipelined requests wait in `buffer_` and are answered in order.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpServer::Impl* srv, tcp::socket sock) : srv_(srv), stream_(std::move(sock)) {}
  ~Session() {
    std::lock_guard<std::mutex> lock(srv_->sessions_mu);
    srv_->sessions.erase(this);
  }

  void Start() {
    {
      std::lock_guard<std::mutex> lock(srv_->sessions_mu);
      srv_->sessions.emplace(this, weak_from_this());
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->WaitForRequest(); });
  }

  // On the strand: a response made on the I/O thread.
  void Respond(const HttpResponse& res, bool keep_alive) {
    srv_->CountResponse(res.status);
    auto data = std::make_shared<std::string>(WholeResponse(res, version_, keep_alive));
    stream_.expires_after(Seconds(srv_->cfg.body_timeout_s));
    net::async_write(stream_, net::buffer(*data),
                     [self = shared_from_this(), data, keep_alive](beast::error_code ec, size_t) {
                       if (ec || !keep_alive) return self->Close();
                       self->WaitForRequest();
                     });
  }

  // On a worker thread: writes a response (a whole one, or a head and the
  // stream), then hands the connection back to the strand.
  void RespondFromWorker(HttpResponse& res, bool keep_alive) {
    srv_->CountResponse(res.status);
    bool ok;
    if (!res.stream) {
      ok = BlockingWrite(WholeResponse(res, version_, keep_alive));
    } else {
      const bool chunked = version_ >= 11;
      if (!chunked) keep_alive = false;  // HTTP/1.0: the body ends with the connection
      ok = BlockingWrite(StreamHead(res, version_, keep_alive));
      res.stream([&](const std::string& data) {
        if (ok) ok = BlockingWrite(chunked ? Chunk(data) : data);
        return ok;
      });
      if (ok && chunked) ok = BlockingWrite("0\r\n\r\n");
    }
    if (res.on_written) res.on_written();
    net::post(stream_.get_executor(), [self = shared_from_this(), ok, keep_alive] {
      if (ok && keep_alive) self->WaitForRequest();
      else self->Close();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  net::any_io_executor executor() { return stream_.get_executor(); }
  unsigned version() const { return version_; }

 private:
  // Waits for the first byte of the next request, up to the idle timeout
  // (bytes of a pipelined request may be buffered already).
  void WaitForRequest() {
    if (closed_) return;
    if (buffer_.size() > 0) return ReadHead();
    stream_.expires_after(Seconds(srv_->cfg.keep_alive_timeout_s));
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->Close();
      self->buffer_.commit(n);
      self->ReadHead();
    });
  }

  void ReadHead() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(srv_->cfg.max_body_bytes);
    stream_.expires_after(Seconds(srv_->cfg.header_timeout_s));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHead(ec); });
  }

  void OnHead(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    version_ = parser_->get().version() == 10 ? 10 : 11;
    if (parser_->is_done()) return OnRequest();
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      stream_.expires_after(Seconds(srv_->cfg.body_timeout_s));
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->Close();
        self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    stream_.expires_after(Seconds(srv_->cfg.body_timeout_s));
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->OnReadError(ec);
      self->OnRequest();
    });
  }

  // A request that cannot be read: an answer where the client can use one,
  // then the connection is closed (what follows on it cannot be parsed).
  void OnReadError(beast::error_code ec) {
    if (ec == http::error::body_limit) {
      srv_->CountRequest();
      return Refuse(ErrorForStatus(413));
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      srv_->CountRequest();
      return Refuse(ErrorWithMessage(431, "the request head is over " + std::to_string(kHeaderLimit >> 10) +
                                              " KiB (hint: fewer or shorter headers)"));
    }
    if (ec.category() == beast::error_code(http::error::bad_target).category() && ec != http::error::end_of_stream &&
        ec != http::error::partial_message) {
      srv_->CountRequest();
      return Refuse(ErrorWithMessage(400, "malformed HTTP request: " + ec.message()));
    }
    Close();  // timeout, reset, end of stream: nobody to answer
  }

  // Answers and closes. The rest of the request is read and dropped for a
  // moment first (a lingering close): closing with unread bytes would reset
  // the connection, and the client might lose the answer.
  void Refuse(const ApiError& e) {
    version_ = 11;
    HttpResponse res;
    SendError(res, e);
    srv_->CountResponse(res.status);
    auto data = std::make_shared<std::string>(WholeResponse(res, version_, false));
    stream_.expires_after(Seconds(srv_->cfg.body_timeout_s));
    net::async_write(stream_, net::buffer(*data), [self = shared_from_this(), data](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      self->stream_.expires_after(std::chrono::seconds(2));
      self->discard_ = std::make_unique<char[]>(kDiscard);
      self->Discard();
    });
  }
  void Discard() {
    stream_.async_read_some(net::buffer(discard_.get(), kDiscard), [self = shared_from_this()](beast::error_code ec,
                                                                                                 size_t) {
      if (ec) return self->Close();
      self->Discard();
    });
  }

  void OnRequest() {
    HttpRequest req;
    req.msg = parser_->release();
    parser_.reset();
    const std::string_view target = req.msg.target();
    req.path = std::string(target.substr(0, target.find('?')));
    srv_->CountRequest();
    srv_->Dispatch(shared_from_this(), std::move(req));
  }

  // From a worker: the write runs on the strand; this waits for it.
  bool BlockingWrite(std::string bytes) {
    auto done = std::make_shared<std::promise<bool>>();
    std::future<bool> result = done->get_future();
    auto data = std::make_shared<std::string>(std::move(bytes));
    net::post(stream_.get_executor(), [self = shared_from_this(), data, done] {
      if (self->closed_) return done->set_value(false);
      self->stream_.expires_after(Seconds(self->srv_->cfg.body_timeout_s));
      net::async_write(self->stream_, net::buffer(*data),
                       [data, done](beast::error_code ec, size_t) { done->set_value(!ec); });
    });
    try {
      return result.get();
    } catch (const std::future_error&) {
      return false;  // the I/O context dropped the write (stopped)
    }
  }

  static constexpr size_t kDiscard = 16 << 10;
  HttpServer::Impl* srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kHeaderLimit + (16 << 10)};
  std::optional<http::request_parser<http::string_body>> parser_;
  std::unique_ptr<char[]> discard_;
  unsigned version_ = 11;
  bool closed_ = false;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
    if (!acceptor->is_open()) return;
    if (ec) {
      // Out of descriptors or the like: try again in a moment instead of spinning.
      LOG_WARN("http: accept failed: %s", ec.message().c_str());
      accept_retry->expires_after(std::chrono::milliseconds(100));
      accept_retry->async_wait([this](beast::error_code) {
        if (acceptor->is_open()) Accept();
      });
      return;
    }
    // Without it, Nagle's algorithm holds a response's last segment until the
    // client's delayed ACK: ~40 ms per response on a kept-alive connection.
    beast::error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored);
    std::make_shared<Session>(this, std::move(sock))->Start();
    Accept();
  });
}

void HttpServer::Impl::Dispatch(const std::shared_ptr<Session>& s, HttpRequest req) {
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
      res.set_content(PrometheusText(Snapshot()), "text/plain; version=0.0.4");
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
  json model = {{"id", cfg.model_name}, {"object", "model"}, {"created", started_unix}, {"owned_by", "myriad"}};
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

  // The prompt, framed as in `myriad generate` (TextConventions).
  std::vector<int32_t> ids;
  std::string echo_text;
  if (ep == Endpoint::kCompletion && cr.prompt_is_tokens) {
    for (int32_t t : cr.prompt_tokens)
      if (t >= tok->vocab_size()) {
        err.status = 400;
        err.param = "prompt";
        err.message = "'prompt' token id " + std::to_string(t) + " is outside the vocabulary (size " +
                      std::to_string(tok->vocab_size()) + ")";
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
  if (prompt_len >= context) {
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
    if (pool_tokens - prompt_len < 1) {
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
  auto gen = std::make_shared<Generation>(engine, tok, cr.stop);
  if (cr.logprobs >= 0) gen->want_logprobs();
  const bool want_logprobs = cr.logprobs >= 0;
  ResponseMeta meta{ep, NewId(ep, n), std::chrono::duration_cast<std::chrono::seconds>(
                                          std::chrono::system_clock::now().time_since_epoch()).count(),
                    cfg.model_name};

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
  auto on_finished = [acct = acct, gen] {
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
    while (true) {
      auto step = gen->Next(std::chrono::milliseconds(1000));
      text += step.text;
      for (auto& l : step.logprobs) logprobs.push_back(std::move(l));
      if (step.finished) break;
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
      std::vector<std::shared_ptr<Session>> open;
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

std::string HttpServer::MetricsText() { return PrometheusText(impl_->Snapshot()); }
std::string HttpServer::Summary() { return SummaryText(impl_->Snapshot()); }

}  // namespace myriad::serve
