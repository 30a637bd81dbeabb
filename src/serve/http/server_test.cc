// The HTTP server against a fake engine, over real loopback HTTP: every
// route, streaming chunks, usage and billing, every kind of bad request,
// back-pressure, the API key, a client that goes away mid-stream, 64
// concurrent clients, pipelining, a chunked body over the limit, a slow head
// at the header deadline, requests cancelled at the drain timeout (those on raw
// sockets in server_connection_test.cc). (The pure parts are in
// openai_test.cc; tests/e2e/serve_http_hostile.sh does the hostile clients at
// full size against the real binary.)
#include "serve/http/server_test_util.h"

#include <thread>

namespace myriad::serve {
namespace {

using namespace server_test;  // NOLINT: the fixture's client, fake engine and helpers
using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_F(ServerTest, HealthModelsMetrics) {
  StartServer();
  auto c = Client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  json mj = json::parse(m->body);
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], "tiny-test");
  EXPECT_EQ(mj["data"][0]["object"], "model");
  auto one = c.Get("/v1/models/tiny-test");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  ExpectError(c.Get("/v1/models/gpt-4"), 404, "does not exist");
  auto met = c.Get("/metrics");
  ASSERT_TRUE(met);
  EXPECT_EQ(met->status, 200);
  for (const char* name : {"myriad_requests_total", "myriad_prompt_tokens_total", "myriad_cached_tokens_total",
                           "myriad_completion_tokens_total", "myriad_kv_hit_tokens_total{tier=\"device\"}",
                           "myriad_kv_hit_tokens_total{tier=\"host\"}", "myriad_prefix_cache_hit_rate",
                           "myriad_requests_running", "myriad_requests_waiting", "myriad_kv_blocks_used",
                           "myriad_kv_blocks_total 100", "myriad_billed_cost_total{kind=\"total\"",
                           "# TYPE myriad_requests_total counter"})
    EXPECT_NE(met->body.find(name), std::string::npos) << name << "\n" << met->body;
}

TEST_F(ServerTest, ChatNonStreaming) {
  StartServer();
  auto r = PostJson("/v1/chat/completions", Chat(7).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny-test");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], ReplyText(7));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // The prompt: eos, then the default template rendered and tokenized.
  std::vector<int32_t> want = {tok_->eos_id()};
  tok_->EncodeTo("<|system|>\nYou are helpful.\n<|user|>\nSay hello to the world.\n<|assistant|>\n", &want);
  const json& u = j["usage"];
  EXPECT_EQ(u["prompt_tokens"], want.size());
  EXPECT_EQ(u["completion_tokens"], 7);
  EXPECT_EQ(u["total_tokens"], want.size() + 7);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 0);
  // Cost: extra field and header, from the default prices.
  double expect = want.size() * 0.9 / 1e6 + 7 * 3.6 / 1e6;
  EXPECT_NEAR(j["cost"]["total"].get<double>(), expect, 1e-12);
  EXPECT_EQ(j["cost"]["currency"], "USD");
  EXPECT_NEAR(std::stod(r->get_header_value("X-Myriad-Cost")), expect, 1e-9);
  // Greedy params reached the engine.
  GenerationParams gp = engine_->last_params();
  EXPECT_EQ(gp.max_tokens, 7);
  EXPECT_EQ(gp.sampling.temperature, 0.f);
  ASSERT_FALSE(gp.stop_token_seqs.empty());
  EXPECT_EQ(gp.stop_token_seqs[0], std::vector<int32_t>{tok_->eos_id()});

  // The same request again shares whole blocks of its prompt.
  auto r2 = PostJson("/v1/chat/completions", Chat(7).dump());
  ASSERT_TRUE(r2);
  json j2 = json::parse(r2->body);
  EXPECT_EQ(j2["choices"][0]["message"]["content"], j["choices"][0]["message"]["content"]);
  EXPECT_GT(j2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  int64_t cached = j2["usage"]["prompt_tokens_details"]["cached_tokens"];
  double expect2 = (want.size() - cached) * 0.9 / 1e6 + cached * 0.08 / 1e6 + 7 * 3.6 / 1e6;
  EXPECT_NEAR(j2["cost"]["total"].get<double>(), expect2, 1e-12);
  // Totals in /metrics and the summary add both.
  BillingLedger::Totals t = server_->billing();
  EXPECT_EQ(t.requests, 2);
  EXPECT_NEAR(t.cost.total(), expect + expect2, 1e-12);
  EXPECT_EQ(t.cost.hit_tokens, cached);
  std::string summary = server_->Summary();
  EXPECT_NE(summary.find("hit rate"), std::string::npos) << summary;
  EXPECT_NE(summary.find("total $"), std::string::npos) << summary;
}

TEST_F(ServerTest, CompletionsAndEcho) {
  StartServer();
  auto r = PostJson("/v1/completions", R"({"model":"tiny-test","prompt":"The lazy dog","max_tokens":5,"seed":3})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["text"], ReplyText(5));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(engine_->last_params().seed, 3u);
  // Default max_tokens for completions is 16 (OpenAI's).
  r = PostJson("/v1/completions", R"({"model":"tiny-test","prompt":["The lazy dog"],"echo":true})");
  ASSERT_TRUE(r);
  j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], "The lazy dog" + ReplyText(16));
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);
  // Token ids as the prompt.
  r = PostJson("/v1/completions", R"({"model":"tiny-test","prompt":[5,6,7],"max_tokens":2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], 3);
}

