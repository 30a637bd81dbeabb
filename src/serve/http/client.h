// A small blocking HTTP/1.1 client over Boost.Beast (the same library as the
// server), for Myriad talking to another Myriad server: a distillation
// student asking a remote teacher to score its tokens (rl/remote_teacher.h).
// One connection per call; plain http:// only (a server on a trusted
// network or loopback; put TLS in front of it otherwise).
#pragma once

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

}  // namespace myriad::serve
