// A front before the engine: for each completion request, after it parsed
// and before the engine sees it, the front may answer it elsewhere
// (`myriad serve --edge --cloud URL`: edge/edge_front.h forwards to a cloud
// endpoint, desensitised or as sent) or keep it local, naming the route the
// response reports.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "serve/http/openai.h"

namespace myriad::serve {

// A response the front made itself: a whole body, or `stream`, which writes
// the body's bytes (SSE events) through `write` (false: the client is gone).
struct FrontReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  std::function<void(const std::function<bool(const std::string&)>& write)> stream;
};

// A request the engine answers: the route its response names (the "route"
// field and the X-Myriad-Route header) and headers to add.
struct LocalRoute {
  std::string route;
  std::vector<std::pair<std::string, std::string>> headers;
};

class CompletionFront {
 public:
  virtual ~CompletionFront() = default;
  // On an HTTP worker. `body` is the request as received, `cr` as parsed.
  // `peer_gone` says whether the client went away (may be empty).
  // nullopt: the engine answers, as *local says.
  virtual std::optional<FrontReply> Handle(Endpoint ep, const CompletionRequest& cr, const std::string& body,
                                           const std::function<bool()>& peer_gone, LocalRoute* local) = 0;
  // After the engine answered a request the front kept local.
  virtual void LocalDone(const LocalRoute& route, const Usage& usage) = 0;
  // Prometheus lines appended to /metrics.
  virtual std::string MetricsText() = 0;
};

}  // namespace myriad::serve
