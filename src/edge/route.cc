#include "edge/route.h"

namespace myriad::edge {

const char* RouteName(Route r) {
  switch (r) {
    case Route::kEdge: return "edge";
    case Route::kCollaborative: return "collaborative";
    case Route::kCloud: return "cloud";
  }
  return "edge";
}

std::optional<Route> ParseRoute(std::string_view name) {
  if (name == "edge") return Route::kEdge;
  if (name == "collaborative") return Route::kCollaborative;
  if (name == "cloud") return Route::kCloud;
  return std::nullopt;
}

}  // namespace myriad::edge
