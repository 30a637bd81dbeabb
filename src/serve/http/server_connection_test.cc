// The HTTP server's own connection handling, over raw loopback sockets: a
// client that goes away mid-stream, 64 concurrent clients, shutdown,
// pipelining, a chunked body over the limit, a slow head at the header
// deadline, requests cancelled at the drain timeout.
#include "serve/http/server_test_util.h"

#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace myriad::serve {
namespace {

using namespace server_test;  // NOLINT: the fixture's client, fake engine and helpers
using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

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

// A raw POST of a chat completion body.
std::string RawChatPost(const std::string& body) {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
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
  const std::string req = RawChatPost(Chat(400, true).dump());
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string got;
  ASSERT_TRUE(ReadUntil(fd, "\"content\":\"H", &got)) << got;  // tokens are flowing
  close(fd);
  ExpectOneCancelled();
  EXPECT_EQ(engine_->stats().cancelled, 1);
  ExpectStillServing();
}

// A non-streamed completion writes nothing until it ends; a client that
// goes away meanwhile still cancels it (the worker peeks at the connection),
// and a pipelined request behind a running one is not taken for a close.
TEST_F(ServerTest, ClientGoneBeforeAWholeResponseCancelsTheRequest) {
  StartServer({}, 16, 128, /*step=*/20ms);
  int fd = Connect();
  ASSERT_GE(fd, 0);
  const std::string req = RawChatPost(Chat(400, false).dump());  // 8 s of tokens
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  for (int i = 0; i < 500 && engine_->stats().requests == 0; ++i) std::this_thread::sleep_for(2ms);
  std::this_thread::sleep_for(100ms);
  close(fd);
  ExpectOneCancelled();

  // Two pipelined requests on one connection, the first a long one: the
  // second's bytes wait in the socket, and the first still completes.
  fd = Connect();
  ASSERT_GE(fd, 0);
  const std::string b1 = Chat(30, false).dump(), b2 = Chat(2, false).dump();
  const std::string both = RawChatPost(b1) + RawChatPost(b2);
  ASSERT_EQ(send(fd, both.data(), both.size(), 0), static_cast<ssize_t>(both.size()));
  const std::string done = "\"finish_reason\":\"length\"";
  std::string got;
  auto answers = [&] {
    size_t n = 0;
    for (size_t p = got.find(done); p != std::string::npos; p = got.find(done, p + 1)) ++n;
    return n;
  };
  for (int i = 0; i < 20 && answers() < 2; ++i) {
    std::string more;
    if (!ReadUntil(fd, done, &more)) break;
    got += more;
  }
  close(fd);
  EXPECT_EQ(answers(), 2u) << got;
  EXPECT_EQ(engine_->cancelled().size(), 1u) << "a pipelined request was taken for a closed connection";
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
