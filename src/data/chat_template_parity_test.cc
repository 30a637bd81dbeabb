// Parity of our chat-template renderer with two independent renderers:
// Hugging Face's @huggingface/jinja (pinned in tests/hf/js/, run with node)
// and Python's jinja2 in the environment transformers renders chat
// templates with (tests/hf/render_chat_jinja2.py). Every conversation and
// edge-case template of tests/hf/chat_cases.json is rendered here, written
// with the exact variables to a file, rendered by each reference, and the
// outputs must agree byte for byte; a difference fails with the first
// differing place of both strings, escaped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/chat_template.h"
#include "data/jinja_text.h"
#include "data/test_util.h"

namespace myriad {
namespace {

using ojson = nlohmann::ordered_json;

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::tm FixedClock(const ojson& clock) {
  std::tm tm{};
  tm.tm_year = clock[0].get<int>() - 1900;
  tm.tm_mon = clock[1].get<int>() - 1;
  tm.tm_mday = clock[2].get<int>();
  tm.tm_hour = clock[3].get<int>();
  tm.tm_min = clock[4].get<int>();
  tm.tm_sec = clock[5].get<int>();
  std::tm copy = tm;
  std::mktime(&copy);  // fills in the weekday and day of the year
  tm.tm_wday = copy.tm_wday;
  tm.tm_yday = copy.tm_yday;
  return tm;
}

struct Case {
  std::string id;
  std::string family;  // empty for edge-case templates
  std::string template_path;
  ojson variables;
  std::vector<std::string> oracles;
  std::string expect_error;  // the message after "name:line:column: "
  bool ok = false;           // our result
  std::string text;          // our output, or our error
};

// Everything rendered once per run, in a folder (cases.json for the
// oracles, ours.json, the oracles' outputs) that is kept when a comparison
// fails, so that the outputs can be diffed, and removed otherwise.
struct Suite {
  std::string error;  // why the suite could not be set up
  std::vector<Case> cases;
  std::string dir;
  std::string spec_path;  // the cases with their variables, for the oracles
  bool keep = false;
  ~Suite() {
    if (!dir.empty() && !keep) std::filesystem::remove_all(dir);
  }
};

std::string Message(const Status& s) { return s.message(); }

Suite& GetSuite() {
  static std::unique_ptr<Suite> suite = [] {
    auto s = std::make_unique<Suite>();
    const std::string src = SourceDirForTests();
    if (src.empty()) {
      s->error = "the source folder is unknown: set MYRIAD_SOURCE_DIR (ctest sets it)";
      return s;
    }
    const ojson spec = ojson::parse(ReadAll(src + "/tests/hf/chat_cases.json"));
    const std::tm clock = FixedClock(spec["clock"]);
    jinja::RenderOptions options;
    options.now = [clock] { return clock; };
    const std::string templates = src + "/tests/hf/templates/";
    auto add = [&](Case c, const ojson& entry) {
      if (entry.contains("oracles")) c.oracles = entry["oracles"].get<std::vector<std::string>>();
      else c.oracles = {"hf", "python"};
      if (entry.contains("expect_error")) c.expect_error = entry["expect_error"].get<std::string>();
      s->cases.push_back(std::move(c));
    };
    for (const auto& fam : spec["families"]) {
      const std::string path = templates + fam["template"].get<std::string>();
      auto ct = ChatTemplate::FromString(ReadAll(path), "tests/hf/templates/" + fam["template"].get<std::string>(),
                                         fam["special_tokens"].get<std::map<std::string, std::string>>());
      if (!ct.ok()) {
        s->error = Message(ct.status());
        return s;
      }
      ct->set_clock(options.now);
      for (const auto& conv : fam["conversations"]) {
        Case c;
        c.family = fam["family"].get<std::string>();
        c.id = c.family + "/" + conv["id"].get<std::string>();
        c.template_path = path;
        const ojson extra = conv.contains("extra") ? conv["extra"] : ojson::object();
        const bool agp = conv["add_generation_prompt"].get<bool>();
        c.variables = ct->Variables(conv["messages"], agp, extra);
        auto r = ct->Render(conv["messages"], agp, extra);
        c.ok = r.ok();
        c.text = r.ok() ? r.value() : Message(r.status());
        add(std::move(c), conv);
      }
    }
    for (const auto& e : spec["edge"]) {
      Case c;
      c.id = "edge/" + e["id"].get<std::string>();
      c.template_path = templates + e["template"].get<std::string>();
      c.variables = e["variables"];
      auto t = jinja::Template::Parse(ReadAll(c.template_path), "tests/hf/templates/" + e["template"].get<std::string>());
      if (t.ok()) {
        auto r = t->Render(c.variables, options);
        c.ok = r.ok();
        c.text = r.ok() ? r.value() : Message(r.status());
      } else {
        c.text = Message(t.status());
      }
      add(std::move(c), e);
    }
    ojson out = {{"clock", spec["clock"]}, {"cases", ojson::array()}};
    for (const Case& c : s->cases) {
      out["cases"].push_back({{"id", c.id}, {"template_path", c.template_path}, {"variables", c.variables},
                              {"oracles", c.oracles}});
    }
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/myriad_chat_parity_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      s->error = "mkdtemp failed for " + pattern;
      return s;
    }
    s->dir = pattern;
    s->spec_path = s->dir + "/cases.json";
    std::ofstream(s->spec_path) << out.dump();
    ojson ours = ojson::array();
    for (const Case& c : s->cases) ours.push_back({{"id", c.id}, {c.ok ? "output" : "error", c.text}});
    std::ofstream(s->dir + "/ours.json") << ours.dump(1);
    return s;
  }();
  return *suite;
}

// Where two strings first differ, with both shown around it, escaped.
std::string FirstDifference(const std::string& ours, const std::string& theirs) {
  size_t i = 0;
  while (i < ours.size() && i < theirs.size() && ours[i] == theirs[i]) ++i;
  while (i > 0 && i < ours.size() && (static_cast<unsigned char>(ours[i]) & 0xC0) == 0x80) --i;
  const size_t line = 1 + static_cast<size_t>(std::count(ours.begin(), ours.begin() + i, '\n'));
  const size_t from = i > 40 ? i - 40 : 0;
  auto around = [&](const std::string& s) {
    size_t b = from;
    while (b > 0 && b < s.size() && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
    return jinja::EscapeForMessage(s.substr(std::min(b, s.size())), 90);
  };
  std::ostringstream os;
  os << "first difference at byte " << i << " (line " << line << "; ours " << ours.size() << " bytes, theirs "
     << theirs.size() << " bytes), from byte " << from << ":\n  ours:   " << around(ours)
     << "\n  theirs: " << around(theirs);
  return os.str();
}

// Runs `command`, which must write the oracle's results to `out_path`.
void CompareWithOracle(const std::string& oracle, const std::string& command, const std::string& out_path) {
  Suite& s = GetSuite();
  const int failures_before = ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
  ASSERT_TRUE(s.error.empty()) << s.error;
  const std::string err_path = out_path + ".stderr";
  const int rc = std::system((command + " 2>" + err_path).c_str());
  ASSERT_EQ(rc, 0) << oracle << " failed (" << command << "): " << ReadAll(err_path);
  const ojson results = ojson::parse(ReadAll(out_path));
  std::map<std::string, ojson> by_id;
  for (const auto& r : results["results"]) by_id[r["id"].get<std::string>()] = r;
  int compared = 0;
  for (const Case& c : s.cases) {
    if (std::find(c.oracles.begin(), c.oracles.end(), oracle) == c.oracles.end()) continue;
    ++compared;
    auto it = by_id.find(c.id);
    ASSERT_NE(it, by_id.end()) << c.id << ": no result from " << results["renderer"];
    const ojson& r = it->second;
    if (!c.expect_error.empty()) {
      EXPECT_TRUE(r.contains("error")) << c.id << ": " << results["renderer"] << " rendered what should fail: "
                                       << jinja::EscapeForMessage(r.value("output", ""), 200);
      continue;
    }
    if (r.contains("error")) {
      ADD_FAILURE() << c.id << ": " << results["renderer"] << " failed: " << r["error"].get<std::string>();
      continue;
    }
    if (!c.ok) continue;  // reported by RendersEveryCase
    const std::string theirs = r["output"].get<std::string>();
    EXPECT_TRUE(c.text == theirs) << c.id << " differs from " << results["renderer"] << ": "
                                  << FirstDifference(c.text, theirs);
  }
  EXPECT_GT(compared, 0);
  if (::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() > failures_before) {
    s.keep = true;
    ADD_FAILURE() << "outputs kept in " << s.dir << " (ours.json, " << oracle << ".json, cases.json)";
  }
  std::printf("%s: %d cases compared with %s\n", oracle.c_str(), compared,
              results["renderer"].get<std::string>().c_str());
}

TEST(ChatTemplateParity, RendersEveryCase) {
  const Suite& s = GetSuite();
  ASSERT_TRUE(s.error.empty()) << s.error;
  std::map<std::string, int> rendered_per_family;
  for (const Case& c : s.cases) {
    if (!c.expect_error.empty()) {
      ASSERT_FALSE(c.ok) << c.id << " rendered, expected the error " << c.expect_error;
      const std::string tail = ": " + c.expect_error;
      EXPECT_TRUE(c.text.size() >= tail.size() && c.text.compare(c.text.size() - tail.size(), tail.size(), tail) == 0)
          << c.id << ": error " << c.text << ", expected one ending in " << tail;
      continue;
    }
    EXPECT_TRUE(c.ok) << c.id << ": " << c.text;
    if (c.ok && !c.family.empty()) ++rendered_per_family[c.family];
  }
  // The parity claim is about 20 conversations of each family at least.
  ASSERT_EQ(rendered_per_family.size(), 4u);
  for (const auto& [family, n] : rendered_per_family) EXPECT_GE(n, 20) << family;
}

TEST(ChatTemplateParity, MatchesHuggingFaceJinja) {
  const Suite& s = GetSuite();
  ASSERT_TRUE(s.error.empty()) << s.error;
  // setup.sh installs the pinned packages once (npm ci) and prints the
  // folder whose node_modules the script must run beside.
  const std::string setup_out = s.dir + "/setup.out";
  const std::string setup = "bash " + SourceDirForTests() + "/tests/hf/js/setup.sh >" + setup_out;
  ASSERT_EQ(std::system((setup + " 2>" + setup_out + ".stderr").c_str()), 0)
      << "tests/hf/js/setup.sh failed: " << ReadAll(setup_out + ".stderr");
  std::string cache = ReadAll(setup_out);
  while (!cache.empty() && (cache.back() == '\n' || cache.back() == '\r')) cache.pop_back();
  cache = cache.substr(cache.rfind('\n') == std::string::npos ? 0 : cache.rfind('\n') + 1);
  const std::string out = s.dir + "/hf.json";
  CompareWithOracle("hf", "cd '" + cache + "' && timeout 120 node render_chat.mjs '" + s.spec_path + "' '" + out + "'",
                    out);
}

TEST(ChatTemplateParity, MatchesPythonJinja2) {
  const Suite& s = GetSuite();
  ASSERT_TRUE(s.error.empty()) << s.error;
  // The python3 on PATH when it has jinja2, else Debian's (python3-jinja2,
  // which scripts/install-deps.sh installs).
  const std::string python =
      std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0 ? "python3" : "/usr/bin/python3";
  const std::string out = s.dir + "/python.json";
  CompareWithOracle("python",
                    "timeout 120 " + python + " '" + SourceDirForTests() + "/tests/hf/render_chat_jinja2.py' '" +
                        s.spec_path + "' '" + out + "'",
                    out);
}

}  // namespace
}  // namespace myriad
