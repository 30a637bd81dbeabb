#include "edge/edge_front.h"

#include <chrono>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "serve/http/client.h"

namespace myriad::edge {
namespace {

using nlohmann::json;
using serve::Endpoint;
using serve::FrontReply;

constexpr const char* kRouteHeader = "X-Myriad-Route";
constexpr const char* kFallbackHeader = "X-Myriad-Route-Fallback";

FrontReply JsonReply(int status, const json& body, const std::string& route) {
  FrontReply r;
  r.status = status;
  r.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  r.headers.emplace_back(kRouteHeader, route);
  return r;
}

FrontReply BadRoute(const std::string& message) {
  serve::ApiError e = serve::ErrorForStatus(400);
  e.message = message;
  e.param = "route";
  FrontReply r;
  r.status = 400;
  r.body = serve::ErrorJson(e);
  return r;
}

// The restored text of one choice (chat: message or delta content;
// completions: text), in place.
std::string* ChoiceText(json& choice, Endpoint ep, bool delta) {
  if (ep == Endpoint::kCompletion) {
    auto it = choice.find("text");
    return it != choice.end() && it->is_string() ? it->get_ptr<std::string*>() : nullptr;
  }
  auto m = choice.find(delta ? "delta" : "message");
  if (m == choice.end() || !m->is_object()) return nullptr;
  auto c = m->find("content");
  return c != m->end() && c->is_string() ? c->get_ptr<std::string*>() : nullptr;
}

// One SSE stream from the cloud, event by event, restored on the way (the
// collaborative route) and marked with the route.
class StreamRelay {
 public:
  StreamRelay(Endpoint ep, std::string route, std::shared_ptr<Vault> vault, bool client_wants_usage)
      : ep_(ep), route_(std::move(route)), vault_(std::move(vault)), want_usage_(client_wants_usage) {
    if (vault_) restorer_ = std::make_unique<StreamRestorer>(vault_.get());
  }

  // Bytes from the cloud in; the events to send to the client out (whole
  // events only; a partial one waits for its end).
  std::string Push(const std::string& bytes) {
    buf_ += bytes;
    std::string out;
    size_t end;
    while ((end = buf_.find("\n\n")) != std::string::npos) {
      std::string event = buf_.substr(0, end);
      buf_.erase(0, end + 2);
      out += Event(event);
    }
    return out;
  }
  bool done() const { return done_; }
  json usage() const { return usage_; }
  const std::vector<std::string>& unresolved() const {
    static const std::vector<std::string> none;
    return restorer_ ? restorer_->unresolved() : none;
  }

 private:
  std::string Event(const std::string& event) {
    if (event.rfind("data: ", 0) != 0) return event + "\n\n";  // a comment (keep-alive) or other field
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      done_ = true;
      return event + "\n\n";
    }
    json j = json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return event + "\n\n";
    if (j.contains("usage") && j["usage"].is_object()) usage_ = j["usage"];
    auto choices = j.find("choices");
    if (choices != j.end() && choices->is_array() && choices->empty() && j.contains("usage") && !want_usage_)
      return "";  // the usage chunk the edge asked for itself
    if (choices != j.end() && choices->is_array()) {
      for (json& choice : *choices) {
        std::string* text = ChoiceText(choice, ep_, true);
        const bool finished = choice.contains("finish_reason") && !choice["finish_reason"].is_null();
        if (restorer_) {
          std::string restored = text ? restorer_->Push(*text) : "";
          if (finished) restored += restorer_->Finish();
          if (text) {
            *text = restored;
          } else if (!restored.empty()) {
            if (ep_ == Endpoint::kCompletion) choice["text"] = restored;
            else choice["delta"]["content"] = restored;
          }
          if (finished && !restorer_->unresolved().empty())
            j["restore"] = {{"unresolved", restorer_->unresolved()}};
        }
      }
    }
    j["route"] = route_;
    return serve::SseData(j);
  }

  Endpoint ep_;
  std::string route_;
  std::shared_ptr<Vault> vault_;
  std::unique_ptr<StreamRestorer> restorer_;
  bool want_usage_;
  std::string buf_;
  bool done_ = false;
  json usage_;
};

}  // namespace

std::string RoutingText(const serve::CompletionRequest& cr) {
  if (cr.endpoint == Endpoint::kCompletion) return cr.prompt_text;
  std::string s;
  for (const auto& m : cr.messages) {
    if (!s.empty()) s += "\n";
    s += m.content;
  }
  return s;
}

EdgeFront::EdgeFront(EdgeFrontConfig cfg, const Redactor* redactor, const RoutePolicy* policy)
    : cfg_(std::move(cfg)), redactor_(redactor), policy_(policy), cloud_model_(cfg_.cloud_model) {}

