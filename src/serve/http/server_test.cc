// The HTTP server against a fake engine, over real loopback HTTP: every
// route, streaming chunks, usage and billing, every kind of bad request,
// back-pressure, the API key, a client that goes away mid-stream, 64
// concurrent clients, pipelining, a chunked body over the limit, a slow head
// at the header deadline, requests cancelled at the drain timeout. (The pure
// parts are in openai_test.cc; tests/e2e/serve_http_hostile.sh does the
// hostile clients at full size against the real binary.)
#include "serve/http/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "data/test_util.h"
#include "serve/http/openai.h"

namespace myriad::serve {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// A small blocking HTTP/1.1 client over Beast, one connection per request
// (the tests of the server's own connection handling use raw sockets).
struct TestResponse {
  int status = 0;
  std::string body;
  http::fields headers;
  std::string get_header_value(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : std::string(it->value());
  }
};
class TestResult {
 public:
  explicit TestResult(std::string error) : error_(std::move(error)) {}
  explicit TestResult(TestResponse r) : r_(std::move(r)) {}
  explicit operator bool() const { return r_.has_value(); }
  const TestResponse* operator->() const { return &*r_; }
  const std::string& error() const { return error_; }

 private:
  std::optional<TestResponse> r_;
  std::string error_;
};
using Headers = std::vector<std::pair<std::string, std::string>>;

class TestClient {
 public:
  explicit TestClient(int port) : port_(port) {}
  TestResult Get(const std::string& path) { return Send(http::verb::get, path, {}, "", ""); }
  TestResult Delete(const std::string& path) { return Send(http::verb::delete_, path, {}, "", ""); }
  TestResult Post(const std::string& path, const std::string& body, const std::string& type) {
    return Send(http::verb::post, path, {}, body, type);
  }
  TestResult Post(const std::string& path, const Headers& h, const std::string& body, const std::string& type) {
    return Send(http::verb::post, path, h, body, type);
  }

 private:
  TestResult Send(http::verb verb, const std::string& path, const Headers& h, const std::string& body,
                  const std::string& type) {
    net::io_context ioc;
    tcp::socket sock(ioc);
    beast::error_code ec;
    sock.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port_)), ec);
    if (ec) return TestResult("connect: " + ec.message());
    http::request<http::string_body> req{verb, path, 11};
    req.set(http::field::host, "127.0.0.1");
    for (const auto& [k, v] : h) req.set(k, v);
    if (!type.empty()) req.set(http::field::content_type, type);
    req.body() = body;
    req.prepare_payload();
    http::write(sock, req, ec);
    if (ec) return TestResult("write: " + ec.message());
    beast::flat_buffer buf;
    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);
    http::read(sock, buf, parser, ec);
    if (ec) return TestResult("read: " + ec.message());
    TestResponse r;
    r.status = static_cast<int>(parser.get().result_int());
    r.body = parser.get().body();
    r.headers = parser.get().base();
    return TestResult(std::move(r));
  }
  int port_;
};

const char* kReply = "Hello, world! The quick brown fox jumps over the lazy dog. ";

// A test double of the engine: a thread that gives each running request one
// token of kReply (cyclically) per step, honours max_tokens, token-level stop
// sequences (not emitted, like the real engine), cancellation and a bounded
// queue, and reports cached tokens as whole 16-token blocks shared with an
// earlier prompt.
class FakeEngine : public Engine {
 public:
  FakeEngine(std::vector<int32_t> reply, int max_running, int max_queue, std::chrono::milliseconds step)
      : reply_(std::move(reply)), max_running_(max_running), max_queue_(max_queue), step_(step) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeEngine() override { Shutdown(); }

