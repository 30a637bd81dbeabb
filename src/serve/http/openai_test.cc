// The pure parts of serving's HTTP layer: request parsing, the stop-string
// filter, prices and chat templates.
#include "serve/http/openai.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/test_util.h"
#include "serve/billing.h"
#include "serve/chat_template.h"

namespace myriad::serve {
namespace {

using nlohmann::json;

TEST(OpenAiParse, Defaults) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
                                     Endpoint::kChat, &r, &e)) << e.message;
  EXPECT_EQ(r.messages[0].content, "ab");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.temperature, 1.0f);
  EXPECT_FALSE(r.stream);
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "max_tokens":5,"max_completion_tokens":9,"top_k":4,"top_p":0.5,"seed":-1,"stop":["a","b"],
      "stream":true,"stream_options":{"include_usage":true},"user":"ignored","presence_penalty":0})",
                                     Endpoint::kChat, &r, &e)) << e.message;
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_EQ(r.top_k, 4);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(*r.seed, ~0ull);
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_TRUE(r.include_usage);
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"p","top_p":0})", Endpoint::kCompletion, &r, &e));
  EXPECT_EQ(r.temperature, 0.0f);  // top_p 0 = greedy
  EXPECT_EQ(*r.max_tokens, 16);
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":"p","stop":[""]})", Endpoint::kCompletion, &r, &e));
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":["a","b"]})", Endpoint::kCompletion, &r, &e));
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{}]})",
                                      Endpoint::kChat, &r, &e));
  EXPECT_EQ(e.param, "tools");
}

// Every field this server does not implement is a 400 naming it, never
// silently ignored; the harmless forms of each are accepted.
TEST(OpenAiParse, UnsupportedFeaturesAreRejectedClearly) {
  CompletionRequest r;
  ApiError e;
  const std::string chat = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
  struct Case {
    std::string extra, param, words;
  };
  const std::vector<Case> bad = {
      {R"("tools":[{"type":"function","function":{"name":"f"}}])", "tools", "tool calling is not supported"},
      {R"("functions":[{"name":"f"}])", "functions", "tool calling is not supported"},
      {R"("tool_choice":"auto")", "tool_choice", "tool calling is not supported"},
      {R"("tool_choice":{"type":"function","function":{"name":"f"}})", "tool_choice", "tool calling"},
      {R"("function_call":"auto")", "function_call", "tool calling is not supported"},
      {R"("top_logprobs":2)", "top_logprobs", "requires 'logprobs': true"},
      {R"("logprobs":false,"top_logprobs":2)", "top_logprobs", "requires 'logprobs': true"},
      {R"("logprobs":true,"top_logprobs":21)", "top_logprobs", "out of range [0, 20]"},
      {R"("logprobs":true,"top_logprobs":-1)", "top_logprobs", "out of range"},
      {R"("logprobs":1)", "logprobs", "must be a boolean"},
      {R"("n":2)", "n", "only n=1"},
      {R"("response_format":{"type":"json_schema","json_schema":{}})", "response_format", "structured output"},
      {R"("response_format":{"type":"json_object"})", "response_format", "json_object"},
      {R"("presence_penalty":0.5)", "presence_penalty", "not supported"},
      {R"("frequency_penalty":-1)", "frequency_penalty", "not supported"},
      {R"("frequency_penalty":3)", "frequency_penalty", "out of range"},
      {R"("logit_bias":{"5":10})", "logit_bias", "not supported"},
      {R"("audio":{"voice":"alloy"})", "audio", "not supported"},
      {R"("modalities":["text","audio"])", "modalities", "only"},
      {R"("prediction":{"type":"content","content":"x"})", "prediction", "not supported"},
  };
  for (const Case& c : bad) {
    e = ApiError();
    EXPECT_FALSE(ParseCompletionRequest(chat + c.extra + "}", Endpoint::kChat, &r, &e)) << c.extra;
    EXPECT_EQ(e.status, 400) << c.extra;
    EXPECT_EQ(e.param, c.param) << c.extra;
    EXPECT_NE(e.message.find(c.words), std::string::npos) << c.extra << " -> " << e.message;
  }
  for (const std::string ok : {R"("tools":[])", R"("tool_choice":"none")", R"("function_call":"none")",
                               R"("functions":[])", R"("presence_penalty":0)", R"("logit_bias":{})",
                               R"("modalities":["text"])", R"("response_format":{"type":"text"})",
                               R"("parallel_tool_calls":false)", R"("logprobs":false)", R"("n":1)"}) {
    EXPECT_TRUE(ParseCompletionRequest(chat + ok + "}", Endpoint::kChat, &r, &e)) << ok << ": " << e.message;
    EXPECT_EQ(r.logprobs, -1) << ok;
  }
  const std::string cmpl = R"({"model":"m","prompt":"p",)";
  for (const Case& c : std::vector<Case>{{R"("logprobs":6)", "logprobs", "out of range [0, 5]"},
                                         {R"("logprobs":true)", "logprobs", "must be an integer"},
                                         {R"("logprobs":2,"echo":true,"stream":true)", "echo", "streaming"},
                                         {R"("max_tokens":0)", "max_tokens", "0 only with 'echo'"},
                                         {R"("max_tokens":0,"echo":true)", "max_tokens", "scores the prompt"},
                                         {R"("best_of":2)", "best_of", "out of range"},
                                         {R"("presence_penalty":1)", "presence_penalty", "not supported"}}) {
    e = ApiError();
    EXPECT_FALSE(ParseCompletionRequest(cmpl + c.extra + "}", Endpoint::kCompletion, &r, &e)) << c.extra;
    EXPECT_EQ(e.param, c.param) << c.extra;
    EXPECT_NE(e.message.find(c.words), std::string::npos) << c.extra << " -> " << e.message;
  }
}

