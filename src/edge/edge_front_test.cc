// The edge front between two real HTTP servers on loopback (engines are the
// serving tests' FakeEngine, which answers a fixed text one token per step):
// the cloud's engine answers with placeholders, and a recording front on
// the cloud keeps every request body it received. The end-to-end test with
// real models is tests/e2e/serve_edge.sh.
#include "edge/edge_front.h"

#include <gtest/gtest.h>

#include "serve/http/client.h"
#include "serve/http/server_test_util.h"

namespace myriad::edge {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;
using serve::server_test::FakeEngine;
using serve::server_test::ServerTest;

constexpr const char* kCloudReply = "We will call ⟦PHONE_1⟧ and write to ⟦email_1⟧. ";
constexpr const char* kPhone = "+86 138-0013-8000";
constexpr const char* kEmail = "li.na@example.com";

// Keeps what the cloud received, and lets its engine answer.
class RecordingFront : public serve::CompletionFront {
 public:
  std::optional<serve::FrontReply> Handle(serve::Endpoint, const serve::CompletionRequest&, const std::string& body,
                                          const std::function<bool()>&, serve::LocalRoute*) override {
    std::lock_guard<std::mutex> lock(mu);
    bodies.push_back(body);
    return std::nullopt;
  }
  void LocalDone(const serve::LocalRoute&, const serve::Usage&) override {}
  std::string MetricsText() override { return ""; }
  std::mutex mu;
  std::vector<std::string> bodies;
};

class EdgeFrontTest : public ServerTest {
 protected:
  void StartPair(bool with_cloud = true) {
    StartServer();  // the edge: server_, engine_
    if (with_cloud) {
      // 20 ms a token: the cloud's server writes one token per SSE event
      // even on a busy machine, so its deltas split every placeholder.
      cloud_engine_ = std::make_unique<FakeEngine>(tok_->Encode(kCloudReply), 16, 128, 20ms);
      serve::ServerConfig cc;
      cc.port = 0;
      cc.model_name = "cloud-model";
      cc.context_tokens = 512;
      cloud_ = std::make_unique<serve::HttpServer>(cloud_engine_.get(), tok_, serve::ChatTemplate(),
                                                   serve::PriceTable(), cc);
      cloud_->SetFront(&recorder_);
      ASSERT_TRUE(cloud_->Start().ok());
    }
    EdgeFrontConfig fc;
    fc.cloud_url = with_cloud ? cloud_->url() : "http://127.0.0.1:1";
    fc.connect_timeout_s = 2;
    front_ = std::make_unique<EdgeFront>(fc, &redactor_, nullptr);
    // The edge server was started by StartServer before the front existed:
    // restart it with the front set.
    server_->Shutdown();
    server_ = std::make_unique<serve::HttpServer>(engine_.get(), tok_, serve::ChatTemplate(), serve::PriceTable(),
                                                  EdgeConfig());
    server_->SetFront(front_.get());
    ASSERT_TRUE(server_->Start().ok());
  }
  static serve::ServerConfig EdgeConfig() {
    serve::ServerConfig c;
    c.port = 0;
    c.model_name = "tiny-test";
    c.context_tokens = 512;
    return c;
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    if (cloud_) cloud_->Shutdown();
    if (cloud_engine_) cloud_engine_->Shutdown();
    ServerTest::TearDown();
  }
  json Chat(const std::string& route, bool stream, std::string* raw = nullptr,
            std::string* route_header = nullptr, std::string* fallback = nullptr) {
    json body = {{"model", "tiny-test"},
                 {"messages", {{{"role", "user"}, {"content", std::string("Call ") + kPhone + " or mail " + kEmail}}}},
                 {"max_tokens", 24},
                 {"stream", stream},
                 {"route", route}};
    auto call = serve::HttpStreamCall::Open(server_->url() + "/v1/chat/completions", body.dump(), 10);
    EXPECT_TRUE(call.ok()) << call.status().message();
    if (!call.ok()) return json();
    if (route_header) *route_header = (*call)->header("X-Myriad-Route");
    if (fallback) *fallback = (*call)->header("X-Myriad-Route-Fallback");
    std::string all;
    while (true) {
      auto more = (*call)->Read(&all, 10);
      EXPECT_TRUE(more.ok()) << more.status().message();
      if (!more.ok() || !*more) break;
    }
    if (raw) *raw = all;
    if (!stream) return json::parse(all, nullptr, false);
    json chunks = json::array();
    for (size_t p = 0; (p = all.find("data: {", p)) != std::string::npos; ++p)
      chunks.push_back(json::parse(all.substr(p + 6, all.find("\n\n", p) - p - 6)));
    return chunks;
  }
  Redactor redactor_{nullptr};
  RecordingFront recorder_;
  std::unique_ptr<FakeEngine> cloud_engine_;
  std::unique_ptr<serve::HttpServer> cloud_;
  std::unique_ptr<EdgeFront> front_;
};

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) s.replace(p, from.size(), to);
  return s;
}