TEST_F(ServerTest, ChatStreamingChunks) {
  StartServer();
  json req = Chat(9, true);
  req["stream_options"] = {{"include_usage", true}};
  auto r = PostJson("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  bool done = false;
  auto events = ParseSse(r->body, &done);
  EXPECT_TRUE(done);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  std::string id = events[0]["id"];
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], id);
    ASSERT_EQ(e["choices"].size(), 1u);
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, ReplyText(9));
  EXPECT_EQ(finish, "length");
  const json& last = events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 9);
  EXPECT_GT(last["usage"]["prompt_tokens"].get<int>(), 10);
  EXPECT_TRUE(last["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  EXPECT_GT(last["cost"]["total"].get<double>(), 0);

  // Without include_usage there is no usage chunk; completions stream "text".
  r = PostJson("/v1/completions", R"({"model":"tiny-test","prompt":"x","max_tokens":4,"stream":true})");
  ASSERT_TRUE(r);
  events = ParseSse(r->body, &done);
  EXPECT_TRUE(done);
  text.clear();
  for (const auto& e : events) {
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_FALSE(e.contains("usage"));
    text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, ReplyText(4));
  EXPECT_EQ(events.back()["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, StopStrings) {
  StartServer();
  // A stop string inside the reply: the text ends before it.
  json req = Chat(40);
  req["stop"] = "fox";
  auto r = PostJson("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello, world! The quick brown ");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // One that straddles tokens differently from its own tokenization, and
  // streaming: matched on the decoded text.
  req = Chat(40, true);
  req["stop"] = {"ck br", "zzz"};
  r = PostJson("/v1/chat/completions", req.dump());
  ASSERT_TRUE(r);
  bool done = false;
  auto events = ParseSse(r->body, &done);
  std::string text, finish;
  for (const auto& e : events) {
    if (e["choices"][0]["delta"].contains("content")) text += e["choices"][0]["delta"]["content"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(text, "Hello, world! The qui");
  EXPECT_EQ(finish, "stop");
  // Stop strings were also tokenized for the engine (after eos).
  EXPECT_EQ(engine_->last_params().stop_token_seqs.size(), 3u);
}

TEST_F(ServerTest, TheModelsEosIdsStopGeneration) {
  ServerConfig cfg;
  cfg.model_eos_ids = {5, 7};  // e.g. a Hugging Face model's <|im_end|> and <|endoftext|>
  StartServer(cfg);
  auto r = PostJson("/v1/chat/completions", Chat(3).dump());
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const GenerationParams gp = engine_->last_params();
  ASSERT_GE(gp.stop_token_seqs.size(), 3u);
  EXPECT_EQ(gp.stop_token_seqs[0], std::vector<int32_t>{5});
  EXPECT_EQ(gp.stop_token_seqs[1], std::vector<int32_t>{7});
  EXPECT_EQ(gp.stop_token_seqs[2], std::vector<int32_t>{tok_->eos_id()});
}

TEST_F(ServerTest, BadRequestsGetClearErrorsAndTheServerKeepsServing) {
  ServerConfig cfg;
  cfg.max_body_bytes = 4096;
  cfg.context_tokens = 64;
  StartServer(cfg);
  ExpectError(PostJson("/v1/chat/completions", "{not json"), 400, "not valid JSON");
  ExpectError(PostJson("/v1/chat/completions", "[1,2]"), 400, "must be a JSON object");
  ExpectError(PostJson("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})"), 400,
              "missing required field 'model'", "model");
  ExpectError(PostJson("/v1/chat/completions", R"({"model":"tiny-test"})"), 400, "'messages'", "messages");
  ExpectError(PostJson("/v1/chat/completions", R"({"model":"tiny-test","messages":[]})"), 400, "non-empty");
  ExpectError(PostJson("/v1/chat/completions", R"({"model":"tiny-test","messages":[{"role":"wizard","content":"x"}]})"),
              400, "not a known role", "messages[0].role");
  ExpectError(PostJson("/v1/chat/completions", R"({"model":"tiny-test","messages":[{"role":"user","content":5}]})"),
              400, "must be a string", "messages[0].content");
  // One field changed from a good request: {field, value, message part, param}.
  const std::vector<std::tuple<const char*, json, const char*, const char*>> bad_fields = {
      {"temperature", "hot", "must be a number", "temperature"},
      {"temperature", 3, "out of range", "temperature"},
      {"max_tokens", 0, "out of range", "max_tokens"},
      {"max_tokens", 2.5, "must be an integer", "max_tokens"},
      {"stop", 7, "'stop'", "stop"},
      {"n", 2, "only n=1", "n"},
      {"stream", "yes", "must be a boolean", "stream"},
      {"stream_options", {{"include_usage", true}}, "only allowed when 'stream' is true", "stream_options"},
  };
  for (const auto& [field, value, message, param] : bad_fields) {
    json bad = Chat(5);
    bad[field] = value;
    ExpectError(PostJson("/v1/chat/completions", bad.dump()), 400, message, param);
  }
  ExpectError(PostJson("/v1/completions", R"({"model":"tiny-test","prompt":{"a":1}})"), 400, "'prompt'", "prompt");
  ExpectError(PostJson("/v1/completions", R"({"model":"tiny-test","prompt":[1, 99999]})"), 400, "outside the vocabulary");
  json bad = Chat(5);
  bad["model"] = "gpt-4o";
  ExpectError(PostJson("/v1/chat/completions", bad.dump()), 404, "does not exist", "model");
  // A prompt longer than the context.
  bad = Chat(5);
  bad["messages"][1]["content"] = std::string(300, 'q');
  ExpectError(PostJson("/v1/chat/completions", bad.dump()), 400, "context is 64 tokens");
  // Too large a body: 413.
  bad = Chat(5);
  bad["messages"][1]["content"] = std::string(8000, 'x');
  ExpectError(PostJson("/v1/chat/completions", bad.dump()), 413, "too large");
  // Wrong method: 405 with Allow; unknown route: 404; both in the error shape.
  auto c = Client();
  auto g = c.Get("/v1/chat/completions");
  ExpectError(g, 405, "not allowed");
  EXPECT_EQ(g->get_header_value("Allow"), "POST");
  ExpectError(c.Delete("/v1/models"), 405, "not allowed");
  ExpectError(c.Post("/metrics", "", "text/plain"), 405, "not allowed");
  ExpectError(c.Get("/v2/nothing"), 404, "no such route");
  ExpectStillServing();
  // None of them reached the engine.
  EXPECT_EQ(engine_->stats().requests, 1);
}

TEST_F(ServerTest, QueueFullGives429WithRetryAfter) {
  StartServer({}, /*max_running=*/1, /*max_queue=*/2);
  engine_->SetPaused(true);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 2; ++i)
    clients.emplace_back([&] {
      auto r = PostJson("/v1/chat/completions", Chat(3).dump());
      if (r && r->status == 200) ok++;
    });
  for (int i = 0; i < 500 && engine_->waiting() < 2; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(engine_->waiting(), 2);
  auto r = PostJson("/v1/chat/completions", Chat(3).dump());
  ExpectError(r, 429, "queue is full");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "rate_limit_error");
  engine_->SetPaused(false);
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 2);
  EXPECT_EQ(server_->counters().rejected_busy, 1);
  ExpectStillServing();
}

TEST_F(ServerTest, ApiKey) {
  ServerConfig cfg;
  cfg.api_key = "sk-test-123";
  StartServer(cfg);
  ExpectError(PostJson("/v1/chat/completions", Chat(2).dump()), 401, "API key");
  auto r = PostJson("/v1/chat/completions", Chat(2).dump(), {{"Authorization", "Bearer wrong"}});
  ExpectError(r, 401, "API key");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key");
  r = PostJson("/v1/chat/completions", Chat(2).dump(), {{"Authorization", "Bearer sk-test-123"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto c = Client();
  ExpectError(c.Get("/v1/models"), 401, "API key");
  EXPECT_EQ(c.Get("/health")->status, 200);  // open for load balancers
}

}  // namespace
}  // namespace myriad::serve
