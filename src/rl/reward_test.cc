// The verifiable rewards against answers that must and must not score,
// including attempts to game them; countdown against a brute-force oracle
// written here (every expression over a subset of the numbers); the spec
// parser's field-named errors.
#include "rl/reward.h"
#include "rl/tasks.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <set>

#include "core/rng.h"

namespace myriad::rl {
namespace {

RewardSpec Parse(const std::string& text) {
  auto s = ParseRewardSpec(nlohmann::json::parse(text));
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : RewardSpec{};
}

TEST(Reward, ExactMatchAfterNormalisation) {
  const RewardSpec s = Parse(R"({"kind":"exact","answer":"1234"})");
  for (const char* good : {"1234", " 1234 ", "1,234", "1234.0", "1234\nmore text", "so the answer: 1234",
                           "20*61+14=1234"})
    EXPECT_TRUE(Score(s, good).correct) << good;
  for (const char* bad : {"1235", "12345", "1234 1235", "1233 or 1234", "", "answer: 1234 no", "-1234",
                          "answer: 1234\nanswer: 99"})
    EXPECT_FALSE(Score(s, bad).correct) << bad;
  EXPECT_EQ(Score(s, "1235").reward, 0.0);
  EXPECT_FALSE(Score(s, "").parsed);
  // Words compare case-insensitively.
  EXPECT_TRUE(Score(Parse(R"({"kind":"exact","answer":"Paris"})"), "paris").correct);
}

// Every value reachable from a subset of `nums` with + - * / (exact
// rationals; each number at most once), the oracle's way: combine any two
// partial results, recursively.
void Reach(std::vector<std::pair<long long, long long>> vals, std::set<std::pair<long long, long long>>* out) {
  for (auto& v : vals) out->insert(v);
  for (size_t i = 0; i < vals.size(); ++i)
    for (size_t j = 0; j < vals.size(); ++j) {
      if (i == j) continue;
      auto [an, ad] = vals[i];
      auto [bn, bd] = vals[j];
      std::vector<std::pair<long long, long long>> cands = {
          {an * bd + bn * ad, ad * bd}, {an * bd - bn * ad, ad * bd}, {an * bn, ad * bd}};
      if (bn != 0) cands.push_back({an * bd, ad * bn});
      for (auto [n, d] : cands) {
        if (d < 0) n = -n, d = -d;
        long long g = std::gcd(n < 0 ? -n : n, d);
        if (g > 1) n /= g, d /= g;
        std::vector<std::pair<long long, long long>> next;
        for (size_t k = 0; k < vals.size(); ++k)
          if (k != i && k != j) next.push_back(vals[k]);
        next.push_back({n, d});
        Reach(next, out);
      }
    }
}

TEST(Reward, CountdownAgreesWithABruteForceOracle) {
  Rng rng(3);
  int checked = 0;
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<long long> nums = {static_cast<long long>(1 + rng.Below(9)), static_cast<long long>(1 + rng.Below(9)),
                                   static_cast<long long>(1 + rng.Below(9))};
    std::set<std::pair<long long, long long>> reach;
    std::vector<std::pair<long long, long long>> v;
    for (long long n : nums) v.push_back({n, 1});
    Reach(v, &reach);
    RewardSpec s;
    s.kind = RewardKind::kCountdown;
    s.numbers = nums;
    const std::string a = std::to_string(nums[0]), b = std::to_string(nums[1]), c = std::to_string(nums[2]);
    // Candidate expressions: each scores iff its value is the target and it
    // uses given numbers only (the oracle computes the value independently).
    for (const std::string& e : {a + "+" + b + "*" + c, "(" + a + "+" + b + ")*" + c, a + "*" + b + "-" + c,
                                 a + "/" + b + "+" + c, "(" + a + "-" + b + ")/" + c}) {
      auto val = EvaluateArithmetic(e);
      ASSERT_TRUE(val.ok()) << e;
      if (val->den != 1) continue;
      EXPECT_TRUE(reach.count({val->num, 1})) << e << " = " << val->num << " is not reachable per the oracle";
      s.target = val->num;
      EXPECT_TRUE(Score(s, e).correct) << e;
      EXPECT_TRUE(Score(s, " " + e + " = " + std::to_string(val->num)).correct) << e;
      s.target = val->num + 1;
      EXPECT_FALSE(Score(s, e).correct) << e;
      ++checked;
    }
    // The target alone, or a number not given, never scores.
    s.target = 10;
    EXPECT_FALSE(Score(s, "10").correct);
    EXPECT_FALSE(Score(s, a + "+" + b + "+" + c + "+" + a).correct) << "a number used twice";
  }
  EXPECT_GT(checked, 50);
}

TEST(Reward, CountdownRefusesReuseForeignNumbersAndMalformed) {
  const RewardSpec s = Parse(R"({"kind":"countdown","numbers":[3,5,7],"target":22})");
  EXPECT_TRUE(Score(s, "3*5+7").correct);
  EXPECT_TRUE(Score(s, "(7+5)+(3*5)-5").detail.find("used too often") != std::string::npos);
  EXPECT_FALSE(Score(s, "22").correct);
  EXPECT_FALSE(Score(s, "2*11").correct);
  EXPECT_FALSE(Score(s, "3*5+7+").parsed);
  EXPECT_FALSE(Score(s, "3*5+7/0").correct);
  EXPECT_FALSE(Score(s, "44/2").correct);
  EXPECT_FALSE(Score(s, "(((((((3*5+7").correct);
  // Fractions are exact: 7/(5/3)... and the target must be the exact value.
  const RewardSpec f = Parse(R"({"kind":"countdown","numbers":[1,3,4,6],"target":24})");
  EXPECT_TRUE(Score(f, "6/(1-3/4)").correct);
  EXPECT_FALSE(Score(f, "6/(1-3/4)+1/3").correct);
}

TEST(Reward, ToolCallNeedsTheRightToolAndArguments) {
  const RewardSpec s = Parse(
      R"({"kind":"tool_call","tool":"get_weather","arguments":{"city":"Lima","unit":"celsius"},
          "schema":{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]}},
                    "required":["city","unit"],"additionalProperties":false}})");
  EXPECT_TRUE(Score(s, R"({"name":"get_weather","arguments":{"city":"Lima","unit":"celsius"}})").correct);
  EXPECT_TRUE(Score(s, R"( {"arguments":{"unit":"celsius","city":"Lima"},"name":"get_weather"} )").correct);
  for (const char* bad : {
           R"({"name":"get_time","arguments":{"city":"Lima","unit":"celsius"}})",
           R"({"name":"get_weather","arguments":{"city":"Lima"}})",
           R"({"name":"get_weather","arguments":{"city":"Lima","unit":"kelvin"}})",
           R"({"name":"get_weather","arguments":{"city":"Lima","unit":"celsius","x":1}})",
           R"({"name":"get_weather","arguments":{"city":"Quito","unit":"celsius"}})",
           R"({"name":"get_weather","arguments":{"city":"Lima","unit":"celsius"},"extra":true})",
           R"({"name":"get_weather","arguments":"city=Lima"})", R"(get_weather(city="Lima"))",
           R"([{"name":"get_weather","arguments":{"city":"Lima","unit":"celsius"}}])", ""})
    EXPECT_FALSE(Score(s, bad).correct) << bad;
  // Integers are compared exactly, and types against the schema.
  const RewardSpec t = Parse(R"({"kind":"tool_call","tool":"set_timer","arguments":{"minutes":17},
                                 "schema":{"type":"object","properties":{"minutes":{"type":"integer"}}}})");
  EXPECT_TRUE(Score(t, R"({"name":"set_timer","arguments":{"minutes":17}})").correct);
  EXPECT_FALSE(Score(t, R"({"name":"set_timer","arguments":{"minutes":"17"}})").correct);
  EXPECT_FALSE(Score(t, R"({"name":"set_timer","arguments":{"minutes":17.5}})").correct);
}

