// The HTTP front's internals, shared by server.cc (routing, the OpenAI
// handlers, start and shutdown) and server_transport.cc (the connections on
// the I/O thread): what a handler sees of a request and makes of a response,
// the Connection a handler answers through, and HttpServer::Impl. Not a
// public header.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/http/front.h"
#include "serve/http/openai.h"
#include "serve/http/server.h"
#include "serve/http/server_metrics.h"

namespace myriad::serve {

using nlohmann::json;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace http_detail {

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

// What a handler sees of a request.
struct HttpRequest {
  http::request<http::string_body> msg;
  std::string path;  // the target without its query
  // From a worker, while a completion runs: whether the client has closed or
  // reset its connection (Connection::PeerGone). Null: never asked.
  std::function<bool()> peer_gone;

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

constexpr const char* kJson = "application/json";

inline void SendError(HttpResponse& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ErrorJson(e), kJson);
}

inline ApiError ErrorWithMessage(int status, const std::string& message) {
  ApiError e = ErrorForStatus(status);
  e.message = message;
  return e;
}

// What a handler answers through: one connection, whose I/O runs on its
// strand of the I/O thread (server_transport.cc's Session).
class Connection {
 public:
  virtual ~Connection() = default;
  // On the strand: a response made on the I/O thread.
  virtual void Respond(const HttpResponse& res, bool keep_alive) = 0;
  // On a worker: writes the response (a stream's chunks as they come) and
  // waits for each write.
  virtual void RespondFromWorker(HttpResponse& res, bool keep_alive) = 0;
  virtual void Close() = 0;  // on the strand
  // From a worker while the strand does no I/O on this connection (a
  // completion is being made): whether the client closed (FIN) or reset the
  // connection. A non-blocking peek of one byte, nothing consumed, so a
  // pipelined request's bytes stay for the next read. A client that
  // half-closes its side to mark the end of a request counts as gone.
  virtual bool PeerGone() = 0;
  virtual boost::asio::any_io_executor executor() = 0;
};

}  // namespace http_detail

using http_detail::Accounts;
using http_detail::ChunkWriter;
using http_detail::Connection;
using http_detail::HttpRequest;
using http_detail::HttpResponse;
using http_detail::kJson;
using http_detail::SendError;
using http_detail::ErrorWithMessage;

struct HttpServer::Impl {
  Engine* engine;
  const Tokenizer* tok;
  ChatTemplate chat_template;
  ServerConfig cfg;
  TextConventions text;  // prompt framing and stop ids
  std::string vocab_fingerprint;  // tok's, for /v1/models
  int64_t vocab_size() const { return cfg.vocab_size > 0 ? cfg.vocab_size : tok->vocab_size(); }
  std::shared_ptr<Accounts> acct;
  int bound_port = 0;
  std::atomic<bool> draining{false};
  std::once_flag shutdown_once;
  int64_t started_unix = 0;
  std::atomic<uint64_t> request_counter{0};
  uint64_t id_salt = 0;
  CompletionFront* front = nullptr;  // myriad serve --edge (not owned)

  // The network, in destruction order (last first): the I/O context
  // destroys handlers that hold sessions, whose destructors use `sessions`.
  std::mutex sessions_mu;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> sessions;
  net::io_context ioc{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> accept_retry;
  std::unique_ptr<net::thread_pool> workers;  // completions run here
  std::thread io_thread;

  Impl(Engine* e, const Tokenizer* t, ChatTemplate ct, PriceTable prices, ServerConfig c)
      : engine(e), tok(t), chat_template(std::move(ct)), cfg(std::move(c)),
        text(TextConventions::For(*t, cfg.model_eos_ids)), vocab_fingerprint(t->VocabFingerprint()),
        acct(std::make_shared<Accounts>(std::move(prices))) {
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

  void Accept();  // server_transport.cc: connections become Sessions
  // On the I/O thread: authentication and routing; completions go to a worker.
  void Dispatch(const std::shared_ptr<Connection>& s, HttpRequest req);
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

}  // namespace myriad::serve
