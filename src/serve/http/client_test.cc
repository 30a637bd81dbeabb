// The HTTP client (client.h) against the real server on loopback (with the
// fake engine of server_test_util.h): URLs, GET and POST, the bearer key,
// deadlines and clear errors; and the /v1/models extensions a distillation
// student checks (vocab_size, tokenizer_size, vocab_fingerprint, context_length).
#include "serve/http/client.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "serve/http/server_test_util.h"

namespace myriad::serve {
namespace {

using nlohmann::json;
using server_test::ServerTest;

TEST(HttpUrl, ParsesHostPortAndPath) {
  auto u = ParseHttpUrl("http://127.0.0.1:8081/v1/models");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8081);
  EXPECT_EQ(u->path, "/v1/models");
  u = ParseHttpUrl("http://teacher");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "teacher");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->path, "/");
  u = ParseHttpUrl("http://[::1]:9000/x?y=1");
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 9000);
  EXPECT_EQ(u->path, "/x?y=1");
  for (const char* bad : {"https://a:1", "a:1", "http://:80", "http://a:0", "http://a:99999", "http://a:1x",
                          "http://[::1"}) {
    auto b = ParseHttpUrl(bad);
    EXPECT_FALSE(b.ok()) << bad;
  }
  EXPECT_NE(ParseHttpUrl("https://a:1").status().message().find("not an http:// URL"), std::string::npos);
}

TEST_F(ServerTest, ClientGetsAndPostsWithTheKey) {
  ServerConfig cfg;
  cfg.api_key = "sk-client";
  cfg.vocab_size = tok_->vocab_size() + 64;  // a model with more ids than its tokenizer
  StartServer(cfg);
  const std::string base = "http://127.0.0.1:" + std::to_string(server_->port());
  auto m = HttpCall(base + "/v1/models", "GET", "", 10, "sk-client");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_EQ(m->status, 200) << m->body;
  const json model = json::parse(m->body)["data"][0];
  EXPECT_EQ(model["vocab_size"], tok_->vocab_size() + 64);
  EXPECT_EQ(model["tokenizer_size"], tok_->vocab_size());
  EXPECT_EQ(model["vocab_fingerprint"], tok_->VocabFingerprint());
  EXPECT_EQ(model["context_length"], 512);
  auto no_key = HttpCall(base + "/v1/models", "GET", "", 10);
  ASSERT_TRUE(no_key.ok());
  EXPECT_EQ(no_key->status, 401);
  // Token ids past the tokenizer's but inside the model's vocabulary are a prompt (a sampled sequence).
  const int32_t past = tok_->vocab_size() + 3;
  auto c = HttpCall(base + "/v1/completions", "POST",
                    json({{"model", "tiny-test"}, {"prompt", {5, past}}, {"max_tokens", 2}}).dump(), 10, "sk-client");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->status, 200) << c->body;
  auto out = HttpCall(base + "/v1/completions", "POST",
                      json({{"model", "tiny-test"}, {"prompt", {5, tok_->vocab_size() + 64}}}).dump(), 10, "sk-client");
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->status, 400) << out->body;
}

TEST_F(ServerTest, StreamCallReadsAnSseAnswerAsItArrives) {
  StartServer();
  const std::string base = "http://127.0.0.1:" + std::to_string(server_->port());
  const std::string body =
      json({{"model", "tiny-test"}, {"prompt", "hello"}, {"max_tokens", 6}, {"stream", true}}).dump();
  auto call = HttpStreamCall::Open(base + "/v1/completions", body, 10);
  ASSERT_TRUE(call.ok()) << call.status().message();
  EXPECT_EQ((*call)->status(), 200);
  EXPECT_EQ((*call)->header("Content-Type"), "text/event-stream");
  std::string all;
  int pieces = 0;
  while (true) {
    auto more = (*call)->Read(&all, 10);
    ASSERT_TRUE(more.ok()) << more.status().message();
    if (!*more) break;
    ++pieces;
  }
  // The events as the server wrote them: chunks of text, then [DONE]; the
  // same text as the whole (non-streamed) answer.
  std::string text;
  for (size_t p = 0; (p = all.find("data: {", p)) != std::string::npos; ++p) {
    const size_t end = all.find("\n\n", p);
    text += json::parse(all.substr(p + 6, end - p - 6))["choices"][0]["text"].get<std::string>();
  }
  EXPECT_NE(all.find("data: [DONE]"), std::string::npos) << all;
  EXPECT_GT(pieces, 1) << "the answer arrived in one piece: not read as it streamed";
  auto whole = HttpCall(base + "/v1/completions", "POST",
                        json({{"model", "tiny-test"}, {"prompt", "hello"}, {"max_tokens", 6}}).dump(), 10);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(text, json::parse(whole->body)["choices"][0]["text"].get<std::string>());
  // An error status is read like any answer.
  auto bad = HttpStreamCall::Open(base + "/v1/completions", "{", 10);
  ASSERT_TRUE(bad.ok()) << bad.status().message();
  EXPECT_EQ((*bad)->status(), 400);
  std::string err;
  while (true) {
    auto more = (*bad)->Read(&err, 10);
    ASSERT_TRUE(more.ok());
    if (!*more) break;
  }
  EXPECT_NE(err.find("error"), std::string::npos) << err;
}

TEST(HttpClient, ClearErrorsWhenNothingAnswers) {
  // A port nobody listens on: connection refused, naming the URL.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  close(fd);
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/v1/models";
  auto r = HttpCall(url, "GET", "", 5);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(url), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("connect"), std::string::npos) << r.status().message();
  // A server that accepts and never answers: the deadline, not a hang.
  fd = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string silent = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/";
  r = HttpCall(silent, "GET", "", 0.3);
  close(fd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("read"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("after 0.3"), std::string::npos) << r.status().message();
  // The streaming call: the same clear errors.
  auto st = HttpStreamCall::Open(url, "{}", 5);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("connect"), std::string::npos) << st.status().message();
  fd = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  st = HttpStreamCall::Open("http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/", "{}", 0.3);
  close(fd);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("after 0.3"), std::string::npos) << st.status().message();
}

}  // namespace
}  // namespace myriad::serve
