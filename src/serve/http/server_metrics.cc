#include "serve/http/server_metrics.h"

#include <cmath>
#include <cstdio>

namespace myriad::serve {

namespace {

// Prometheus text exposition: "# HELP", "# TYPE", then samples.
class PromWriter {
 public:
  void Metric(const char* name, const char* type, const char* help) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void Sample(const std::string& name, double v, const std::string& labels = "") {
    char buf[64];
    if (std::abs(v) < 1e15 && v == static_cast<double>(static_cast<int64_t>(v)))
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    else
      std::snprintf(buf, sizeof buf, "%.9g", v);
    out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + buf + "\n";
  }
  void One(const char* name, const char* type, const char* help, double v) {
    Metric(name, type, help);
    Sample(name, v);
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

double HitRate(const EngineStats& s) {
  return s.prompt_tokens > 0 ? static_cast<double>(s.cached_tokens) / static_cast<double>(s.prompt_tokens) : 0.0;
}

}  // namespace

std::string PrometheusText(const ServerSnapshot& snap) {
  const EngineStats& es = snap.engine;
  const ServerCounters& sc = snap.counters;
  const std::map<int, int64_t>& by_status = snap.responses_by_status;
  const BillingLedger::Totals& bt = snap.billing;
  PromWriter w;
  w.One("myriad_requests_total", "counter", "Requests the engine accepted.", es.requests);
  w.One("myriad_requests_rejected_total", "counter", "Requests the engine refused (queue full).", es.rejected);
  w.One("myriad_requests_cancelled_total", "counter", "Requests cancelled (client gone or stop string).", es.cancelled);
  w.One("myriad_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", es.prompt_tokens);
  w.One("myriad_cached_tokens_total", "counter", "Prompt tokens served from the KV cache.", es.cached_tokens);
  w.One("myriad_completion_tokens_total", "counter", "Generated tokens.", es.completion_tokens);
  w.Metric("myriad_kv_hit_tokens_total", "counter", "Prompt tokens served per KV tier.");
  w.Sample("myriad_kv_hit_tokens_total", es.t0_hits, "tier=\"device\"");
  for (const auto& [tier, hits] : es.tier_hits) w.Sample("myriad_kv_hit_tokens_total", hits, "tier=\"" + tier + "\"");
  w.One("myriad_spec_verifications_total", "counter", "Decode steps of a request that verified a draft.",
        es.spec_steps);
  w.One("myriad_spec_emitted_tokens_total", "counter", "Tokens those verifications produced (accepted + one each).",
        es.spec_emitted);
  w.One("myriad_spec_mean_accepted_length", "gauge", "Tokens per verification (1: no gain).",
        es.spec_steps ? double(es.spec_emitted) / es.spec_steps : 0.0);
  w.Metric("myriad_spec_draft_proposed_total", "counter", "Draft tokens verified, per draft position (from 1).");
  for (size_t i = 0; i < es.spec_proposed.size(); ++i)
    w.Sample("myriad_spec_draft_proposed_total", es.spec_proposed[i], "position=\"" + std::to_string(i + 1) + "\"");
  w.Metric("myriad_spec_draft_accepted_total", "counter", "Draft tokens accepted, per draft position (from 1).");
  for (size_t i = 0; i < es.spec_accepted.size(); ++i)
    w.Sample("myriad_spec_draft_accepted_total", es.spec_accepted[i], "position=\"" + std::to_string(i + 1) + "\"");
  w.Metric("myriad_spec_acceptance", "gauge", "Acceptance per draft position, given the one before it was accepted.");
  for (size_t i = 0; i < es.spec_proposed.size(); ++i)
    w.Sample("myriad_spec_acceptance", es.spec_proposed[i] ? double(es.spec_accepted[i]) / es.spec_proposed[i] : 0.0,
             "position=\"" + std::to_string(i + 1) + "\"");
  w.One("myriad_spec_off_steps_total", "counter", "Decode steps the cost model ran without drafts.", es.spec_off_steps);
  w.One("myriad_spec_draft_tokens", "gauge", "The last decode step's draft length.", es.spec_draft_tokens);
  w.One("myriad_kv_recomputed_hit_tokens_total", "counter", "Cached tokens the cost model chose to recompute.",
        es.recomputed_hit_tokens);
  w.One("myriad_kv_skipped_lookups_total", "counter",
        "Slow-tier lookups not made because no hit there could beat recomputing.", es.skipped_lookups);
  w.One("myriad_kv_late_lookups_total", "counter",
        "Remote-tier lookups not answered in time (a hung server): admitted without a remote hit.", es.late_lookups);
  w.One("myriad_prefix_cache_hit_rate", "gauge", "cached_tokens / prompt_tokens since start.", HitRate(es));
  w.One("myriad_requests_running", "gauge", "Sequences in the running batch.", es.running);
  w.One("myriad_requests_waiting", "gauge", "Requests waiting in the queue.", es.waiting);
  w.One("myriad_kv_blocks_used", "gauge", "KV blocks in use in the device pool.", es.kv_blocks_used);
  w.One("myriad_kv_blocks_total", "gauge", "KV blocks in the device pool.", es.kv_blocks_total);
  w.One("myriad_http_requests_total", "counter", "HTTP requests received.", sc.http_requests);
  w.Metric("myriad_http_responses_total", "counter", "HTTP responses by status code.");
  for (const auto& [code, count] : by_status) w.Sample("myriad_http_responses_total", count, "code=\"" + std::to_string(code) + "\"");
  w.One("myriad_http_rejected_busy_total", "counter", "Completions refused with 429.", sc.rejected_busy);
  w.One("myriad_http_completions_ok_total", "counter", "Completions finished (stop or length).", sc.completions_ok);
  w.One("myriad_http_completions_cancelled_total", "counter", "Completions whose client went away.",
        sc.completions_cancelled);
  w.One("myriad_http_completions_failed_total", "counter", "Completions that failed in the engine.",
        sc.completions_failed);
  const std::string cur = "currency=\"" + snap.prices.currency + "\"";
  w.One("myriad_billed_requests_total", "counter", "Requests billed.", bt.requests);
  w.Metric("myriad_billed_tokens_total", "counter", "Billed tokens by kind.");
  w.Sample("myriad_billed_tokens_total", bt.cost.miss_tokens, "kind=\"input_cache_miss\"");
  w.Sample("myriad_billed_tokens_total", bt.cost.hit_tokens, "kind=\"input_cache_hit\"");
  w.Sample("myriad_billed_tokens_total", bt.cost.output_tokens, "kind=\"output\"");
  w.Metric("myriad_billed_cost_total", "counter", "Billed amount by kind, in the price table's currency.");
  w.Sample("myriad_billed_cost_total", bt.cost.input_cache_miss, "kind=\"input_cache_miss\"," + cur);
  w.Sample("myriad_billed_cost_total", bt.cost.input_cache_hit, "kind=\"input_cache_hit\"," + cur);
  w.Sample("myriad_billed_cost_total", bt.cost.output, "kind=\"output\"," + cur);
  w.Sample("myriad_billed_cost_total", bt.cost.total(), "kind=\"total\"," + cur);
  return std::move(w.str());
}

std::string SummaryText(const ServerSnapshot& snap) {
  const EngineStats& es = snap.engine;
  const ServerCounters& sc = snap.counters;
  const BillingLedger::Totals& bt = snap.billing;
  const PriceTable& p = snap.prices;
  auto money = [&](double v) { return FormatMoney(v, p.currency); };
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "requests: %lld accepted, %lld rejected (queue full), %lld cancelled; http: %lld requests, %lld "
                "completions ok, %lld client gone, %lld failed, %lld bad requests\n",
                (long long)es.requests, (long long)es.rejected, (long long)es.cancelled, (long long)sc.http_requests,
                (long long)sc.completions_ok, (long long)sc.completions_cancelled, (long long)sc.completions_failed,
                (long long)sc.bad_requests);
  s += buf;
  std::snprintf(buf, sizeof buf, "tokens: %lld prompt (%lld cached, hit rate %.1f%%), %lld generated\n",
                (long long)es.prompt_tokens, (long long)es.cached_tokens, 100.0 * HitRate(es),
                (long long)es.completion_tokens);
  s += buf;
  s += "kv hits (tokens): device " + std::to_string(es.t0_hits);
  for (const auto& [tier, hits] : es.tier_hits) s += ", " + tier + " " + std::to_string(hits);
  if (es.recomputed_hit_tokens) s += " (recomputed " + std::to_string(es.recomputed_hit_tokens) + ")";
  s += "\n";
  std::snprintf(buf, sizeof buf,
                "bill: %lld requests; input cache miss %lld tokens %s, input cache hit %lld tokens %s, output %lld "
                "tokens %s; total %s (prices per 1M tokens: miss %g, hit %g, output %g %s)\n",
                (long long)bt.requests, (long long)bt.cost.miss_tokens, money(bt.cost.input_cache_miss).c_str(),
                (long long)bt.cost.hit_tokens, money(bt.cost.input_cache_hit).c_str(),
                (long long)bt.cost.output_tokens, money(bt.cost.output).c_str(), money(bt.cost.total()).c_str(),
                p.input_cache_miss, p.input_cache_hit, p.output, p.currency.c_str());
  s += buf;
  return s;
}

}  // namespace myriad::serve