const char* kPySpec = R"({"kind":"python","entry":"f","prefix":"def f(x):\n    return",
    "tests":["assert f(2) == 5","assert f(-1) == -1","assert f(10) == 21"]})";

TEST(Reward, PythonRunsTheTestsInTheSandbox) {
  const RewardSpec s = Parse(kPySpec);
  RewardResult ok = Score(s, " 2 * x + 1\n");
  EXPECT_TRUE(ok.correct) << ok.detail;
  EXPECT_EQ(ok.reward, 1.0);
  RewardResult part = Score(s, " 5 if x == 2 else 0\n");
  EXPECT_FALSE(part.correct);
  EXPECT_NEAR(part.reward, 1.0 / 3, 1e-12) << part.detail;
  EXPECT_EQ(Score(s, " (\n").reward, 0.0);  // a syntax error
}

TEST(Reward, PythonGamingAttemptsScoreZero) {
  const RewardSpec s = Parse(kPySpec);
  struct Case {
    const char* name;
    std::string completion;
  };
  const std::vector<Case> cases = {
      {"prints the expected output", " None\nprint('ok 3/3 PASS')\n"},
      {"exits before the tests", " None\nimport sys; sys.exit(0)\n"},
      {"hard exit", " None\nimport os; os._exit(0)\n"},
      {"writes fake results to fd 3", " None\nimport os\nfor i in range(3): os.write(3, b'%d pass\\n' % i)\n"},
      {"swallows AssertionError via builtins",
       " None\nimport builtins\nclass E(Exception): pass\nbuiltins.AssertionError = E\n"},
      {"forks", " None\nimport os\nwhile True:\n    try: os.fork()\n    except OSError: break\n"},
      {"writes outside its directory", " None\nopen('/tmp/myriad-reward-escape', 'w').write('x')\n"},
      {"huge output", " None\nimport sys\nsys.stdout.write('x' * (64 << 20))\n"},
  };
  for (const Case& c : cases) {
    RewardResult r = Score(s, c.completion);
    EXPECT_FALSE(r.correct) << c.name << ": " << r.detail;
    EXPECT_EQ(r.reward, 0.0) << c.name << ": " << r.detail;
  }
  FILE* f = std::fopen("/tmp/myriad-reward-escape", "r");
  EXPECT_EQ(f, nullptr) << "the sandboxed program wrote outside its scratch directory";
  if (f) std::fclose(f);
}

