// ChatTemplate: reading Hugging Face model folders, and our renditions of
// the four families' templates (tests/hf/templates/) against prompts
// written by hand from the formats' documentation.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>

#include "core/env.h"
#include "data/test_util.h"

namespace myriad {
namespace {

using ojson = nlohmann::ordered_json;

void Write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

ChatTemplate Family(const std::string& file, std::map<std::string, std::string> tokens) {
  const std::string path = SourceDirForTests() + "/tests/hf/templates/" + file;
  auto text = Env::Default()->ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status().message() << " (MYRIAD_SOURCE_DIR unset?)";
  auto ct = ChatTemplate::FromString(text.ok() ? text.value() : "", file, std::move(tokens));
  EXPECT_TRUE(ct.ok()) << ct.status().message();
  return std::move(ct).value();
}

std::string MustRender(const ChatTemplate& ct, const ojson& messages, bool agp, const ojson& extra = ojson::object()) {
  auto r = ct.Render(messages, agp, extra);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? r.value() : "";
}

TEST(ChatTemplateTest, Llama3ClosedForm) {
  ChatTemplate ct = Family("llama3.jinja", {{"bos_token", "<|begin_of_text|>"}});
  ct.set_clock([] {
    std::tm tm{};
    tm.tm_year = 2025 - 1900;
    tm.tm_mon = 2;
    tm.tm_mday = 5;
    return tm;
  });
  const ojson messages = {{{"role", "system"}, {"content", " Be brief. "}}, {{"role", "user"}, {"content", "Hi\n"}}};
  EXPECT_EQ(MustRender(ct, messages, true),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 05 Mar 2025\n\n"
            "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Qwen2ClosedForm) {
  ChatTemplate ct = Family("qwen2.jinja", {});
  EXPECT_EQ(MustRender(ct, {{{"role", "user"}, {"content", "Hi"}}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const ojson tool_turns = {{{"role", "user"}, {"content", "Q"}},
                            {{"role", "assistant"},
                             {"content", nullptr},
                             {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", {{"x", 1}}}}}}}}},
                            {{"role", "tool"}, {"content", "r1"}},
                            {{"role", "tool"}, {"content", "r2"}}};
  EXPECT_EQ(MustRender(ct, tool_turns, false),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
            "{\"x\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n"
            "<tool_response>\nr2\n</tool_response><|im_end|>\n");
}

TEST(ChatTemplateTest, Qwen3ClosedFormThinking) {
  ChatTemplate ct = Family("qwen3.jinja", {});
  const ojson answered = {{{"role", "user"}, {"content", "Hi"}},
                          {{"role", "assistant"}, {"content", "Hello"}, {"reasoning_content", "\nr\n"}}};
  EXPECT_EQ(MustRender(ct, answered, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nHello<|im_end|>\n");
  // The reasoning of an answer before the last query is dropped.
  ojson later = answered;
  later.push_back({{"role", "user"}, {"content", "More"}});
  EXPECT_EQ(MustRender(ct, later, true, {{"enable_thinking", false}}),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
            "<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplateTest, DeepSeekV3ClosedForm) {
  ChatTemplate ct = Family("deepseek_v3.jinja", {{"bos_token", "<｜begin▁of▁sentence｜>"}});
  const ojson messages = {{{"role", "system"}, {"content", "S"}},
                          {{"role", "user"}, {"content", "Hi"}},
                          {{"role", "assistant"}, {"content", "<think>x</think>Yo"}},
                          {{"role", "user"}, {"content", "Again"}}};
  EXPECT_EQ(MustRender(ct, messages, true),
            "<｜begin▁of▁sentence｜>S<｜User｜>Hi<｜Assistant｜>Yo<｜end▁of▁sentence｜><｜User｜>Again<｜Assistant｜>");
}

TEST(ChatTemplateTest, VariablesAreThoseOfApplyChatTemplate) {
  auto ct = ChatTemplate::FromString("x", "t", {{"bos_token", "<s>"}});
  ASSERT_TRUE(ct.ok());
  const ojson v = ct->Variables(ojson::array(), true, {{"tools", {1}}, {"enable_thinking", false}});
  EXPECT_EQ(v.dump(), R"({"messages":[],"tools":[1],"documents":null,"add_generation_prompt":true,)"
                      R"("bos_token":"<s>","enable_thinking":false})");
}

TEST(ChatTemplateTest, KeyOrderFollowsTheJsonType) {
  auto ct = ChatTemplate::FromString("{{ tools | tojson }}", "t");
  ASSERT_TRUE(ct.ok());
  const std::string text = R"({"tools": [{"b": 1, "a": 2}]})";
  EXPECT_EQ(ct->Render(ojson::array(), false, ojson::parse(text)).value(), R"([{"b": 1, "a": 2}])");
  EXPECT_EQ(ct->Render(nlohmann::json::array(), false, nlohmann::json::parse(text)).value(), R"([{"a": 2, "b": 1}])");
}

TEST(ChatTemplateTest, FromHfDirReadsTokenizerAndGenerationConfig) {
  TempDir dir("chat_hf");
  Write(dir.path() + "/tokenizer_config.json",
        R"({"bos_token": {"__type": "AddedToken", "content": "<B>", "lstrip": false}, "eos_token": "<E>",
            "pad_token": null, "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"})");
  Write(dir.path() + "/generation_config.json", R"({"eos_token_id": [7, 9]})");
  auto ct = ChatTemplate::FromHfDir(dir.path());
  ASSERT_TRUE(ct.ok()) << ct.status().message();
  EXPECT_EQ(ct->bos_token(), "<B>");
  EXPECT_EQ(ct->eos_token(), "<E>");
  EXPECT_EQ(ct->special_tokens().count("pad_token"), 0u);
  EXPECT_EQ(ct->eos_token_ids(), (std::vector<int64_t>{7, 9}));
  EXPECT_EQ(ct->Render(ojson::parse(R"([{"role": "user", "content": "hi"}])"), false).value(), "<B>[hi]<E>");

  Write(dir.path() + "/generation_config.json", R"({"eos_token_id": 2})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path())->eos_token_ids(), (std::vector<int64_t>{2}));
}

TEST(ChatTemplateTest, FromHfDirPicksTheNamedTemplateAndPrefersTemplateFiles) {
  TempDir dir("chat_hf");
  Write(dir.path() + "/tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path())->Render(ojson::array(), false).value(), "D");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path(), "tool_use")->Render(ojson::array(), false).value(), "T");
  Write(dir.path() + "/chat_template.json", R"({"chat_template": "J"})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path())->Render(ojson::array(), false).value(), "J");
  Write(dir.path() + "/chat_template.jinja", "F\n");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path())->Render(ojson::array(), false).value(), "F");
}

TEST(ChatTemplateTest, FromHfDirErrorsNameTheFile) {
  TempDir dir("chat_hf");
  const std::string cfg = dir.path() + "/tokenizer_config.json";
  Write(cfg, R"({"eos_token": "</s>"})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path()).status().message(),
            dir.path() + ": no chat template (looked for chat_template.jinja, chat_template.json and \"chat_template\" "
                         "in tokenizer_config.json; hint: a base model may have none)");
  Write(cfg, R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path()).status().message(),
            cfg + "[chat_template] has no template named 'default' (it has: tool_use)");
  Write(cfg, R"({"chat_template": "x", "bos_token": 5})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path()).status().message(),
            cfg + ": bos_token must be a string or an object with a string \"content\", got 5");
  Write(cfg, R"({"chat_template": "ok\n{{ messages | frob }}"})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path()).status().message(),
            cfg + "[chat_template]:2:15: no filter named 'frob'");
  Write(cfg, R"({"chat_template": [{"name": "default", "template": "{% for %}"}]})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path()).status().message(),
            cfg + "[chat_template:default]:1:8: expected a variable name, got '%}'");
  Write(cfg, R"({"chat_template": "x"})");
  Write(dir.path() + "/generation_config.json", R"({"eos_token_id": "2"})");
  EXPECT_EQ(ChatTemplate::FromHfDir(dir.path()).status().message(),
            dir.path() + "/generation_config.json: eos_token_id must be an integer or a list of integers, got \"2\"");
  Write(cfg, "{not json");
  EXPECT_NE(ChatTemplate::FromHfDir(dir.path()).status().message().find(cfg + ": not valid JSON: "), std::string::npos);
}

TEST(ChatTemplateTest, RenderRejectsNonListMessages) {
  auto ct = ChatTemplate::FromString("x", "t");
  ASSERT_TRUE(ct.ok());
  EXPECT_EQ(ct->Render(ojson::object(), false).status().message(), "t: messages must be a JSON list, got object");
}

}  // namespace
}  // namespace myriad