  Result<uint64_t> Submit(std::vector<int32_t> prompt, const GenerationParams& params,
                          std::function<void(const TokenEvent&)> on_event) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::Error("engine: shutting down");
    if (static_cast<int>(waiting_.size()) >= max_queue_) {
      ++stats_.rejected;
      return Status::Error("engine: queue full (" + std::to_string(waiting_.size()) + " requests waiting)");
    }
    auto r = std::make_shared<Req>();
    r->id = next_id_++;
    r->params = params;
    r->on_event = std::move(on_event);
    r->prompt_len = static_cast<int64_t>(prompt.size());
    int64_t best = 0;
    for (const auto& p : seen_) {
      int64_t l = 0;
      while (l < static_cast<int64_t>(std::min(p.size(), prompt.size())) && p[l] == prompt[l]) ++l;
      best = std::max(best, l);
    }
    r->cached = std::min(best, r->prompt_len - 1) / 16 * 16;
    seen_.push_back(prompt);
    last_params_ = params;
    waiting_.push_back(r);
    ++stats_.requests;
    stats_.prompt_tokens += r->prompt_len;
    cv_.notify_all();
    return r->id;
  }
  void Cancel(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requested_.insert(id);
  }
  EngineStats stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    EngineStats s = stats_;
    s.running = static_cast<int>(running_.size());
    s.waiting = static_cast<int>(waiting_.size());
    s.tier_hits = {{"host", 0}};
    s.kv_blocks_total = 100;
    return s;
  }
  void Shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ && !thread_.joinable()) return;
      stopping_ = true;
      paused_ = false;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void SetPaused(bool p) {
    std::lock_guard<std::mutex> lock(mu_);
    paused_ = p;
    cv_.notify_all();
  }
  int waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(waiting_.size());
  }
  std::set<uint64_t> cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancel_requested_;
  }
  GenerationParams last_params() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_params_;
  }

 private:
  struct Req {
    uint64_t id = 0;
    GenerationParams params;
    std::function<void(const TokenEvent&)> on_event;
    int64_t prompt_len = 0, cached = 0, generated = 0;
    std::vector<int32_t> out;
    size_t emitted = 0;
  };

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || (!paused_ && (!waiting_.empty() || !running_.empty())); });
      if (stopping_ && waiting_.empty() && running_.empty()) return;
      while (static_cast<int>(running_.size()) < max_running_ && !waiting_.empty()) {
        running_.push_back(waiting_.front());
        waiting_.pop_front();
      }
      std::vector<std::pair<std::shared_ptr<Req>, TokenEvent>> events;
      for (auto it = running_.begin(); it != running_.end();) {
        auto r = *it;
        std::string reason;
        if (cancel_requested_.count(r->id)) {
          reason = "cancelled";
        } else {
          r->out.push_back(reply_[r->generated % reply_.size()]);
          ++r->generated;
          size_t hold = 0;
          for (const auto& s : r->params.stop_token_seqs) {
            if (s.size() <= r->out.size() && std::equal(s.begin(), s.end(), r->out.end() - s.size())) {
              r->out.resize(r->out.size() - s.size());
              reason = "stop";
              break;
            }
            for (size_t k = std::min(s.size() - 1, r->out.size()); k > hold; --k)
              if (std::equal(s.begin(), s.begin() + k, r->out.end() - k)) {
                hold = k;
                break;
              }
          }
          if (reason.empty() && r->generated >= r->params.max_tokens) reason = "length";
          if (!reason.empty()) hold = 0;
          for (; r->emitted + hold < r->out.size(); ++r->emitted) {
            TokenEvent e;
            e.token = r->out[r->emitted];
            events.emplace_back(r, e);
          }
        }
        if (!reason.empty()) {
          TokenEvent e;
          e.done = true;
          e.finish_reason = reason;
          e.prompt_tokens = r->prompt_len;
          e.cached_tokens = r->cached;
          e.completion_tokens = r->generated;
          events.emplace_back(r, e);
          stats_.cached_tokens += r->cached;
          stats_.t0_hits += r->cached;
          stats_.completion_tokens += r->generated;
          if (reason == "cancelled") ++stats_.cancelled;
          it = running_.erase(it);
        } else {
          ++it;
        }
      }
      lock.unlock();
      for (auto& [r, e] : events) r->on_event(e);
      std::this_thread::sleep_for(step_);
      lock.lock();
    }
  }

  const std::vector<int32_t> reply_;
  const int max_running_, max_queue_;
  const std::chrono::milliseconds step_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Req>> waiting_;
  std::vector<std::shared_ptr<Req>> running_;
  std::set<uint64_t> cancel_requested_;
  std::vector<std::vector<int32_t>> seen_;
  GenerationParams last_params_;
  EngineStats stats_;
  uint64_t next_id_ = 1;
  bool stopping_ = false, paused_ = false;
  std::thread thread_;
};