TEST(OpenAiParse, LogprobsInBothApis) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true})",
                                     Endpoint::kChat, &r, &e)) << e.message;
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":20})",
      Endpoint::kChat, &r, &e)) << e.message;
  EXPECT_EQ(r.logprobs, 20);
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"p","logprobs":5})", Endpoint::kCompletion, &r, &e));
  EXPECT_EQ(r.logprobs, 5);
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"p","logprobs":0})", Endpoint::kCompletion, &r, &e));
  EXPECT_EQ(r.logprobs, 0);
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"p","logprobs":null})", Endpoint::kCompletion, &r, &e));
  EXPECT_EQ(r.logprobs, -1);
  // Scoring a prompt: echo with logprobs, nothing generated.
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":[5,6,7],"echo":true,"logprobs":3,"max_tokens":0})",
                                     Endpoint::kCompletion, &r, &e)) << e.message;
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.logprobs, 3);
  EXPECT_EQ(r.max_tokens, std::optional<int64_t>(0));
}

TEST(OpenAiJson, LogprobsShapes) {
  // "é" is two bytes: a token holding only its first byte keeps its raw byte
  // in "bytes" (the string itself cannot hold it).
  std::vector<TokenLogprob> toks(2);
  toks[0].token = "He";
  toks[0].logprob = -0.25;
  toks[0].top = {{"He", -0.25}, {"A", -2.0}};
  toks[0].text_offset = 0;
  toks[1].token = std::string("\xc3", 1);
  toks[1].logprob = -1.5;
  toks[1].top = {{"llo", -0.5}};
  toks[1].text_offset = 2;
  const json chat = LogprobsJson(Endpoint::kChat, toks);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], "He");
  EXPECT_EQ(chat["content"][0]["logprob"], -0.25);
  EXPECT_EQ(chat["content"][0]["bytes"], json::array({72, 101}));
  ASSERT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1], json({{"token", "A"}, {"logprob", -2.0}, {"bytes", {65}}}));
  EXPECT_EQ(chat["content"][1]["bytes"], json::array({0xc3}));
  EXPECT_TRUE(chat["refusal"].is_null());
  // The dump never throws on the lone byte (it becomes U+FFFD).
  EXPECT_NE(SseData(chat).find("\xEF\xBF\xBD"), std::string::npos);
  const json cmpl = LogprobsJson(Endpoint::kCompletion, toks);
  EXPECT_EQ(cmpl["tokens"][0], "He");
  EXPECT_EQ(cmpl["token_logprobs"], json::array({-0.25, -1.5}));
  EXPECT_EQ(cmpl["text_offset"], json::array({0, 2}));
  EXPECT_EQ(cmpl["top_logprobs"][0], json({{"He", -0.25}, {"A", -2.0}}));
  EXPECT_EQ(cmpl["top_logprobs"][1].size(), 2u);  // the chosen token joins the top ones
  // Into a response and a chunk; without, the field is null.
  ResponseMeta m{Endpoint::kChat, "chatcmpl-1", 1, "m", ""};
  EXPECT_EQ(ResponseJson(m, "Hé", "stop", Usage{}, nullptr, chat)["choices"][0]["logprobs"], chat);
  EXPECT_TRUE(ResponseJson(m, "Hé", "stop", Usage{}, nullptr)["choices"][0]["logprobs"].is_null());
  // The route extension (myriad serve --edge): present only when named.
  EXPECT_FALSE(ResponseJson(m, "x", "stop", Usage{}, nullptr).contains("route"));
  ResponseMeta routed = m;
  routed.route = "edge";
  EXPECT_EQ(ResponseJson(routed, "x", "stop", Usage{}, nullptr)["route"], "edge");
  EXPECT_EQ(ChunkJson(routed, "x", false, "")["route"], "edge");
  EXPECT_EQ(UsageChunkJson(routed, Usage{}, nullptr)["route"], "edge");
  EXPECT_EQ(ChunkJson(m, "He", false, "", chat)["choices"][0]["logprobs"], chat);
}