Result<std::string> EdgeFront::CloudModel() {
  std::lock_guard<std::mutex> lock(model_mu_);
  if (!cloud_model_.empty()) return cloud_model_;
  ASSIGN_OR_RETURN(serve::HttpReply r, serve::HttpCall(cfg_.cloud_url + "/v1/models", "GET", "",
                                                       cfg_.connect_timeout_s, cfg_.cloud_api_key));
  json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || !j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return Status::Error("GET " + cfg_.cloud_url + "/v1/models: HTTP " + std::to_string(r.status) +
                         ", no model id in the answer (hint: name it with --cloud-model)");
  cloud_model_ = j["data"][0]["id"].get<std::string>();
  LOG_INFO("edge: the cloud at %s serves '%s'", cfg_.cloud_url.c_str(), cloud_model_.c_str());
  return cloud_model_;
}

EdgeFront::Counters EdgeFront::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return c_;
}

void EdgeFront::KeepLocal(serve::LocalRoute* local, const std::string& fallback_reason) {
  local->route = RouteName(Route::kEdge);
  local->headers.emplace_back(kRouteHeader, local->route);
  if (!fallback_reason.empty()) {
    local->headers.emplace_back(kFallbackHeader, fallback_reason);
    std::lock_guard<std::mutex> lock(mu_);
    c_.fallbacks++;
  }
}

void EdgeFront::LocalDone(const serve::LocalRoute& route, const serve::Usage& usage) {
  (void)route;
  // What the cloud would have charged for this request (the edge's token
  // counts stand in for the cloud tokenizer's).
  const serve::RequestCost c = serve::PriceRequest(cfg_.cloud_prices, usage.prompt_tokens, 0, usage.completion_tokens);
  std::lock_guard<std::mutex> lock(mu_);
  c_.cost_saved += c.total();
}

void EdgeFront::CountCloudUsage(const json& usage) {
  if (!usage.is_object()) return;
  const int64_t p = usage.value("prompt_tokens", int64_t{0});
  const int64_t c = usage.value("completion_tokens", int64_t{0});
  const serve::RequestCost cost = serve::PriceRequest(cfg_.cloud_prices, p, 0, c);
  std::lock_guard<std::mutex> lock(mu_);
  c_.cloud_prompt_tokens += p;
  c_.cloud_completion_tokens += c;
  c_.cloud_cost += cost.total();
}

