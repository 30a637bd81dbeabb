#include "serve/billing.h"

#include <algorithm>
#include <cstdio>

#include "core/config.h"

namespace myriad::serve {

Status PriceTable::Validate() const {
  auto check = [](const char* name, double v) -> Status {
    if (!(v >= 0) || v > 1e9)
      return Status::Error(std::string("prices.") + name + "=" + std::to_string(v) +
                           " is not a price (hint: a number >= 0, per million tokens)");
    return Status::Ok();
  };
  RETURN_IF_ERROR(check("input_cache_miss", input_cache_miss));
  RETURN_IF_ERROR(check("input_cache_hit", input_cache_hit));
  RETURN_IF_ERROR(check("output", output));
  if (currency.empty()) return Status::Error("prices.currency is empty (hint: e.g. \"USD\")");
  return Status::Ok();
}

Result<PriceTable> PriceTable::OverriddenFromToml(const std::string& path) const {
  ASSIGN_OR_RETURN(auto doc, ConfigDoc::Load(path));
  PriceTable p = *this;
  p.input_cache_miss = doc->GetFloat("prices.input_cache_miss", p.input_cache_miss);
  p.input_cache_hit = doc->GetFloat("prices.input_cache_hit", p.input_cache_hit);
  p.output = doc->GetFloat("prices.output", p.output);
  p.currency = doc->GetString("prices.currency", p.currency);
  RETURN_IF_ERROR(doc->Finish());
  RETURN_IF_ERROR(p.Validate().With(path));
  return p;
}

RequestCost PriceRequest(const PriceTable& prices, int64_t prompt_tokens, int64_t cached_tokens,
                         int64_t completion_tokens) {
  RequestCost c;
  c.hit_tokens = std::clamp<int64_t>(cached_tokens, 0, std::max<int64_t>(prompt_tokens, 0));
  c.miss_tokens = std::max<int64_t>(prompt_tokens, 0) - c.hit_tokens;
  c.output_tokens = std::max<int64_t>(completion_tokens, 0);
  c.input_cache_miss = c.miss_tokens * prices.input_cache_miss / 1e6;
  c.input_cache_hit = c.hit_tokens * prices.input_cache_hit / 1e6;
  c.output = c.output_tokens * prices.output / 1e6;
  return c;
}

RequestCost BillingLedger::Charge(int64_t prompt_tokens, int64_t cached_tokens, int64_t completion_tokens) {
  RequestCost c = PriceRequest(prices_, prompt_tokens, cached_tokens, completion_tokens);
  std::lock_guard<std::mutex> lock(mu_);
  totals_.requests++;
  totals_.cost.miss_tokens += c.miss_tokens;
  totals_.cost.hit_tokens += c.hit_tokens;
  totals_.cost.output_tokens += c.output_tokens;
  totals_.cost.input_cache_miss += c.input_cache_miss;
  totals_.cost.input_cache_hit += c.input_cache_hit;
  totals_.cost.output += c.output;
  return c;
}

BillingLedger::Totals BillingLedger::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

std::string FormatMoney(double amount, const std::string& currency) {
  char buf[64];
  if (currency == "USD")
    std::snprintf(buf, sizeof buf, "$%.6f", amount);
  else
    std::snprintf(buf, sizeof buf, "%.6f %s", amount, currency.c_str());
  return buf;
}

}  // namespace myriad::serve