std::vector<std::string> Corpus() {
  std::vector<std::string> docs;
  for (int i = 0; i < 30; ++i) {
    docs.push_back(kReply);
    docs.push_back("<|system|>\nYou are helpful.\n<|user|>\nSay hello to the world.\n<|assistant|>\n");
    docs.push_back("The lazy dog sleeps while the quick brown fox runs around the world.");
  }
  return docs;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("http");
    TokenizerTrainOptions o;
    o.character_coverage = 1.0;
    Status st = Tokenizer::Train(Corpus(), dir_->path() + "/tok", 320, o);
    ASSERT_TRUE(st.ok()) << st.message();
    auto tok = Tokenizer::Load(dir_->path() + "/tok.model");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    tok_ = new Tokenizer(std::move(tok.value()));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }

  void StartServer(ServerConfig cfg = {}, int max_running = 16, int max_queue = 128,
                   std::chrono::milliseconds step = 2ms) {
    engine_ = std::make_unique<FakeEngine>(tok_->Encode(kReply), max_running, max_queue, step);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.model_name = "tiny-test";
    if (cfg.context_tokens == 0) cfg.context_tokens = 512;
    server_ = std::make_unique<HttpServer>(engine_.get(), tok_, ChatTemplate(), PriceTable(), cfg);
    Status st = server_->Start();
    ASSERT_TRUE(st.ok()) << st.message();
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    if (engine_) engine_->Shutdown();
    server_.reset();
    engine_.reset();
  }
  TestClient Client() { return TestClient(server_->port()); }
  TestResult PostJson(const std::string& path, const std::string& body, Headers h = {}) {
    auto c = Client();
    return c.Post(path, h, body, "application/json");
  }
  // A raw loopback connection to the server (-1 on failure).
  int Connect() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }
  static json Chat(int max_tokens, bool stream = false) {
    json j = {{"model", "tiny-test"},
              {"messages", {{{"role", "system"}, {"content", "You are helpful."}},
                            {{"role", "user"}, {"content", "Say hello to the world."}}}},
              {"max_tokens", max_tokens},
              {"temperature", 0}};
    if (stream) j["stream"] = true;
    return j;
  }
  // The expected text of the first n reply tokens.
  std::string ReplyText(size_t n) {
    auto ids = tok_->Encode(kReply);
    std::vector<int32_t> out;
    for (size_t i = 0; i < n; ++i) out.push_back(ids[i % ids.size()]);
    return tok_->Decode(out);
  }
  void ExpectStillServing() {
    auto r = PostJson("/v1/completions", R"({"model":"tiny-test","prompt":"The lazy dog","max_tokens":3})");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], ReplyText(3));
  }
  static void ExpectError(const TestResult& r, int status, const std::string& message_part,
                          const std::string& param = "") {
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, status) << r->body;
    json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(message_part), std::string::npos) << r->body;
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("code") && j["error"].contains("param"));
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r->body;
    }
  }
  // Parses an SSE body into its JSON events; *done is set when it ends with [DONE].
  static std::vector<json> ParseSse(const std::string& body, bool* done) {
    std::vector<json> out;
    *done = false;
    size_t pos = 0;
    while (pos < body.size()) {
      size_t end = body.find("\n\n", pos);
      EXPECT_NE(end, std::string::npos) << "unterminated event: " << body.substr(pos);
      if (end == std::string::npos) break;
      std::string ev = body.substr(pos, end - pos);
      pos = end + 2;
      if (ev[0] == ':') continue;  // comment (keep-alive)
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      std::string data = ev.substr(6);
      EXPECT_FALSE(*done) << "event after [DONE]";
      if (data == "[DONE]") {
        *done = true;
        continue;
      }
      out.push_back(json::parse(data));
    }
    return out;
  }

  static TempDir* dir_;
  static Tokenizer* tok_;
  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
};
TempDir* ServerTest::dir_ = nullptr;
Tokenizer* ServerTest::tok_ = nullptr;

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

std::string Chunk(const std::string& data) {
  char len[24];
  std::snprintf(len, sizeof len, "%zx\r\n", data.size());
  return len + data + "\r\n";
}