std::optional<FrontReply> EdgeFront::Handle(Endpoint ep, const serve::CompletionRequest& cr, const std::string& body,
                                            const std::function<bool()>& peer_gone, serve::LocalRoute* local) {
  (void)peer_gone;
  json req = json::parse(body, nullptr, false);  // parsed once already: valid
  std::string pin = "auto";
  if (req.is_object() && req.contains("route")) {
    if (!req["route"].is_string())
      return BadRoute("'route' must be one of \"auto\", \"edge\", \"collaborative\", \"cloud\"");
    pin = req["route"].get<std::string>();
    if (pin != "auto" && !ParseRoute(pin))
      return BadRoute("'route' is '" + pin + "' (hint: one of \"auto\", \"edge\", \"collaborative\", \"cloud\")");
  }
  RouteDecision d;
  if (pin != "auto") {
    d.route = *ParseRoute(pin);
    std::lock_guard<std::mutex> lock(mu_);
    c_.pinned++;
  } else if (policy_) {
    const auto t0 = std::chrono::steady_clock::now();
    d = policy_->Decide(RoutingText(cr));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    c_.decide_ms_sum += ms;
    c_.decisions++;
  }
  // A prompt of token ids cannot be desensitised: it stays on the device.
  if (d.route == Route::kCollaborative && ep == Endpoint::kCompletion && cr.prompt_is_tokens) d.route = Route::kEdge;
  if (d.route != Route::kEdge && cfg_.cloud_url.empty()) d.route = Route::kEdge;
  if (d.route == Route::kEdge) {
    KeepLocal(local, "");
    std::lock_guard<std::mutex> lock(mu_);
    c_.routes[static_cast<int>(Route::kEdge)]++;
    return std::nullopt;
  }

  // The request the cloud sees.
  const bool collaborative = d.route == Route::kCollaborative;
  const std::string route = RouteName(d.route);
  auto vault = collaborative ? std::make_shared<Vault>() : nullptr;
  std::map<std::string, int64_t> redacted;
  auto redact = [&](const std::string& text) {
    Redaction r = redactor_->Redact(text, vault.get());
    for (const Span& s : r.spans) redacted[EntityTypeName(s.type)]++;
    return r.text;
  };
  auto fall_back = [&](const std::string& why) {
    LOG_WARN("edge: the cloud could not answer (%s); answering on the edge", why.c_str());
    KeepLocal(local, "cloud unavailable: " + why);
    std::lock_guard<std::mutex> lock(mu_);
    c_.routes[static_cast<int>(Route::kEdge)]++;
  };
  auto cloud_model = CloudModel();
  if (!cloud_model.ok()) {
    fall_back(cloud_model.status().message());
    return std::nullopt;
  }
  json fwd = req;
  fwd.erase("route");
  fwd["model"] = *cloud_model;
  if (collaborative) {
    if (ep == Endpoint::kChat) {
      json msgs = json::array();
      for (const auto& m : cr.messages) msgs.push_back({{"role", m.role}, {"content", redact(m.content)}});
      fwd["messages"] = msgs;
    } else {
      fwd["prompt"] = redact(cr.prompt_text);
    }
  }
  if (cr.stream) fwd["stream_options"]["include_usage"] = true;
  const std::string url = cfg_.cloud_url + (ep == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions");
  const std::string fwd_body = fwd.dump(-1, ' ', false, json::error_handler_t::replace);
  auto count_route = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    c_.routes[static_cast<int>(d.route)]++;
    for (const auto& [type, n] : redacted) c_.redactions[type] += n;
  };
  auto retryable = [](int status) { return status >= 500 || status == 429; };

  if (!cr.stream) {
    auto reply = serve::HttpCall(url, "POST", fwd_body, cfg_.connect_timeout_s + cfg_.idle_timeout_s,
                                 cfg_.cloud_api_key);
    if (!reply.ok()) {
      fall_back(reply.status().message());
      return std::nullopt;
    }
    if (retryable(reply->status)) {
      fall_back("HTTP " + std::to_string(reply->status));
      return std::nullopt;
    }
    json j = json::parse(reply->body, nullptr, false);
    if (reply->status != 200 || !j.is_object()) {
      FrontReply r;
      r.status = reply->status == 200 ? 502 : reply->status;
      r.body = reply->status == 200 ? serve::ErrorJson(serve::ErrorForStatus(502)) : reply->body;
      r.headers.emplace_back(kRouteHeader, route);
      return r;
    }
    count_route();
    CountCloudUsage(j.value("usage", json()));
    std::vector<std::string> unresolved;
    if (collaborative && j.contains("choices") && j["choices"].is_array()) {
      for (json& choice : j["choices"]) {
        std::string* text = ChoiceText(choice, ep, false);
        if (!text) continue;
        Restored back = Restore(*text, *vault);
        *text = back.text;
        for (auto& u : back.unresolved) unresolved.push_back(u);
      }
    }
    j["route"] = route;
    j["model"] = cr.model;
    if (collaborative) j["redactions"] = redacted;
    if (!unresolved.empty()) {
      j["restore"] = {{"unresolved", unresolved}};
      std::lock_guard<std::mutex> lock(mu_);
      c_.restore_unresolved += static_cast<int64_t>(unresolved.size());
    }
    return JsonReply(200, j, route);
  }

  auto call = serve::HttpStreamCall::Open(url, fwd_body, cfg_.connect_timeout_s, cfg_.cloud_api_key);
  if (!call.ok()) {
    fall_back(call.status().message());
    return std::nullopt;
  }
  std::shared_ptr<serve::HttpStreamCall> upstream = std::move(call).value();
  if (upstream->status() != 200) {
    std::string err_body;
    while (true) {
      auto more = upstream->Read(&err_body, cfg_.idle_timeout_s);
      if (!more.ok() || !*more) break;
    }
    if (retryable(upstream->status())) {
      fall_back("HTTP " + std::to_string(upstream->status()));
      return std::nullopt;
    }
    FrontReply r;
    r.status = upstream->status();
    r.body = err_body;
    r.headers.emplace_back(kRouteHeader, route);
    return r;
  }
  count_route();
  FrontReply r;
  r.content_type = "text/event-stream";
  r.headers.emplace_back(kRouteHeader, route);
  r.headers.emplace_back("Cache-Control", "no-cache");
  const double idle = cfg_.idle_timeout_s;
  r.stream = [this, upstream, ep, route, vault, want_usage = cr.include_usage,
              idle](const std::function<bool(const std::string&)>& write) {
    StreamRelay relay(ep, route, vault, want_usage);
    bool ok = true;
    std::string bytes;
    while (ok && !relay.done()) {
      bytes.clear();
      auto more = upstream->Read(&bytes, idle);
      if (!more.ok() || !*more) {
        // The cloud failed mid-answer: an error event, then the end.
        serve::ApiError e = serve::ErrorForStatus(502);
        e.message = "the cloud's stream ended early: " + (more.ok() ? std::string("no [DONE]") : more.status().message());
        write("data: " + serve::ErrorJson(e) + "\n\n" + serve::kSseDone);
        break;
      }
      const std::string out = relay.Push(bytes);
      if (!out.empty()) ok = write(out);
    }
    upstream->Close();  // a client gone: the cloud sees its connection close and cancels
    CountCloudUsage(relay.usage());
    if (!relay.unresolved().empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      c_.restore_unresolved += static_cast<int64_t>(relay.unresolved().size());
    }
  };
  return r;
}