TEST(Reward, PythonInfiniteLoopTimesOutToZero) {
  RewardSpec s = Parse(kPySpec);
  s.timeout_s = 0.5;
  const auto t0 = std::chrono::steady_clock::now();
  RewardResult r = Score(s, " x\nwhile True: pass\n");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.reward, 0.0);
  EXPECT_EQ(r.detail, "timeout");
  EXPECT_LT(secs, 10.0) << "the time limit did not stop the program";
}

TEST(Reward, PenaltiesApplyAndClamp) {
  const RewardSpec s = Parse(R"({"kind":"exact","answer":"7"})");
  RewardOptions o;
  o.format_penalty = 0.25;
  EXPECT_EQ(Score(s, "", o).reward, -0.25);
  EXPECT_EQ(Score(s, "7", o).reward, 1.0);
  o.max_chars = 3;
  o.length_penalty = 0.1;
  EXPECT_NEAR(Score(s, "7     ", o).reward, 1.0 - 0.3, 1e-12);
  EXPECT_EQ(Score(s, std::string(100, ' ') + "8", o).reward, -1.0);
}

TEST(Reward, SpecErrorsNameTheField) {
  struct Case {
    const char* json;
    const char* error;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"kind":"foo"})", "reward.kind: unknown kind 'foo' (expected exact, countdown, python or tool_call)"},
           {R"({"answer":"1"})", "reward.kind: missing"},
           {R"({"kind":"exact"})", "reward.answer: missing"},
           {R"({"kind":"exact","answer":1})", "reward.answer: expected a string"},
           {R"({"kind":"countdown","numbers":[1,"2"],"target":3})", "reward.numbers: expected"},
           {R"({"kind":"countdown","numbers":[1,2]})", "reward.target: missing"},
           {R"({"kind":"python","entry":"f","tests":"assert 1"})", "reward.tests: expected"},
           {R"({"kind":"python","entry":"f","tests":["assert 1"],"timeout_s":0})", "reward.timeout_s"},
           {R"({"kind":"tool_call","tool":"t","arguments":[1]})", "reward.arguments: expected an object"},
           {R"([1,2])", "reward: expected an object"}}) {
    auto s = ParseRewardSpec(nlohmann::json::parse(c.json));
    ASSERT_FALSE(s.ok()) << c.json;
    EXPECT_NE(s.status().message().find(c.error), std::string::npos) << s.status().message();
  }
}

TEST(Reward, SpecJsonRoundTrips) {
  for (const char* j : {R"({"kind":"exact","answer":"12"})", R"({"kind":"countdown","numbers":[3,5,7],"target":22})",
                        kPySpec,
                        R"({"kind":"tool_call","tool":"t","arguments":{"a":1},"schema":{"type":"object"}})"}) {
    const RewardSpec a = Parse(j);
    auto b = ParseRewardSpec(RewardSpecToJson(a));
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_EQ(RewardSpecToJson(*b), RewardSpecToJson(a));
  }
}

}  // namespace
}  // namespace myriad::rl

namespace myriad::rl {
namespace {

// A generated Python task cannot be passed by shadowing `type` (or `int`) in
// the module the tests run in and returning an object equal to everything.
TEST(Reward, GeneratedPythonTestsResistShadowedTypeChecks) {
  auto tasks = GenerateTasks("python", 3, 1, 21, Split::kTrain);
  ASSERT_TRUE(tasks.ok()) << tasks.status().message();
  for (const Task& t : *tasks) {
    const std::string body = t.reference.substr(0, t.reference.size() - 1);
    EXPECT_TRUE(Score(t.reward, body).correct) << t.id;
    const std::string forged =
        " Yes()\nclass Yes(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
        "import builtins\ntype = lambda r: int\nint = object\nbuiltins.type = lambda r: bool\n"
        "str = object\nbool = object\n";
    RewardResult r = Score(t.reward, forged);
    EXPECT_FALSE(r.correct) << t.id << ": " << r.detail;
  }
}

}  // namespace
}  // namespace myriad::rl
