#include "serve/http/client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>

namespace myriad::serve {
namespace {
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
}  // namespace

Result<HttpUrl> ParseHttpUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0)
    return Status::Error("'" + url + "' is not an http:// URL (hint: http://host:port, e.g. http://127.0.0.1:8000)");
  std::string rest = url.substr(scheme.size());
  HttpUrl u;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    u.path = rest.substr(slash);
    rest.resize(slash);
  }
  std::string port;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) return Status::Error("'" + url + "': unclosed '[' in the host");
    u.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') return Status::Error("'" + url + "': expected ':' after ']'");
      port = rest.substr(close + 2);
    }
  } else {
    const size_t colon = rest.rfind(':');
    u.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  if (u.host.empty()) return Status::Error("'" + url + "' names no host");
  if (!port.empty()) {
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (*end != '\0' || p < 1 || p > 65535) return Status::Error("'" + url + "': port '" + port + "' is not 1..65535");
    u.port = static_cast<int>(p);
  }
  return u;
}

Result<HttpReply> HttpCall(const std::string& url, const std::string& method, const std::string& body,
                           double timeout_s, const std::string& api_key) {
  ASSIGN_OR_RETURN(HttpUrl u, ParseHttpUrl(url));
  const auto fail = [&](const char* step, const beast::error_code& ec) {
    return Status::Error(method + " " + url + ": " + step + ": " + ec.message() +
                         (ec == beast::error::timeout ? " (after " + std::to_string(timeout_s) + " s)" : ""));
  };
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  const auto deadline = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  beast::error_code ec;
  tcp::resolver resolver(ioc);
  auto endpoints = resolver.resolve(u.host, std::to_string(u.port), ec);
  if (ec) return fail("resolve", ec);
  // Asynchronous operations run to completion here, so that the stream's
  // deadline bounds each of them.
  stream.expires_after(deadline);
  stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
  ioc.run();
  if (ec) return fail("connect", ec);
  http::request<http::string_body> req{method == "POST" ? http::verb::post : http::verb::get, u.path, 11};
  req.set(http::field::host, u.host);
  req.set(http::field::user_agent, "myriad");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  if (method == "POST") {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
  }
  req.prepare_payload();
  ioc.restart();
  http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
  ioc.run();
  if (ec) return fail("write", ec);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(size_t{1} << 30);
  ioc.restart();
  http::async_read(stream, buf, parser, [&](beast::error_code e, size_t) { ec = e; });
  ioc.run();
  if (ec) return fail("read", ec);
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  HttpReply r;
  r.status = static_cast<int>(parser.get().result_int());
  r.body = std::move(parser.get().body());
  return r;
}

struct HttpStreamCall::State {
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buf;
  http::response_parser<http::buffer_body> parser;
  bool done = false;
};

HttpStreamCall::~HttpStreamCall() { Close(); }

void HttpStreamCall::Close() {
  if (!st_) return;
  beast::error_code ignored;
  st_->stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  st_->stream.socket().close(ignored);
  st_.reset();
}

Result<std::unique_ptr<HttpStreamCall>> HttpStreamCall::Open(const std::string& url, const std::string& body,
                                                             double connect_timeout_s, const std::string& api_key) {
  ASSIGN_OR_RETURN(HttpUrl u, ParseHttpUrl(url));
  std::unique_ptr<HttpStreamCall> call(new HttpStreamCall());
  call->url_ = url;
  call->st_ = std::make_unique<State>();
  State& st = *call->st_;
  const auto fail = [&](const char* step, const beast::error_code& ec) {
    return Status::Error("POST " + url + ": " + step + ": " + ec.message() +
                         (ec == beast::error::timeout ? " (after " + std::to_string(connect_timeout_s) + " s)" : ""));
  };
  beast::error_code ec;
  tcp::resolver resolver(st.ioc);
  auto endpoints = resolver.resolve(u.host, std::to_string(u.port), ec);
  if (ec) return fail("resolve", ec);
  st.stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s * 1000)));
  st.stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
  st.ioc.run();
  if (ec) return fail("connect", ec);
  http::request<http::string_body> req{http::verb::post, u.path, 11};
  req.set(http::field::host, u.host);
  req.set(http::field::user_agent, "myriad");
  req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  st.ioc.restart();
  http::async_write(st.stream, req, [&](beast::error_code e, size_t) { ec = e; });
  st.ioc.run();
  if (ec) return fail("write", ec);
  st.parser.body_limit(boost::none);
  st.ioc.restart();
  http::async_read_header(st.stream, st.buf, st.parser, [&](beast::error_code e, size_t) { ec = e; });
  st.ioc.run();
  if (ec) return fail("read", ec);
  call->status_ = static_cast<int>(st.parser.get().result_int());
  st.done = st.parser.is_done();
  return call;
}

std::string HttpStreamCall::header(const std::string& name) const {
  if (!st_) return "";
  return std::string(st_->parser.get()[name]);
}

Result<bool> HttpStreamCall::Read(std::string* out, double idle_timeout_s) {
  if (!st_ || st_->done) return false;
  State& st = *st_;
  char piece[16384];
  auto& b = st.parser.get().body();
  b.data = piece;
  b.size = sizeof piece;
  beast::error_code ec;
  st.stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(idle_timeout_s * 1000)));
  st.ioc.restart();
  http::async_read_some(st.stream, st.buf, st.parser, [&](beast::error_code e, size_t) { ec = e; });
  st.ioc.run();
  if (ec == http::error::need_buffer) ec = {};
  if (ec == http::error::end_of_stream || ec == net::error::eof) {
    st.done = true;
    return Status::Error("POST " + url_ + ": the server closed the connection before the end of its answer");
  }
  if (ec)
    return Status::Error("POST " + url_ + ": read: " + ec.message() +
                         (ec == beast::error::timeout ? " (silent for " + std::to_string(idle_timeout_s) + " s)" : ""));
  out->append(piece, sizeof piece - b.size);
  if (st.parser.is_done()) st.done = true;
  return true;
}

}  // namespace myriad::serve
