#include "serve/http/openai.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

namespace myriad::serve {

using nlohmann::json;

std::string ErrorJson(const ApiError& e) {
  json j = {{"error",
             {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
  // A message may quote the client's bytes (a JSON parse error does):
  // invalid UTF-8 becomes U+FFFD rather than an exception (and a 500).
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

ApiError ErrorForStatus(int status) {
  ApiError e;
  e.status = status;
  switch (status) {
    case 400: e.message = "bad request"; break;
    case 401:
      e.message = "missing or incorrect API key (hint: send the header 'Authorization: Bearer <key>')";
      e.code = "invalid_api_key";
      break;
    case 404: e.message = "no such route (hint: POST /v1/chat/completions, POST /v1/completions, GET /v1/models)";
      e.code = "not_found";
      break;
    case 405: e.message = "method not allowed on this route"; e.code = "method_not_allowed"; break;
    case 413: e.message = "request body too large (hint: the server's --max-body-bytes)"; e.code = "payload_too_large"; break;
    case 429: e.message = "the server is busy: its request queue is full (hint: retry after the Retry-After seconds)";
      e.type = "rate_limit_error"; e.code = "queue_full";
      break;
    case 503: e.message = "the server is shutting down"; e.type = "server_error"; e.code = "unavailable"; break;
    default:
      e.message = "HTTP " + std::to_string(status);
      e.type = status >= 500 ? "server_error" : "invalid_request_error";
  }
  return e;
}

namespace {

// Field readers: absent and null mean "keep the default"; a wrong type or a
// value out of range sets *err and returns false.
class Fields {
 public:
  Fields(const json& obj, ApiError* err) : obj_(obj), err_(err) {}

  const json* Get(const char* name) const {
    auto it = obj_.find(name);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool Fail(const std::string& param, const std::string& message) {
    err_->status = 400;
    err_->param = param;
    err_->message = message;
    return false;
  }
  bool Number(const char* name, double lo, double hi, float* out) {
    const json* v = Get(name);
    if (!v) return true;
    if (!v->is_number()) return Fail(name, std::string("'") + name + "' must be a number, got " + v->dump());
    double d = v->get<double>();
    if (!(d >= lo && d <= hi))
      return Fail(name, std::string("'") + name + "' = " + v->dump() + " is out of range [" + Fmt(lo) + ", " +
                            Fmt(hi) + "]");
    *out = static_cast<float>(d);
    return true;
  }
  bool Int(const char* name, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
    const json* v = Get(name);
    if (!v) return true;
    if (!v->is_number_integer())
      return Fail(name, std::string("'") + name + "' must be an integer, got " + v->dump());
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return Fail(name, std::string("'") + name + "' is too large");
    int64_t i = v->get<int64_t>();
    if (i < lo || i > hi)
      return Fail(name, std::string("'") + name + "' = " + v->dump() + " is out of range [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]");
    *out = i;
    return true;
  }
  bool Bool(const char* name, bool* out) {
    const json* v = Get(name);
    if (!v) return true;
    if (!v->is_boolean()) return Fail(name, std::string("'") + name + "' must be a boolean, got " + v->dump());
    *out = v->get<bool>();
    return true;
  }

 private:
  static std::string Fmt(double d) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", d);
    return b;
  }
  const json& obj_;
  ApiError* err_;
};

bool ParseContent(const json& v, size_t i, std::string* out, Fields* f) {
  std::string param = "messages[" + std::to_string(i) + "].content";
  if (v.is_null()) return true;
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_array()) {
    for (const auto& part : v) {
      if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
          !part["text"].is_string())
        return f->Fail(param, "'" + param + "' parts must be {\"type\": \"text\", \"text\": \"...\"} (only text is supported)");
      *out += part["text"].get<std::string>();
    }
    return true;
  }
  return f->Fail(param, "'" + param + "' must be a string or an array of text parts, got " + v.dump());
}

}  // namespace

bool ParseCompletionRequest(const std::string& body, Endpoint endpoint, CompletionRequest* out, ApiError* err) {
  *out = CompletionRequest();
  out->endpoint = endpoint;
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (406: 1e999)
    err->status = 400;
    err->message = std::string("the body is not valid JSON: ") + e.what() +
                   " (hint: send Content-Type: application/json with a JSON object)";
    err->code = "invalid_json";
    return false;
  }
  Fields f(j, err);
  if (!j.is_object()) return f.Fail("", "the body must be a JSON object, got " + std::string(j.type_name()));

  const json* model = f.Get("model");
  if (!model) return f.Fail("model", "missing required field 'model' (hint: GET /v1/models lists it)");
  if (!model->is_string()) return f.Fail("model", "'model' must be a string, got " + model->dump());
  out->model = model->get<std::string>();

  if (endpoint == Endpoint::kChat) {
    const json* msgs = f.Get("messages");
    if (!msgs) return f.Fail("messages", "missing required field 'messages'");
    if (!msgs->is_array() || msgs->empty())
      return f.Fail("messages", "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    for (size_t i = 0; i < msgs->size(); ++i) {
      const json& m = (*msgs)[i];
      std::string p = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) return f.Fail(p, "'" + p + "' must be an object, got " + m.dump());
      auto role = m.find("role");
      if (role == m.end() || !role->is_string())
        return f.Fail(p + ".role", "'" + p + ".role' must be a string (system, developer, user, assistant, tool)");
      ChatMessage cm;
      cm.role = role->get<std::string>();
      if (!ChatTemplate::KnownRole(cm.role))
        return f.Fail(p + ".role", "'" + p + ".role' = \"" + cm.role +
                                       "\" is not a known role (hint: system, developer, user, assistant, tool)");
      auto content = m.find("content");
      if (content == m.end() && cm.role != "assistant")
        return f.Fail(p + ".content", "missing required field '" + p + ".content'");
      if (content != m.end() && !ParseContent(*content, i, &cm.content, &f)) return false;
      out->messages.push_back(std::move(cm));
    }
    std::optional<int64_t> mt, mct;
    if (!f.Int("max_tokens", 1, INT32_MAX, &mt) || !f.Int("max_completion_tokens", 1, INT32_MAX, &mct)) return false;
    out->max_tokens = mct ? mct : mt;
    bool logprobs = false;
    std::optional<int64_t> top_logprobs;
    if (!f.Bool("logprobs", &logprobs) || !f.Int("top_logprobs", 0, kMaxChatTopLogprobs, &top_logprobs)) return false;
    if (top_logprobs && !logprobs)
      return f.Fail("top_logprobs", "'top_logprobs' requires 'logprobs': true");
    if (logprobs) out->logprobs = static_cast<int>(top_logprobs.value_or(0));
    // Tool calling: a request that offers tools expects calls back; serving
    // it as plain text would silently break the client's loop.
    const std::string no_tools = "tool calling is not supported by this server";
    for (const char* name : {"tools", "functions"})
      if (const json* t = f.Get(name); t && !(t->is_array() && t->empty()))
        return f.Fail(name, no_tools + " ('" + name + "' must be absent or empty)");
    for (const char* name : {"tool_choice", "function_call"})
      if (const json* t = f.Get(name); t && *t != "none")
        return f.Fail(name, no_tools + " ('" + name + "' may only be \"none\")");
    if (const json* rf = f.Get("response_format"); rf && !(rf->is_object() && rf->value("type", json()) == "text"))
      return f.Fail("response_format", "only response_format {\"type\": \"text\"} is supported "
                                       "(structured output, json_object and json_schema, is not)");
    if (f.Get("audio")) return f.Fail("audio", "audio output is not supported by this server");
    if (const json* m = f.Get("modalities"); m && *m != json::array({"text"}))
      return f.Fail("modalities", "only 'modalities': [\"text\"] is supported, got " + m->dump());
    if (f.Get("prediction")) return f.Fail("prediction", "'prediction' (predicted outputs) is not supported by this server");
  } else {
    const json* prompt = f.Get("prompt");
    if (!prompt) return f.Fail("prompt", "missing required field 'prompt'");
    const json* p = prompt;
    if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) p = &(*p)[0];
    if (p->is_string()) {
      out->prompt_text = p->get<std::string>();
    } else if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const json& t) {
                 return t.is_number_integer();
               })) {
      out->prompt_is_tokens = true;
      for (const auto& t : *p) {
        int64_t id = t.get<int64_t>();
        if (id < 0 || id > INT32_MAX) return f.Fail("prompt", "'prompt' token id " + t.dump() + " is out of range");
        out->prompt_tokens.push_back(static_cast<int32_t>(id));
      }
    } else {
      return f.Fail("prompt", "'prompt' must be a string, an array of one string, or an array of token ids "
                              "(hint: one prompt per request)");
    }
    std::optional<int64_t> mt;
    if (!f.Int("max_tokens", 0, INT32_MAX, &mt)) return false;
    out->max_tokens = mt ? mt : std::optional<int64_t>(16);  // OpenAI's default for completions
    if (!f.Bool("echo", &out->echo)) return false;
    std::optional<int64_t> logprobs;
    if (!f.Int("logprobs", 0, kMaxCompletionLogprobs, &logprobs)) return false;
    if (logprobs) out->logprobs = static_cast<int>(*logprobs);
    // echo with logprobs scores the prompt: its tokens' log-probabilities
    // come first in choices[].logprobs (the first token's are null), and
    // max_tokens may then be 0 (score only).
    if (*out->max_tokens == 0 && !(out->echo && logprobs))
      return f.Fail("max_tokens", "'max_tokens' must be at least 1 (0 only with 'echo': true and 'logprobs', "
                                  "which scores the prompt)");
    std::optional<int64_t> best_of;
    if (!f.Int("best_of", 1, 1, &best_of)) return false;
    if (const json* s = f.Get("suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
      return f.Fail("suffix", "'suffix' is not supported by this server");
  }

  std::optional<int64_t> n, top_k, seed;
  if (!f.Int("n", 1, INT32_MAX, &n)) return false;
  if (n && *n > 1) return f.Fail("n", "'n' = " + std::to_string(*n) + ": only n=1 is supported by this server");
  // Penalties and biases change the distribution; ignoring them would give
  // other output than asked for.
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    float v = 0.f;
    if (!f.Number(name, -2.0, 2.0, &v)) return false;
    if (v != 0.f) return f.Fail(name, std::string("'") + name + "' is not supported by this server (only 0)");
  }
  if (const json* lb = f.Get("logit_bias"); lb && !(lb->is_object() && lb->empty()))
    return f.Fail("logit_bias", "'logit_bias' is not supported by this server (only an empty object)");
  if (!f.Number("temperature", 0.0, 2.0, &out->temperature)) return false;
  if (!f.Number("top_p", 0.0, 1.0, &out->top_p)) return false;
  if (!f.Int("top_k", 0, 1 << 30, &top_k)) return false;
  if (top_k) out->top_k = static_cast<int>(*top_k);
  if (const json* s = f.Get("seed")) {
    if (!s->is_number_integer()) return f.Fail("seed", "'seed' must be an integer, got " + s->dump());
    out->seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  if (const json* s = f.Get("stop")) {
    if (s->is_string()) {
      out->stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const auto& x : *s) {
        if (!x.is_string()) return f.Fail("stop", "'stop' entries must be strings, got " + x.dump());
        out->stop.push_back(x.get<std::string>());
      }
    } else {
      return f.Fail("stop", "'stop' must be a string or an array of strings, got " + s->dump());
    }
    if (out->stop.size() > static_cast<size_t>(kMaxStops))
      return f.Fail("stop", "'stop' has " + std::to_string(out->stop.size()) + " entries, at most " +
                                std::to_string(kMaxStops) + " are allowed");
    for (const auto& x : out->stop)
      if (x.empty()) return f.Fail("stop", "'stop' strings must not be empty");
  }
  if (!f.Bool("stream", &out->stream)) return false;
  if (out->stream && out->echo && out->logprobs >= 0)
    return f.Fail("echo", "'echo' with 'logprobs' (scoring the prompt) is not supported when streaming "
                          "(hint: 'stream': false)");
  if (const json* so = f.Get("stream_options")) {
    if (!out->stream) return f.Fail("stream_options", "'stream_options' is only allowed when 'stream' is true");
    if (!so->is_object()) return f.Fail("stream_options", "'stream_options' must be an object, got " + so->dump());
    Fields sf(*so, err);
    if (!sf.Bool("include_usage", &out->include_usage)) {
      err->param = "stream_options.include_usage";
      return false;
    }
  }
  // top_p = 0 keeps only the most likely token: greedy.
  if (out->top_p == 0.0f) {
    out->temperature = 0.0f;
    out->top_p = 1.0f;
  }
  return true;
}