TEST_F(EdgeFrontTest, CollaborativeRouteSendsPlaceholdersAndRestoresOriginals) {
  StartPair();
  std::string header;
  json j = Chat("collaborative", false, nullptr, &header);
  ASSERT_TRUE(j.is_object()) << j;
  EXPECT_EQ(j["route"], "collaborative");
  EXPECT_EQ(header, "collaborative");
  EXPECT_EQ(j["model"], "tiny-test");  // one API: the client's model id
  // What the cloud received: placeholders, no planted value, its own model id.
  ASSERT_EQ(recorder_.bodies.size(), 1u);
  const std::string sent = recorder_.bodies[0];
  EXPECT_EQ(sent.find("13800138000"), std::string::npos) << sent;
  EXPECT_EQ(sent.find("138-0013-8000"), std::string::npos) << sent;
  EXPECT_EQ(sent.find("li.na"), std::string::npos) << sent;
  EXPECT_NE(sent.find("⟦PHONE_1⟧"), std::string::npos) << sent;
  EXPECT_NE(sent.find("⟦EMAIL_1⟧"), std::string::npos) << sent;
  EXPECT_EQ(json::parse(sent)["model"], "cloud-model");
  EXPECT_FALSE(json::parse(sent).contains("route"));
  // The answer: the cloud's text, placeholders (one lower-cased by the
  // "cloud") replaced by the originals.
  const std::string text = j["choices"][0]["message"]["content"];
  const std::string want_prefix = ReplaceAll(ReplaceAll(kCloudReply, "⟦PHONE_1⟧", kPhone), "⟦email_1⟧", kEmail);
  EXPECT_EQ(text.substr(0, std::min(text.size(), want_prefix.size())),
            want_prefix.substr(0, std::min(text.size(), want_prefix.size())));
  EXPECT_NE(text.find(kPhone), std::string::npos) << text;
  EXPECT_EQ(text.find("⟦"), std::string::npos) << text;
  EXPECT_EQ(j["redactions"]["PHONE"], 1);
  EXPECT_EQ(j["redactions"]["EMAIL"], 1);
}

