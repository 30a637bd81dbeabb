// Billing: what a request costs, from a price table per million tokens, and
// the running totals that /metrics and the shutdown summary report.
//
// A request's prompt tokens split into cache hits (served from a KV tier)
// and misses (computed); hits are priced lower. Prices are in one currency
// (USD by default) per 1,000,000 tokens.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "core/status.h"

namespace myriad::serve {

struct PriceTable {
  double input_cache_miss = 0.9;  // per 1M prompt tokens computed
  double input_cache_hit = 0.08;  // per 1M prompt tokens served from the KV cache
  double output = 3.6;            // per 1M generated tokens
  std::string currency = "USD";

  // Reads a TOML file with a [prices] table: input_cache_miss, input_cache_hit,
  // output (numbers >= 0) and currency (string); absent keys keep the values
  // of `*this`. Unknown keys and negative prices are errors naming the key.
  Result<PriceTable> OverriddenFromToml(const std::string& path) const;
  Status Validate() const;
};

struct RequestCost {
  int64_t miss_tokens = 0, hit_tokens = 0, output_tokens = 0;
  double input_cache_miss = 0, input_cache_hit = 0, output = 0;  // currency units
  double total() const { return input_cache_miss + input_cache_hit + output; }
};

// prompt_tokens includes the cached ones (cached_tokens <= prompt_tokens;
// clamped if the engine ever reports more).
RequestCost PriceRequest(const PriceTable& prices, int64_t prompt_tokens, int64_t cached_tokens,
                         int64_t completion_tokens);

// Thread-safe running totals of every billed request.
class BillingLedger {
 public:
  explicit BillingLedger(PriceTable prices) : prices_(std::move(prices)) {}
  const PriceTable& prices() const { return prices_; }
  // Prices the request, adds it to the totals and returns its cost.
  RequestCost Charge(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens);
  struct Totals {
    int64_t requests = 0;
    RequestCost cost;  // sums
  };
  Totals totals() const;

 private:
  const PriceTable prices_;
  mutable std::mutex mu_;
  Totals totals_;
};

// "$0.000123" style (6 decimals; currency symbol only for USD).
std::string FormatMoney(double amount, const std::string& currency);

}  // namespace myriad::serve