json UsageJson(const Usage& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  if (u.draft_steps > 0)
    j["speculative"] = {{"verifications", u.draft_steps},
                        {"draft_tokens", u.draft_proposed},
                        {"accepted_tokens", u.draft_accepted},
                        {"acceptance_rate", u.draft_proposed ? double(u.draft_accepted) / u.draft_proposed : 0.0},
                        {"mean_accepted_length",
                         double(u.draft_accepted + u.draft_steps) / static_cast<double>(u.draft_steps)}};
  return j;
}

json CostJson(const RequestCost& c, const std::string& currency) {
  return {{"currency", currency},
          {"input_cache_miss", c.input_cache_miss},
          {"input_cache_hit", c.input_cache_hit},
          {"output", c.output},
          {"total", c.total()}};
}

namespace {
json Base(const ResponseMeta& m, const char* chat_object, const char* completion_object) {
  json j = {{"id", m.id},
            {"object", m.endpoint == Endpoint::kChat ? chat_object : completion_object},
            {"created", m.created},
            {"model", m.model},
            {"system_fingerprint", nullptr}};
  if (!m.route.empty()) j["route"] = m.route;
  return j;
}
json Reason(const std::string& r) { return r.empty() ? json(nullptr) : json(r); }
}  // namespace

namespace {
json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
}  // namespace

