// Where a request is answered: on the device (edge), by the cloud model on
// the desensitised request with the answer restored on the device
// (collaborative), or by the cloud model as sent (cloud).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace myriad::edge {

enum class Route : int { kEdge = 0, kCollaborative = 1, kCloud = 2 };

const char* RouteName(Route r);                          // "edge", "collaborative", "cloud"
std::optional<Route> ParseRoute(std::string_view name);  // the inverse

struct RouteDecision {
  Route route = Route::kEdge;
  double p_remote = 0;     // the classifier's probability that the edge answer is not good enough
  bool pii = false;        // the redactor found something in the prompt
  std::string domain;      // "chat", "arithmetic", "code", "business"
  double latency_ms = 0;   // the decision's own time (features + classifier)
};

// What the edge front asks (edge/router.h implements it with the trained
// classifier). Thread-safe: called from every HTTP worker at once.
class RoutePolicy {
 public:
  virtual ~RoutePolicy() = default;
  virtual RouteDecision Decide(const std::string& prompt_text) const = 0;
};

}  // namespace myriad::edge
