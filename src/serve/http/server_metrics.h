// What the HTTP front reports about itself: GET /metrics (Prometheus text
// exposition) and the human-readable totals logged at shutdown, both from
// one snapshot of the engine's and the server's counters.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "serve/billing.h"
#include "serve/engine.h"
#include "serve/http/server.h"

namespace myriad::serve {

struct ServerSnapshot {
  EngineStats engine;
  ServerCounters counters;
  std::map<int, int64_t> responses_by_status;  // HTTP status -> responses
  BillingLedger::Totals billing;
  PriceTable prices;
};

std::string PrometheusText(const ServerSnapshot& s);  // GET /metrics
std::string SummaryText(const ServerSnapshot& s);     // the shutdown log's totals

}  // namespace myriad::serve