json LogprobsJson(Endpoint ep, const std::vector<TokenLogprob>& tokens) {
  if (ep == Endpoint::kChat) {
    json content = json::array();
    for (const TokenLogprob& t : tokens) {
      json top = json::array();
      for (const auto& [tok, lp] : t.top) top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", Bytes(tok)}});
      content.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", Bytes(t.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  json ids = json::array(), top_ids = json::array();
  for (const TokenLogprob& t : tokens) {
    toks.push_back(t.token);
    offsets.push_back(t.text_offset);
    ids.push_back(t.id);
    if (!t.scored) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      top_ids.push_back(nullptr);
      continue;
    }
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [tok, lp] : t.top) top[tok] = lp;
    top[t.token] = t.logprob;  // the chosen token is always there (up to logprobs + 1 entries)
    tops.push_back(top);
    json by_id = json::array();
    for (const auto& [id, lp] : t.top_ids) by_id.push_back({id, lp});
    top_ids.push_back(by_id);
  }
  return {{"tokens", toks},        {"token_logprobs", lps}, {"top_logprobs", tops},
          {"text_offset", offsets}, {"token_ids", ids},      {"top_logprobs_ids", top_ids}};
}

json ResponseJson(const ResponseMeta& m, const std::string& text, const std::string& finish_reason, const Usage& u,
                  const json& cost, const json& logprobs) {
  json j = Base(m, "chat.completion", "text_completion");
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", Reason(finish_reason)}};
  if (m.endpoint == Endpoint::kChat)
    choice["message"] = {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}};
  else
    choice["text"] = text;
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(u);
  if (!cost.is_null()) j["cost"] = cost;
  return j;
}

