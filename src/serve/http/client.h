// A small blocking HTTP/1.1 client over Boost.Beast (the same library as the
// server), for Myriad talking to another Myriad server: a distillation
// student asking a remote teacher to score its tokens (rl/remote_teacher.h).
// An edge server forwarding a request to the cloud (edge/edge_front.h)
// streams the answer through HttpStreamCall. One connection per call; plain http:// only (a server on a trusted
// network or loopback; put TLS in front of it otherwise).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"

namespace myriad::serve {

struct HttpUrl {
  std::string host;
  int port = 80;
  std::string path = "/";  // with the query, if any
};
// "http://host[:port][/path]" (host: a name, IPv4, or [IPv6]).
Result<HttpUrl> ParseHttpUrl(const std::string& url);

struct HttpReply {
  int status = 0;
  std::string body;
};

// GET (empty body) or POST (`body` as application/json) to `url`, with an
// optional bearer key; the whole exchange (resolve, connect, write, read)
// must finish within timeout_s. Errors name the URL and the step that failed.
Result<HttpReply> HttpCall(const std::string& url, const std::string& method, const std::string& body,
                           double timeout_s, const std::string& api_key = "");

// A POST whose answer is read as it arrives (an SSE stream): Open connects,
// writes the request and reads the response head within connect_timeout_s;
// Read then returns the body's bytes piece by piece, each within
// idle_timeout_s. Not thread-safe; one call per object.
class HttpStreamCall {
 public:
  ~HttpStreamCall();
  HttpStreamCall(const HttpStreamCall&) = delete;
  HttpStreamCall& operator=(const HttpStreamCall&) = delete;

  static Result<std::unique_ptr<HttpStreamCall>> Open(const std::string& url, const std::string& body,
                                                      double connect_timeout_s, const std::string& api_key = "");
  int status() const { return status_; }
  // The response header `name` ("" when absent).
  std::string header(const std::string& name) const;
  // Appends the next bytes of the body to *out; false once the body ended
  // (nothing appended). An error when the peer fails or stays silent.
  Result<bool> Read(std::string* out, double idle_timeout_s);
  // Closes the connection (the server sees the client go away).
  void Close();

  struct State;

 private:
  HttpStreamCall() = default;
  std::unique_ptr<State> st_;
  int status_ = 0;
  std::string url_;
};

}  // namespace myriad::serve
