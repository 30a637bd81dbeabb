// The edge server's front (`myriad serve --edge --cloud URL`): every
// completion request is answered on the device, or forwarded to a cloud
// OpenAI-compatible endpoint as the router says (or as the request pins it
// with "route": "edge" | "collaborative" | "cloud" | "auto"). The
// collaborative route desensitises the request first (edge/redact.h: one
// vault per request) and restores the answer, streamed answers included
// (a placeholder split across chunks is held back until it completes).
// Every response names its route: the "route" field and X-Myriad-Route.
// When the cloud cannot be reached (or answers 5xx or 429), the edge
// answers and says so (X-Myriad-Route-Fallback).
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "edge/redact.h"
#include "edge/route.h"
#include "serve/billing.h"
#include "serve/http/front.h"

namespace myriad::edge {

struct EdgeFrontConfig {
  std::string cloud_url;          // http://host:port of the cloud server
  std::string cloud_model;        // the model id the cloud serves ("": its /v1/models' first, asked once)
  std::string cloud_api_key;      // sent as a bearer key ("" none)
  double connect_timeout_s = 3;   // connect + request + response head
  double idle_timeout_s = 120;    // a silent cloud stream fails after this
  serve::PriceTable cloud_prices; // what the cloud charges: the cost saved is priced with it
};

class EdgeFront : public serve::CompletionFront {
 public:
  // `policy` may be null: "auto" then answers on the edge. Neither is owned.
  EdgeFront(EdgeFrontConfig cfg, const Redactor* redactor, const RoutePolicy* policy);

  std::optional<serve::FrontReply> Handle(serve::Endpoint ep, const serve::CompletionRequest& cr,
                                          const std::string& body, const std::function<bool()>& peer_gone,
                                          serve::LocalRoute* local) override;
  void LocalDone(const serve::LocalRoute& route, const serve::Usage& usage) override;
  std::string MetricsText() override;

  struct Counters {
    std::array<int64_t, 3> routes{};  // by Route
    int64_t fallbacks = 0;            // cloud unreachable: answered on the edge
    int64_t pinned = 0;               // the request chose its route
    std::map<std::string, int64_t> redactions;  // by entity type name
    int64_t restore_unresolved = 0;
    int64_t cloud_prompt_tokens = 0, cloud_completion_tokens = 0;
    double cloud_cost = 0;            // forwarded requests at the cloud's prices
    double cost_saved = 0;            // edge-answered requests at the cloud's prices
    double decide_ms_sum = 0;
    int64_t decisions = 0;
  };
  Counters counters() const;

 private:
  // Answers on the edge: the response names `route_name` ("edge").
  void KeepLocal(serve::LocalRoute* local, const std::string& fallback_reason);
  void CountCloudUsage(const nlohmann::json& usage);
  // cfg_.cloud_model, or the cloud's first model id (asked once it answers).
  Result<std::string> CloudModel();

  EdgeFrontConfig cfg_;
  const Redactor* redactor_;
  const RoutePolicy* policy_;
  mutable std::mutex mu_;
  Counters c_;
  std::mutex model_mu_;
  std::string cloud_model_;
};

// The text a router reads from a request: the chat messages' contents (one
// per line) or the completion prompt.
std::string RoutingText(const serve::CompletionRequest& cr);

}  // namespace myriad::edge
