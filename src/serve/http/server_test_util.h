// The HTTP server's test fixture, shared by server_test.cc and
// server_connection_test.cc: a small blocking Beast client, a fake engine
// and the ServerTest fixture that serves it on loopback.
#pragma once

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
namespace server_test {

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

inline constexpr const char* kReply = "Hello, world! The quick brown fox jumps over the lazy dog. ";

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

inline std::vector<std::string> Corpus() {
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
  // The engine got Cancel for one request, and the server counted one
  // completion cancelled (each waited for up to 5 s).
  void ExpectOneCancelled() {
    bool cancelled = false;
    for (int i = 0; i < 500 && !cancelled; ++i) {
      cancelled = !engine_->cancelled().empty();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(cancelled) << "the engine never got Cancel";
    for (int i = 0; i < 500 && server_->counters().completions_cancelled == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(server_->counters().completions_cancelled, 1);
  }
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

  inline static TempDir* dir_ = nullptr;
  inline static Tokenizer* tok_ = nullptr;
  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace server_test
}  // namespace myriad::serve