json ChunkJson(const ResponseMeta& m, const std::string& text, bool with_role, const std::string& finish_reason,
               const json& logprobs) {
  json j = Base(m, "chat.completion.chunk", "text_completion");
  json choice = {{"index", 0}, {"logprobs", logprobs}, {"finish_reason", Reason(finish_reason)}};
  if (m.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (with_role) delta["role"] = "assistant";
    if (!text.empty() || with_role) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  return j;
}

json UsageChunkJson(const ResponseMeta& m, const Usage& u, const json& cost) {
  json j = Base(m, "chat.completion.chunk", "text_completion");
  j["choices"] = json::array();
  j["usage"] = UsageJson(u);
  if (!cost.is_null()) j["cost"] = cost;
  return j;
}

std::string SseData(const json& j) {
  // error_handler_t::replace: invalid UTF-8 never aborts a stream.
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string StopTextFilter::Push(const std::string& text) {
  if (stopped_) return {};
  held_ += text;
  size_t first = std::string::npos;
  for (const auto& s : stops_) {
    size_t p = held_.find(s);
    if (p != std::string::npos && p < first) first = p;
  }
  if (first != std::string::npos) {
    std::string out = held_.substr(0, first);
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopTextFilter::Flush() {
  std::string out;
  out.swap(held_);
  return stopped_ ? std::string() : out;
}

}  // namespace myriad::serve