std::string EdgeFront::MetricsText() {
  const Counters c = counters();
  std::string s;
  char line[256];
  s += "# HELP myriad_edge_route_requests_total Completion requests by the route that answered them.\n"
       "# TYPE myriad_edge_route_requests_total counter\n";
  for (int r = 0; r < 3; ++r) {
    std::snprintf(line, sizeof line, "myriad_edge_route_requests_total{route=\"%s\"} %lld\n",
                  RouteName(static_cast<Route>(r)), static_cast<long long>(c.routes[r]));
    s += line;
  }
  std::snprintf(line, sizeof line,
                "# HELP myriad_edge_route_fallbacks_total Requests answered on the edge because the cloud could not.\n"
                "# TYPE myriad_edge_route_fallbacks_total counter\nmyriad_edge_route_fallbacks_total %lld\n",
                static_cast<long long>(c.fallbacks));
  s += line;
  std::snprintf(line, sizeof line,
                "# HELP myriad_edge_route_pinned_total Requests that chose their route.\n"
                "# TYPE myriad_edge_route_pinned_total counter\nmyriad_edge_route_pinned_total %lld\n",
                static_cast<long long>(c.pinned));
  s += line;
  s += "# HELP myriad_edge_redactions_total Spans desensitised before a request left the device, by type.\n"
       "# TYPE myriad_edge_redactions_total counter\n";
  for (int t = 0; t < kNumEntityTypes; ++t) {
    const char* name = EntityTypeName(static_cast<EntityType>(t));
    auto it = c.redactions.find(name);
    std::snprintf(line, sizeof line, "myriad_edge_redactions_total{type=\"%s\"} %lld\n", name,
                  static_cast<long long>(it == c.redactions.end() ? 0 : it->second));
    s += line;
  }
  std::snprintf(line, sizeof line,
                "# HELP myriad_edge_restore_unresolved_total Placeholders in cloud answers that named no vault entry.\n"
                "# TYPE myriad_edge_restore_unresolved_total counter\nmyriad_edge_restore_unresolved_total %lld\n",
                static_cast<long long>(c.restore_unresolved));
  s += line;
  s += "# HELP myriad_edge_cloud_tokens_total Tokens the cloud billed for forwarded requests.\n"
       "# TYPE myriad_edge_cloud_tokens_total counter\n";
  std::snprintf(line, sizeof line, "myriad_edge_cloud_tokens_total{kind=\"prompt\"} %lld\n",
                static_cast<long long>(c.cloud_prompt_tokens));
  s += line;
  std::snprintf(line, sizeof line, "myriad_edge_cloud_tokens_total{kind=\"completion\"} %lld\n",
                static_cast<long long>(c.cloud_completion_tokens));
  s += line;
  const std::string cur = cfg_.cloud_prices.currency;
  std::snprintf(line, sizeof line,
                "# HELP myriad_edge_cloud_cost_total Forwarded requests at the cloud's prices.\n"
                "# TYPE myriad_edge_cloud_cost_total counter\nmyriad_edge_cloud_cost_total{currency=\"%s\"} %.9f\n",
                cur.c_str(), c.cloud_cost);
  s += line;
  std::snprintf(line, sizeof line,
                "# HELP myriad_edge_cost_saved_total Edge-answered requests at the cloud's prices (saved against "
                "all-cloud).\n# TYPE myriad_edge_cost_saved_total counter\n"
                "myriad_edge_cost_saved_total{currency=\"%s\"} %.9f\n",
                cur.c_str(), c.cost_saved);
  s += line;
  std::snprintf(line, sizeof line,
                "# HELP myriad_edge_route_decision_seconds Time the router took to decide.\n"
                "# TYPE myriad_edge_route_decision_seconds summary\nmyriad_edge_route_decision_seconds_sum %.6f\n"
                "myriad_edge_route_decision_seconds_count %lld\n",
                c.decide_ms_sum / 1000, static_cast<long long>(c.decisions));
  s += line;
  return s;
}

}  // namespace myriad::edge