TEST_F(EdgeFrontTest, StreamedAnswerIsRestoredAcrossChunksThatSplitPlaceholders) {
  StartPair();
  const std::string whole = Chat("collaborative", false)["choices"][0]["message"]["content"];
  std::string raw;
  json chunks = Chat("collaborative", true, &raw);
  std::string streamed;
  for (const json& c : chunks) {
    EXPECT_EQ(c["route"], "collaborative") << c;
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
      streamed += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(streamed, whole);
  EXPECT_NE(raw.find("data: [DONE]"), std::string::npos);
  // The cloud's own stream of the same request splits placeholders across
  // its deltas: the restore above did cross chunk boundaries.
  const json direct = {{"model", "cloud-model"},
                       {"messages", {{{"role", "user"}, {"content", "Call ⟦PHONE_1⟧"}}}},
                       {"max_tokens", 24},
                       {"stream", true}};
  auto call = serve::HttpStreamCall::Open(cloud_->url() + "/v1/chat/completions", direct.dump(), 10);
  ASSERT_TRUE(call.ok()) << call.status().message();
  std::string cloud_raw;
  while (true) {
    auto more = (*call)->Read(&cloud_raw, 10);
    ASSERT_TRUE(more.ok()) << more.status().message();
    if (!*more) break;
  }
  bool split = false;
  for (size_t p = 0; (p = cloud_raw.find("data: {", p)) != std::string::npos; ++p) {
    const json c = json::parse(cloud_raw.substr(p + 6, cloud_raw.find("\n\n", p) - p - 6));
    if (c["choices"].empty() || !c["choices"][0]["delta"].contains("content")) continue;
    const std::string d = c["choices"][0]["delta"]["content"];
    const size_t open = d.find("⟦");
    split = split || (open != std::string::npos && d.find("⟧", open) == std::string::npos);
  }
  EXPECT_TRUE(split) << cloud_raw;
  // The usage chunk the edge asked for itself is not passed on.
  for (const json& c : chunks) EXPECT_FALSE(c.contains("usage") && c["choices"].empty()) << c;
  EXPECT_GT(front_->counters().cloud_completion_tokens, 0);
}

TEST_F(EdgeFrontTest, RoutesArePinnedNamedAndCounted) {
  StartPair();
  std::string header;
  json edge = Chat("edge", false, nullptr, &header);
  EXPECT_EQ(edge["route"], "edge");
  EXPECT_EQ(header, "edge");
  EXPECT_TRUE(recorder_.bodies.empty());  // nothing left the device
  EXPECT_EQ(edge["choices"][0]["message"]["content"].get<std::string>().rfind("Hello", 0), 0u);
  json cloud = Chat("cloud", false);
  EXPECT_EQ(cloud["route"], "cloud");
  ASSERT_EQ(recorder_.bodies.size(), 1u);
  EXPECT_NE(recorder_.bodies[0].find(kEmail), std::string::npos);  // as sent
  // The cloud's placeholders are not the edge's business on this route.
  EXPECT_NE(cloud["choices"][0]["message"]["content"].get<std::string>().find("⟦PHONE_1⟧"), std::string::npos);
  json bad = Chat("sideways", false);
  EXPECT_EQ(bad["error"]["param"], "route") << bad;
  const EdgeFront::Counters c = front_->counters();
  EXPECT_EQ(c.routes[static_cast<int>(Route::kEdge)], 1);
  EXPECT_EQ(c.routes[static_cast<int>(Route::kCloud)], 1);
  EXPECT_EQ(c.pinned, 2);
  EXPECT_GT(c.cost_saved, 0);
  const std::string m = server_->MetricsText();
  EXPECT_NE(m.find("myriad_edge_route_requests_total{route=\"cloud\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("myriad_edge_cost_saved_total{currency=\"USD\"}"), std::string::npos) << m;
}

TEST_F(EdgeFrontTest, UnreachableCloudIsAnsweredOnTheEdgeAndSaysSo) {
  StartPair(/*with_cloud=*/false);
  for (bool stream : {false, true}) {
    std::string raw, header, fallback;
    Chat("collaborative", stream, &raw, &header, &fallback);
    EXPECT_EQ(header, "edge") << raw;
    EXPECT_NE(fallback.find("cloud unavailable"), std::string::npos) << fallback;
    EXPECT_NE(raw.find("\"route\":\"edge\""), std::string::npos) << raw;
  }
  EXPECT_EQ(front_->counters().fallbacks, 2);
}

}  // namespace
}  // namespace myriad::edge