// Reads from a raw socket until `needle` has arrived (or EOF/timeout).
bool ReadUntil(int fd, const std::string& needle, std::string* got) {
  char buf[4096];
  for (int i = 0; i < 200 && got->find(needle) == std::string::npos; ++i) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got->append(buf, static_cast<size_t>(n));
  }
  return got->find(needle) != std::string::npos;
}

TEST_F(ServerTest, ClientGoneMidStreamCancelsTheRequest) {
  StartServer({}, 16, 128, /*step=*/20ms);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::string body = Chat(400, true).dump();
  std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string got;
  ASSERT_TRUE(ReadUntil(fd, "\"content\":\"H", &got)) << got;  // tokens are flowing
  close(fd);
  bool cancelled = false;
  for (int i = 0; i < 500 && !cancelled; ++i) {
    cancelled = !engine_->cancelled().empty();
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(cancelled) << "the engine never got Cancel";
  for (int i = 0; i < 500 && server_->counters().completions_cancelled == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server_->counters().completions_cancelled, 1);
  EXPECT_EQ(engine_->stats().cancelled, 1);
  ExpectStillServing();
}

TEST_F(ServerTest, SixtyFourConcurrentClients) {
  StartServer({}, /*max_running=*/16, /*max_queue=*/128, /*step=*/1ms);
  std::atomic<int> good{0};
  std::vector<std::string> failures;
  std::mutex fmu;
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i)
    clients.emplace_back([&, i] {
      const bool stream = i % 2 == 0;
      auto r = PostJson("/v1/chat/completions", Chat(12, stream).dump());
      std::string text;
      if (r && r->status == 200) {
        if (stream) {
          bool done = false;
          for (const auto& e : ParseSse(r->body, &done))
            if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content"))
              text += e["choices"][0]["delta"]["content"].get<std::string>();
          if (!done) text.clear();
        } else {
          text = json::parse(r->body)["choices"][0]["message"]["content"];
        }
      }
      if (text == ReplyText(12)) {
        good++;
      } else {
        std::lock_guard<std::mutex> lock(fmu);
        failures.push_back(std::to_string(i) + ": " + (r ? std::to_string(r->status) + " " + r->body.substr(0, 200)
                             : "no response: " + r.error()));
      }
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(good.load(), 64) << (failures.empty() ? "" : failures[0] + " / " + failures.back());
  EXPECT_EQ(engine_->stats().requests, 64);
  // A handler counts its completion after the last bytes went out, so the
  // client may be done a moment before the counters are.
  for (int i = 0; i < 200 && server_->counters().completions_ok < 64; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(server_->billing().requests, 64);
  EXPECT_EQ(server_->counters().completions_ok, 64);
}

TEST_F(ServerTest, ShutdownDrainsThenRefuses) {
  StartServer({}, 16, 128, 5ms);
  std::thread slow([&] {
    auto r = PostJson("/v1/chat/completions", Chat(60).dump());
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 60);
  });
  for (int i = 0; i < 500 && engine_->stats().requests == 0; ++i) std::this_thread::sleep_for(2ms);
  server_->Shutdown();  // waits for the running request
  slow.join();
  EXPECT_FALSE(Client().Get("/health"));  // no longer listening
}


// Two requests written back to back on one connection: both answered, in order.
TEST_F(ServerTest, PipelinedRequestsAreBothAnswered) {
  StartServer();
  int fd = Connect();
  ASSERT_GE(fd, 0);
  std::string body = R"({"model":"tiny-test","prompt":"The lazy dog","max_tokens":3})";
  std::string reqs = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\n\r\n" + body + "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(send(fd, reqs.data(), reqs.size(), 0), static_cast<ssize_t>(reqs.size()));
  std::string got;
  ASSERT_TRUE(ReadUntil(fd, "\"object\":\"list\"", &got)) << got;
  close(fd);
  const size_t a = got.find("{\"status\":\"ok\"}"), b = got.find("\"text_completion\""),
               c = got.find("\"object\":\"list\"");
  EXPECT_TRUE(a < b && b < c) << got;
  size_t n = 0;
  for (size_t p = got.find("HTTP/1.1 200 OK"); p != std::string::npos; p = got.find("HTTP/1.1 200 OK", p + 1)) ++n;
  EXPECT_EQ(n, 3u) << got;
}

// A chunked body is held to max_body_bytes like one with a Content-Length:
// 413 after the limit, not the whole body read into memory.
TEST_F(ServerTest, ChunkedBodyOverTheLimitIs413) {
  ServerConfig cfg;
  cfg.max_body_bytes = 4096;
  StartServer(cfg);
  int fd = Connect();
  ASSERT_GE(fd, 0);
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n";
  ASSERT_EQ(send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  const std::string chunk = "400\r\n" + std::string(1024, 'x') + "\r\n";
  for (int i = 0; i < 8; ++i) send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
  std::string got;
  ReadUntil(fd, "payload_too_large", &got);
  close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got;
  EXPECT_NE(got.find("too large"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
  ExpectStillServing();
  // Below the limit a chunked body is read whole.
  fd = Connect();
  ASSERT_GE(fd, 0);
  std::string body = R"({"model":"tiny-test","prompt":"The lazy dog","max_tokens":2})";
  std::string req = head + Chunk(body.substr(0, 10)) + Chunk(body.substr(10)) + "0\r\n\r\n";
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  got.clear();
  ASSERT_TRUE(ReadUntil(fd, "\"text_completion\"", &got)) << got;
  close(fd);
  EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got;
}

// A client that sends its head too slowly is dropped at the header deadline;
// others are served meanwhile, and shutdown does not wait for it.
TEST_F(ServerTest, SlowHeadIsDroppedAtTheDeadline) {
  ServerConfig cfg;
  cfg.header_timeout_s = 0.5;
  StartServer(cfg);
  int fd = Connect();
  ASSERT_GE(fd, 0);
  std::string part = "GET /health HTTP/1.1\r\nX-Slow: 1\r\n";
  ASSERT_EQ(send(fd, part.data(), part.size(), 0), static_cast<ssize_t>(part.size()));
  ExpectStillServing();
  const auto t0 = Clock::now();
  char buf[256];
  const ssize_t n = recv(fd, buf, sizeof buf, 0);  // blocks until the server closes
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  close(fd);
  EXPECT_EQ(n, 0) << "want the connection closed, got " << n << " bytes";
  EXPECT_LT(waited, 10.0) << "the header deadline (0.5 s) was not enforced";
  // Another slow one stays connected through Shutdown, which still returns.
  fd = Connect();
  ASSERT_GE(fd, 0);
  ASSERT_EQ(send(fd, part.data(), part.size(), 0), static_cast<ssize_t>(part.size()));
  server_->Shutdown();
  close(fd);
}

// A request the drain timeout cancels is not a 200 with a finish_reason
// OpenAI does not have: 503 (not streamed) or an error event (streamed).
TEST_F(ServerTest, RequestsCancelledAtTheDrainTimeoutAreErrors) {
  ServerConfig cfg;
  cfg.drain_timeout_s = 0.3;
  StartServer(cfg, 16, 128, /*step=*/20ms);
  TestResult plain("not run");
  std::string streamed;
  std::thread a([&] { plain = PostJson("/v1/chat/completions", Chat(400).dump()); });
  std::thread b([&] {
    auto r = PostJson("/v1/chat/completions", Chat(400, true).dump());
    if (r) streamed = r->body;
  });
  for (int i = 0; i < 500 && engine_->stats().requests < 2; ++i) std::this_thread::sleep_for(2ms);
  server_->Shutdown();
  a.join();
  b.join();
  ExpectError(plain, 503, "cancelled before it finished");
  EXPECT_EQ(json::parse(plain->body)["error"]["code"], "cancelled");
  EXPECT_EQ(streamed.find("\"finish_reason\":\"cancelled\""), std::string::npos) << streamed;
  const size_t err = streamed.find("data: {\"error\"");
  ASSERT_NE(err, std::string::npos) << streamed;
  EXPECT_NE(streamed.find("cancelled before it finished", err), std::string::npos) << streamed;
  EXPECT_EQ(server_->counters().completions_cancelled, 2);
}

}  // namespace
}  // namespace myriad::serve