TEST(StopTextFilter, HoldsBackPossibleStartsAndCuts) {
  StopTextFilter f({"STOP", "\n\n"});
  EXPECT_EQ(f.Push("hello S"), "hello ");
  EXPECT_EQ(f.Push("T"), "");
  EXPECT_EQ(f.Push("x"), "STx");  // not a stop after all
  EXPECT_EQ(f.Push("ab\n"), "ab");
  EXPECT_EQ(f.Push("\nrest"), "");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.Push("more"), "");
  EXPECT_EQ(f.Flush(), "");
  StopTextFilter g({"STOP"});
  EXPECT_EQ(g.Push("end ST"), "end ");
  EXPECT_EQ(g.Flush(), "ST");  // the output ended: a partial stop is text
  StopTextFilter none({});
  EXPECT_EQ(none.Push("abc"), "abc");
}

TEST(Billing, PricesPerMillion) {
  PriceTable p;
  RequestCost c = PriceRequest(p, 1'000'000, 250'000, 2'000'000);
  EXPECT_EQ(c.miss_tokens, 750'000);
  EXPECT_EQ(c.hit_tokens, 250'000);
  EXPECT_NEAR(c.input_cache_miss, 0.675, 1e-12);
  EXPECT_NEAR(c.input_cache_hit, 0.02, 1e-12);
  EXPECT_NEAR(c.output, 7.2, 1e-12);
  EXPECT_NEAR(c.total(), 7.895, 1e-12);
  EXPECT_EQ(PriceRequest(p, 10, 50, 0).hit_tokens, 10);  // clamped
  TempDir dir("billing");
  std::ofstream(dir.path() + "/p.toml") << "[prices]\ninput_cache_miss = 2\noutput = 8\ncurrency = \"EUR\"\n";
  auto q = p.OverriddenFromToml(dir.path() + "/p.toml");
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->input_cache_miss, 2);
  EXPECT_EQ(q->input_cache_hit, 0.08);
  EXPECT_EQ(q->output, 8);
  EXPECT_EQ(q->currency, "EUR");
  std::ofstream(dir.path() + "/bad.toml") << "[prices]\noutptu = 8\n";
  auto b = p.OverriddenFromToml(dir.path() + "/bad.toml");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("outptu"), std::string::npos) << b.status().message();
  std::ofstream(dir.path() + "/neg.toml") << "[prices]\noutput = -1\n";
  EXPECT_FALSE(p.OverriddenFromToml(dir.path() + "/neg.toml").ok());
  BillingLedger ledger(p);
  ledger.Charge(100, 0, 10);
  ledger.Charge(100, 64, 10);
  EXPECT_EQ(ledger.totals().requests, 2);
  EXPECT_EQ(ledger.totals().cost.hit_tokens, 64);
  EXPECT_EQ(FormatMoney(1.5, "USD"), "$1.500000");
}

// Bodies that used to be 500s: a number beyond a double, invalid UTF-8
// (whose parse error quotes the bad bytes back into the error JSON).
TEST(OpenAiParse, HugeNumbersAndInvalidUtf8AreBadRequests) {
  CompletionRequest r;
  ApiError e;
  EXPECT_FALSE(ParseCompletionRequest(R"({"model":"m","prompt":"p","temperature":1e999})", Endpoint::kCompletion, &r, &e));
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_json");
  EXPECT_NE(e.message.find("1e999"), std::string::npos) << e.message;
  e = ApiError();
  EXPECT_FALSE(ParseCompletionRequest("{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}", Endpoint::kCompletion, &r, &e));
  EXPECT_EQ(e.status, 400);
  const std::string body = ErrorJson(e);  // must not throw on the quoted bytes
  EXPECT_TRUE(nlohmann::json::accept(body)) << body;
}

TEST(ChatTemplateTest, DefaultCustomAndStoredWithTheCheckpoint) {
  std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi {content}"}};
  EXPECT_EQ(*ChatTemplate().Render(msgs), "<|system|>\nBe brief.\n<|user|>\nHi {content}\n<|assistant|>\n");
  auto t = ChatTemplate::Parse("prefix = \"[\"\nmessage = \"{role}: {content}\\n\"\nuser = \"Q: {content}\\n\"\n"
                               "generation_prompt = \"A:\"\n", "t.toml");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t->Render(msgs), "[system: Be brief.\nQ: Hi {content}\nA:");
  EXPECT_FALSE(ChatTemplate::Parse("message = \"no content\"\n", "t.toml").ok());
  EXPECT_FALSE(ChatTemplate::Parse("mesage = \"{content}\"\n", "t.toml").ok());

  TempDir dir("chat_template");
  std::string step = dir.path() + "/run/step_00000010";
  std::filesystem::create_directories(step);
  std::string origin;
  std::ofstream(step + "/manifest.json") << R"({"step":10,"chat_template":{"generation_prompt":"Bot:"}})";
  auto fromManifest = ChatTemplate::ForCheckpoint(step, &origin);
  ASSERT_TRUE(fromManifest.ok()) << fromManifest.status().message();
  EXPECT_NE(origin.find("manifest.json"), std::string::npos);
  EXPECT_EQ(*fromManifest->Render({{"user", "x"}}), "<|user|>\nx\nBot:");
  std::ofstream(dir.path() + "/run/chat_template.toml") << "generation_prompt = \"Run:\"\n";
  auto fromRun = ChatTemplate::ForCheckpoint(step, &origin);
  ASSERT_TRUE(fromRun.ok());
  EXPECT_EQ(origin, dir.path() + "/run/chat_template.toml");
  EXPECT_EQ(*fromRun->Render({}), "Run:");
  std::ofstream(step + "/chat_template.toml") << "generation_prompt = \"Step:\"\n";
  EXPECT_EQ(*ChatTemplate::ForCheckpoint(step, &origin)->Render({}), "Step:");
  EXPECT_EQ(*ChatTemplate::ForCheckpoint(dir.path() + "/nowhere", &origin)->Render({}), "<|assistant|>\n");
  EXPECT_EQ(origin, "default");
}

