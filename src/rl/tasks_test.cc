// The built-in tasks: every reference answer scores 1 under its own spec
// (the python ones in the sandbox), splits are disjoint and deterministic,
// difficulty changes the problems, JSONL round-trips and malformed lines are
// errors with their line number.
#include "rl/tasks.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

namespace myriad::rl {
namespace {

TEST(Tasks, EveryReferenceScoresOne) {
  for (auto [domain, n, d] : std::vector<std::tuple<std::string, int, int>>{
           {"arithmetic", 300, 1}, {"arithmetic", 300, 3}, {"arithmetic", 300, 5}, {"countdown", 200, 2},
           {"countdown", 100, 4}, {"tool_call", 200, 1}, {"python", 40, 1}}) {
    for (Split split : {Split::kTrain, Split::kHeldOut}) {
      auto tasks = GenerateTasks(domain, n, d, 11, split);
      ASSERT_TRUE(tasks.ok()) << domain << ": " << tasks.status().message();
      ASSERT_EQ(static_cast<int>(tasks->size()), n) << domain;
      for (const Task& t : *tasks) {
        ASSERT_FALSE(t.reference.empty()) << t.id;
        EXPECT_EQ(t.reference.back(), '\n') << t.id;
        RewardResult r = Score(t.reward, t.reference.substr(0, t.reference.size() - 1));
        EXPECT_TRUE(r.correct) << t.id << " " << t.prompt << t.reference << ": " << r.detail;
        EXPECT_EQ(t.domain, domain);
      }
    }
  }
}

TEST(Tasks, ArithmeticReferencesAreTheValues) {
  // An independent evaluation: difficulty 1 is "a+b".
  auto tasks = GenerateTasks("arithmetic", 200, 1, 5, Split::kTrain);
  ASSERT_TRUE(tasks.ok());
  for (const Task& t : *tasks) {
    long long a = 0, b = 0;
    ASSERT_EQ(std::sscanf(t.prompt.c_str(), "%lld+%lld=", &a, &b), 2) << t.prompt;
    EXPECT_EQ(t.reference, std::to_string(a + b) + "\n") << t.prompt;
  }
}

TEST(Tasks, SplitsAreDisjointAndDeterministic) {
  for (const char* domain : {"arithmetic", "countdown", "python", "tool_call"}) {
    const int d = std::string(domain) == "countdown" ? 3 : 1;
    auto tr = GenerateTasks(domain, 400, d, 1, Split::kTrain);
    auto ho = GenerateTasks(domain, 100, d, 1, Split::kHeldOut);
    auto tr2 = GenerateTasks(domain, 400, d, 1, Split::kTrain);
    auto other_seed = GenerateTasks(domain, 400, d, 2, Split::kHeldOut);
    ASSERT_TRUE(tr.ok() && ho.ok() && tr2.ok() && other_seed.ok()) << domain;
    std::set<std::string> train;
    for (const Task& t : *tr) train.insert(t.prompt);
    for (const Task& t : *ho) EXPECT_FALSE(train.count(t.prompt)) << domain << ": " << t.prompt << " in both";
    for (const Task& t : *other_seed) EXPECT_FALSE(train.count(t.prompt)) << domain << ": seed 2 " << t.prompt;
    ASSERT_EQ(tr->size(), tr2->size());
    for (size_t i = 0; i < tr->size(); ++i) {
      EXPECT_EQ((*tr)[i].prompt, (*tr2)[i].prompt);
      EXPECT_EQ(RewardSpecToJson((*tr)[i].reward), RewardSpecToJson((*tr2)[i].reward));
    }
    std::set<std::string> ids;
    for (const Task& t : *tr) EXPECT_TRUE(ids.insert(t.id).second) << "duplicate id " << t.id;
  }
}

TEST(Tasks, DifficultyGradesTheProblems) {
  auto mean_len = [](const std::string& domain, int d) {
    auto t = GenerateTasks(domain, 200, d, 3, Split::kTrain);
    EXPECT_TRUE(t.ok());
    double s = 0;
    for (const Task& x : *t) s += domain == "countdown" ? x.reward.numbers.size() : x.prompt.size();
    return s / 200;
  };
  EXPECT_LT(mean_len("arithmetic", 1), mean_len("arithmetic", 3));
  EXPECT_LT(mean_len("arithmetic", 3), mean_len("arithmetic", 5));
  EXPECT_EQ(mean_len("countdown", 2), 2);
  EXPECT_EQ(mean_len("countdown", 5), 5);
}

TEST(Tasks, UnknownDomainAndDifficultyAreErrors) {
  auto a = GenerateTasks("chess", 1, 1, 1, Split::kTrain);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("chess"), std::string::npos) << a.status().message();
  auto b = GenerateTasks("arithmetic", 1, 9, 1, Split::kTrain);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("difficulty"), std::string::npos) << b.status().message();
}

TEST(Tasks, JsonlRoundTripsAndErrorsNameTheLine) {
  const std::string dir = ::testing::TempDir() + "/tasks_jsonl";
  std::filesystem::create_directories(dir);
  auto tasks = GenerateTasks("tool_call", 20, 1, 4, Split::kTrain);
  ASSERT_TRUE(tasks.ok());
  auto py = GenerateTasks("python", 5, 1, 4, Split::kTrain);
  ASSERT_TRUE(py.ok());
  for (auto& t : *py) tasks->push_back(t);
  ASSERT_TRUE(WriteTasksJsonl(dir + "/t.jsonl", *tasks).ok());
  auto back = LoadTasksJsonl(dir + "/t.jsonl");
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->size(), tasks->size());
  for (size_t i = 0; i < tasks->size(); ++i) {
    EXPECT_EQ((*back)[i].id, (*tasks)[i].id);
    EXPECT_EQ((*back)[i].prompt, (*tasks)[i].prompt);
    EXPECT_EQ((*back)[i].reference, (*tasks)[i].reference);
    EXPECT_EQ(RewardSpecToJson((*back)[i].reward), RewardSpecToJson((*tasks)[i].reward));
  }
  struct Case {
    std::string text, error;
  };
  for (const Case& c : std::vector<Case>{
           {"{\"prompt\":\"1+1=\",\"reward\":{\"kind\":\"exact\",\"answer\":\"2\"}}\n{not json\n", "bad.jsonl:2:"},
           {"{\"prompt\":\"1+1=\",\"reward\":{\"kind\":\"nope\"}}\n", "bad.jsonl:1: reward.kind: unknown kind"},
           {"{\"reward\":{\"kind\":\"exact\",\"answer\":\"2\"}}\n", "bad.jsonl:1:"},
           {"\n\n{\"prompt\":\"x\"}\n", "bad.jsonl:3:"}}) {
    std::ofstream(dir + "/bad.jsonl") << c.text;
    auto r = LoadTasksJsonl(dir + "/bad.jsonl");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.error), std::string::npos) << r.status().message();
  }
  auto missing = LoadTasksJsonl(dir + "/none.jsonl");
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace myriad::rl
