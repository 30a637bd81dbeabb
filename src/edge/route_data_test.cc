// The domain rules on hand-written prompts and on generated tasks; the
// prompt set's splits, determinism and JSONL round trip.
#include "edge/route_data.h"

#include <gtest/gtest.h>

#include <set>

#include "core/env.h"
#include "data/test_util.h"
#include "rl/tasks.h"

namespace myriad::edge {
namespace {

TEST(DomainRules, HandWrittenPrompts) {
  EXPECT_EQ(ClassifyDomain("37+45*2="), "arithmetic");
  EXPECT_EQ(ClassifyDomain(" (3 - 4) / 7 = "), "arithmetic");
  EXPECT_EQ(ClassifyDomain("use 3 5 7 make 22:"), "arithmetic");
  EXPECT_EQ(ClassifyDomain("12="), "chat");            // no operator
  EXPECT_EQ(ClassifyDomain("what is 2+2="), "chat");   // words: not an expression
  EXPECT_EQ(ClassifyDomain("# add 3 to x\ndef f(x):\n    return"), "code");
  EXPECT_EQ(ClassifyDomain("import os\nprint(os.getcwd())"), "code");
  EXPECT_EQ(ClassifyDomain("from a import b"), "code");
  EXPECT_EQ(ClassifyDomain("```\nls -l\n```"), "code");
  EXPECT_EQ(ClassifyDomain("# a heading\n  indented"), "code");
  EXPECT_EQ(ClassifyDomain("# not code"), "chat");
  EXPECT_EQ(ClassifyDomain("A fool and his money"), "chat");
  EXPECT_EQ(ClassifyDomain("天下大事，必作于细"), "chat");
  EXPECT_EQ(ClassifyDomain("Short note.\n\nSummarise the report:"), "business");
  EXPECT_EQ(ClassifyDomain("会议纪要如下。\n\n用一句话总结："), "business");
  const std::string longdoc(200, 'x');
  EXPECT_EQ(ClassifyDomain(longdoc + " the customer paid the invoice"), "business");
  EXPECT_EQ(ClassifyDomain(longdoc), "chat");                        // long, no cue
  EXPECT_EQ(ClassifyDomain("the customer is always right"), "chat");  // cue, but short
}

TEST(DomainRules, AgreeWithGeneratedTasks) {
  for (int d = 1; d <= 5; ++d) {
    auto t = rl::GenerateTasks("arithmetic", 50, d, 3, rl::Split::kTrain);
    ASSERT_TRUE(t.ok());
    for (const auto& x : *t) EXPECT_EQ(ClassifyDomain(x.prompt), "arithmetic") << x.prompt;
  }
  auto py = rl::GenerateTasks("python", 50, 1, 3, rl::Split::kTrain);
  ASSERT_TRUE(py.ok());
  for (const auto& x : *py) EXPECT_EQ(ClassifyDomain(x.prompt), "code") << x.prompt;
}

TEST(PromptSet, SplitsNeverShareATextAndAreDeterministic) {
  PromptSetOptions opt;
  opt.count = 120, opt.held_out_count = 60;
  for (int i = 0; i < 40; ++i)
    opt.business_docs.push_back("Quarterly report " + std::to_string(i) +
                                ": revenue rose, the customer Acme paid invoice INV-" + std::to_string(1000 + i) + ".");
  auto a = BuildPromptSet(opt);
  if (!a.ok() && a.status().message().find("no fortunes") != std::string::npos)
    GTEST_SKIP() << a.status().message();
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = BuildPromptSet(opt);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(a->size(), b->size());
  std::set<std::string> train, ids, texts;
  std::set<std::string> domains;
  int n_train = 0, agree = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    const RoutePrompt& p = (*a)[i];
    EXPECT_EQ(p.prompt, (*b)[i].prompt);
    EXPECT_TRUE(ids.insert(p.id).second) << p.id;
    EXPECT_TRUE(texts.insert(p.prompt).second) << p.id;
    domains.insert(p.domain);
    EXPECT_EQ(p.verifier.has_value(), p.domain == "arithmetic" || p.domain == "code") << p.id;
    if (p.split == "train") train.insert(p.prompt), ++n_train;
    agree += ClassifyDomain(p.prompt) == p.domain;
  }
  EXPECT_GE(n_train, 115);  // duplicates dropped
  EXPECT_LE(n_train, 120);
  EXPECT_GE(a->size(), 170u);
  for (const RoutePrompt& p : *a)
    if (p.split == "held_out") { EXPECT_FALSE(train.count(p.prompt)) << p.id; }
  EXPECT_EQ(domains, (std::set<std::string>{"arithmetic", "business", "chat", "code"}));
  EXPECT_GE(agree, static_cast<int>(0.9 * a->size()));
  // JSONL round trip.
  TempDir dir("route_data");
  ASSERT_TRUE(WritePromptsJsonl(dir.path() + "/p.jsonl", *a).ok());
  auto back = LoadPromptsJsonl(dir.path() + "/p.jsonl");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), a->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*back)[i].prompt, (*a)[i].prompt);
    EXPECT_EQ(PromptToJson((*back)[i]), PromptToJson((*a)[i]));
  }
}

TEST(RouteRecords, RoundTripAndErrorsNameTheLine) {
  RouteRecord r;
  r.prompt = {"train-x", "chat", "train", "hello", std::nullopt, 0};
  r.edge_answer = "a", r.remote_answer = "b", r.q_edge = 0.25, r.q_remote = 0.75, r.verdict = "cloud";
  r.features.embedding = {1.5f, -2.f};
  r.features.prompt_tokens = 3, r.features.probe_entropy = 1.25, r.features.probe_max_prob = 0.5;
  r.features.domain = "chat";
  TempDir dir("route_rec");
  const std::string path = dir.path() + "/v.jsonl";
  ASSERT_TRUE(WriteRecordsJsonl(path, {r, r}).ok());
  auto back = LoadRecordsJsonl(path);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ(RecordToJson((*back)[1]), RecordToJson(r));
  ASSERT_TRUE(WriteFileAtomic(Env::Default(), path, RecordToJson(r).dump() + "\n{\"id\": 3}\n").ok());
  auto bad = LoadRecordsJsonl(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("v.jsonl:2: \"id\": expected a string"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace myriad::edge
