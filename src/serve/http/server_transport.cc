// The HTTP front's connections: one Session per accepted socket, driven on
// its strand of the I/O thread under the idle, header and body deadlines;
// pipelined requests answered in order; responses written whole, or as
// chunks from a worker (server_internal.h's Connection).
#include <sys/socket.h>

#include <cerrno>
#include <sstream>

#include "core/log.h"
#include "serve/http/server_internal.h"

namespace myriad::serve {
namespace {

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

// One connection, driven on its strand of the I/O thread: wait for a request
// (idle deadline), read its head (header deadline) and body (body deadline,
// size limit), answer it (inline, or on a worker for a completion), then the
// next one: pipelined requests wait in `buffer_` and are answered in order.
class Session : public Connection, public std::enable_shared_from_this<Session> {
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
  void Respond(const HttpResponse& res, bool keep_alive) override {
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
  void RespondFromWorker(HttpResponse& res, bool keep_alive) override {
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

  void Close() override {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  bool PeerGone() override {
    char c;
    const ssize_t r = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  net::any_io_executor executor() override { return stream_.get_executor(); }
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

}  // namespace myriad::serve