// A Hugging Face folder's Jinja template: ForModel prefers it to the
// checkpoint's formats, renders with the generation prompt, writes its own
// bos, and a raise_exception is an error (the server's 400), not a prompt.
TEST(ChatTemplateTest, AHuggingFaceFoldersJinjaTemplate) {
  TempDir dir("chat_template_hf");
  const std::string hf = dir.path() + "/hf";
  std::filesystem::create_directories(hf);
  std::ofstream(hf + "/tokenizer_config.json") << R"({"bos_token": "<s>", "chat_template":
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"})";
  std::string origin;
  auto t = ChatTemplate::ForModel(dir.path() + "/nowhere", hf, &origin);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(origin, hf + "/tokenizer_config.json[chat_template] (Jinja)");  // the source the renderer names
  EXPECT_TRUE(t->writes_own_bos());
  EXPECT_EQ(*t->Render({{"user", "Hi"}}), "<s>[user] Hi\n[assistant] ");
  auto refused = t->Render({{"tool", "42"}});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("no tools here"), std::string::npos) << refused.status().message();
  // A folder without a template: the checkpoint's (here the default).
  auto plain = ChatTemplate::ForModel(dir.path() + "/nowhere", dir.path(), &origin);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->writes_own_bos());
  EXPECT_EQ(origin, "default");
}

}  // namespace
}  // namespace myriad::serve
