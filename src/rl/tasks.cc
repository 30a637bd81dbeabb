#include "rl/tasks.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/rng.h"

namespace myriad::rl {
namespace {

using nlohmann::json;

// FNV-1a of the problem text: the split is a function of the problem alone.
uint64_t ProblemHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

Split SplitOf(const std::string& problem) { return ProblemHash(problem) % 10 == 0 ? Split::kHeldOut : Split::kTrain; }

long long Range(Rng& rng, long long lo, long long hi) { return lo + static_cast<long long>(rng.Below(hi - lo + 1)); }

std::string Id(const char* tag, int difficulty, int index) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%d-%06d", tag, difficulty, index);
  return buf;
}

// ---- arithmetic -------------------------------------------------------------

// One problem; the prompt is "expr=" and the answer its (integer) value.
std::string ArithExpr(Rng& rng, int d) {
  auto num = [&](int lo, int hi) { return std::to_string(Range(rng, lo, hi)); };
  switch (d) {
    case 1: return num(0, 99) + "+" + num(0, 99);
    case 2: return num(10, 99) + (rng.Below(2) ? "+" : "-") + num(10, 99);
    case 3:
      if (rng.Below(2)) return num(0, 99) + "*" + num(0, 9);
      return num(1, 99) + (rng.Below(2) ? "+" : "-") + num(1, 99) + (rng.Below(2) ? "+" : "-") + num(1, 99);
    case 4: {
      static const char* kOps[] = {"+", "-", "*"};
      return num(1, 99) + kOps[rng.Below(3)] + num(1, 99) + kOps[rng.Below(3)] + num(1, 99);
    }
    default: {
      static const char* kOps[] = {"+", "-", "*"};
      std::string e = num(1, 999);
      for (int i = 0; i < 3; ++i) e += std::string(kOps[rng.Below(3)]) + num(1, 99);
      return e;
    }
  }
}

Task ArithTask(Rng& rng, int d) {
  std::string expr = ArithExpr(rng, d);
  auto v = EvaluateArithmetic(expr);  // integers only: den == 1
  Task t;
  t.domain = "arithmetic";
  t.prompt = expr + "=";
  t.reward.kind = RewardKind::kExact;
  t.reward.answer = std::to_string(v.ok() ? v->num : 0);
  t.reference = t.reward.answer + "\n";
  return t;
}

// ---- countdown --------------------------------------------------------------

// Combines the numbers in random order and random grouping; only exact,
// positive intermediate values are kept, so the expression is the solution.
bool CountdownTask(Rng& rng, int n, Task* t) {
  std::vector<long long> nums;
  for (int i = 0; i < n; ++i) nums.push_back(Range(rng, 1, n <= 3 ? 10 : 25));
  std::vector<std::pair<std::string, long long>> pool;  // (expression, value); a leaf has no parens
  std::vector<bool> leaf;
  for (long long x : nums) pool.push_back({std::to_string(x), x}), leaf.push_back(true);
  while (pool.size() > 1) {
    size_t i = rng.Below(pool.size());
    auto a = pool[i];
    bool la = leaf[i];
    pool.erase(pool.begin() + i), leaf.erase(leaf.begin() + i);
    size_t k = rng.Below(pool.size());
    auto b = pool[k];
    bool lb = leaf[k];
    pool.erase(pool.begin() + k), leaf.erase(leaf.begin() + k);
    static const char kOps[] = {'+', '-', '*', '/'};
    char op = kOps[rng.Below(4)];
    long long v;
    if (op == '+') v = a.second + b.second;
    else if (op == '-') v = a.second - b.second;
    else if (op == '*') v = a.second * b.second;
    else v = b.second != 0 && a.second % b.second == 0 ? a.second / b.second : -1;
    if (v <= 0 || v > 100000) return false;
    std::string sa = la ? a.first : "(" + a.first + ")", sb = lb ? b.first : "(" + b.first + ")";
    pool.push_back({sa + op + sb, v});
    leaf.push_back(false);
  }
  long long target = pool[0].second;
  if (target > 999 || std::find(nums.begin(), nums.end(), target) != nums.end()) return false;
  std::string prompt = "use";
  for (long long x : nums) prompt += " " + std::to_string(x);
  prompt += " make " + std::to_string(target) + ":";
  t->domain = "countdown";
  t->prompt = prompt;
  t->reward.kind = RewardKind::kCountdown;
  t->reward.numbers = nums;
  t->reward.target = target;
  t->reference = " " + pool[0].first + "\n";
  return true;
}

// ---- python -----------------------------------------------------------------

// A Python value as a test literal and its type name.
struct PyVal {
  std::string literal, type;
};
PyVal Int(long long v) { return {std::to_string(v), "int"}; }
PyVal Bool(bool b) { return {b ? "True" : "False", "bool"}; }
PyVal Str(const std::string& s) { return {"'" + s + "'", "str"}; }

long long FloorDiv(long long a, long long b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
long long FloorMod(long long a, long long b) { return a - FloorDiv(a, b) * b; }

enum class ArgKind { kInt, kTwoInts, kStr, kList };

struct PyTemplate {
  int tier;             // difficulty at which it appears
  const char* comment;  // "%k" is replaced by the constant
  ArgKind args;
  const char* body;     // "%k" likewise
  // The expected value for inputs (x, y) / s / xs and constant k.
  std::function<PyVal(long long x, long long y, const std::string& s, const std::vector<long long>& xs, long long k)> eval;
};

const std::vector<PyTemplate>& Templates() {
  using V = std::vector<long long>;
  using S = std::string;
  static const std::vector<PyTemplate> kT = {
      {1, "add %k to x", ArgKind::kInt, "x + %k", [](long long x, long long, const S&, const V&, long long k) { return Int(x + k); }},
      {1, "subtract %k from x", ArgKind::kInt, "x - %k", [](long long x, long long, const S&, const V&, long long k) { return Int(x - k); }},
      {1, "multiply x by %k", ArgKind::kInt, "x * %k", [](long long x, long long, const S&, const V&, long long k) { return Int(x * k); }},
      {1, "square x", ArgKind::kInt, "x * x", [](long long x, long long, const S&, const V&, long long) { return Int(x * x); }},
      {1, "cube x", ArgKind::kInt, "x * x * x", [](long long x, long long, const S&, const V&, long long) { return Int(x * x * x); }},
      {1, "negate x", ArgKind::kInt, "-x", [](long long x, long long, const S&, const V&, long long) { return Int(-x); }},
      {1, "absolute value of x", ArgKind::kInt, "abs(x)", [](long long x, long long, const S&, const V&, long long) { return Int(x < 0 ? -x : x); }},
      {1, "double x and add %k", ArgKind::kInt, "2 * x + %k", [](long long x, long long, const S&, const V&, long long k) { return Int(2 * x + k); }},
      {2, "x modulo %k", ArgKind::kInt, "x % %k", [](long long x, long long, const S&, const V&, long long k) { return Int(FloorMod(x, k)); }},
      {2, "x integer-divided by %k", ArgKind::kInt, "x // %k", [](long long x, long long, const S&, const V&, long long k) { return Int(FloorDiv(x, k)); }},
      {2, "is x even", ArgKind::kInt, "x % 2 == 0", [](long long x, long long, const S&, const V&, long long) { return Bool(FloorMod(x, 2) == 0); }},
      {2, "is x odd", ArgKind::kInt, "x % 2 == 1", [](long long x, long long, const S&, const V&, long long) { return Bool(FloorMod(x, 2) == 1); }},
      {2, "is x positive", ArgKind::kInt, "x > 0", [](long long x, long long, const S&, const V&, long long) { return Bool(x > 0); }},
      {2, "is x greater than %k", ArgKind::kInt, "x > %k", [](long long x, long long, const S&, const V&, long long k) { return Bool(x > k); }},
      {2, "sum of a and b", ArgKind::kTwoInts, "a + b", [](long long a, long long b, const S&, const V&, long long) { return Int(a + b); }},
      {2, "product of a and b", ArgKind::kTwoInts, "a * b", [](long long a, long long b, const S&, const V&, long long) { return Int(a * b); }},
      {2, "a minus b", ArgKind::kTwoInts, "a - b", [](long long a, long long b, const S&, const V&, long long) { return Int(a - b); }},
      {2, "max of a and b", ArgKind::kTwoInts, "max(a, b)", [](long long a, long long b, const S&, const V&, long long) { return Int(std::max(a, b)); }},
      {2, "min of a and b", ArgKind::kTwoInts, "min(a, b)", [](long long a, long long b, const S&, const V&, long long) { return Int(std::min(a, b)); }},
      {3, "reverse the string s", ArgKind::kStr, "s[::-1]", [](long long, long long, const S& s, const V&, long long) { return Str(S(s.rbegin(), s.rend())); }},
      {3, "s in upper case", ArgKind::kStr, "s.upper()", [](long long, long long, const S& s, const V&, long long) { S u = s; for (char& c : u) c = static_cast<char>(c - 'a' + 'A'); return Str(u); }},
      {3, "length of the string s", ArgKind::kStr, "len(s)", [](long long, long long, const S& s, const V&, long long) { return Int(static_cast<long long>(s.size())); }},
      {3, "first character of s", ArgKind::kStr, "s[0]", [](long long, long long, const S& s, const V&, long long) { return Str(s.substr(0, 1)); }},
      {3, "s repeated %k times", ArgKind::kStr, "s * %k", [](long long, long long, const S& s, const V&, long long k) { S r; for (long long i = 0; i < k; ++i) r += s; return Str(r); }},
      {3, "first element of xs", ArgKind::kList, "xs[0]", [](long long, long long, const S&, const V& xs, long long) { return Int(xs[0]); }},
      {3, "last element of xs", ArgKind::kList, "xs[-1]", [](long long, long long, const S&, const V& xs, long long) { return Int(xs.back()); }},
      {3, "length of the list xs", ArgKind::kList, "len(xs)", [](long long, long long, const S&, const V& xs, long long) { return Int(static_cast<long long>(xs.size())); }},
      {3, "sum of the list xs", ArgKind::kList, "sum(xs)", [](long long, long long, const S&, const V& xs, long long) { long long s = 0; for (long long x : xs) s += x; return Int(s); }},
  };
  return kT;
}

std::string Subst(const char* text, long long k) {
  std::string s = text, out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 1 < s.size() && s[i + 1] == 'k') {
      out += std::to_string(k);
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

Task PythonTask(Rng& rng, int d) {
  std::vector<const PyTemplate*> eligible;
  for (const auto& t : Templates())
    if (t.tier <= d) eligible.push_back(&t);
  const PyTemplate& tp = *eligible[rng.Below(eligible.size())];
  long long k = Range(rng, 2, 9);
  static const char* kWords[] = {"cat", "dog", "tree", "sun", "moon", "river", "stone", "apple", "bird", "code"};
  static const char* kParams[] = {"x", "a, b", "s", "xs"};
  Task t;
  t.domain = "python";
  t.prompt = "# " + Subst(tp.comment, k) + "\ndef f(" + kParams[static_cast<int>(tp.args)] + "):\n    return";
  t.reference = " " + Subst(tp.body, k) + "\n";
  int ntests = 3 + static_cast<int>(rng.Below(3));
  for (int i = 0; i < ntests; ++i) {
    long long x = Range(rng, -20, 20), y = Range(rng, -20, 20);
    std::string s = kWords[rng.Below(10)];
    std::vector<long long> xs;
    for (int n = 1 + static_cast<int>(rng.Below(4)); n > 0; --n) xs.push_back(Range(rng, -9, 9));
    std::string call;
    switch (tp.args) {
      case ArgKind::kInt: call = "f(" + std::to_string(x) + ")"; break;
      case ArgKind::kTwoInts: call = "f(" + std::to_string(x) + ", " + std::to_string(y) + ")"; break;
      case ArgKind::kStr: call = "f('" + s + "')"; break;
      case ArgKind::kList: {
        call = "f([";
        for (size_t j = 0; j < xs.size(); ++j) call += (j ? ", " : "") + std::to_string(xs[j]);
        call += "])";
        break;
      }
    }
    PyVal want = tp.eval(x, y, s, xs, k);
    // Type-strict, through names the completion cannot rebind (it could
    // define `type` or `int` in the module the tests run in): an object
    // whose __eq__ is always true, or a shadowed `type`, does not pass.
    const std::string cls = want.type == "int" ? "(0).__class__" : want.type == "bool" ? "(True).__class__" : "('').__class__";
    t.reward.tests.push_back("assert (lambda r: (0).__class__.__class__(r) is " + cls + " and r == " + want.literal + ")(" +
                             call + ")");
  }
  t.reward.kind = RewardKind::kPython;
  t.reward.entry = "f";
  t.reward.prefix = t.prompt;
  t.reward.timeout_s = 2.0;
  return t;
}

// ---- tool calls -------------------------------------------------------------

json ToolSchema(const std::string& tool) {
  json props;
  if (tool == "get_weather") {
    props = {{"city", {{"type", "string"}}}, {"unit", {{"type", "string"}, {"enum", {"celsius", "fahrenheit"}}}}};
  } else if (tool == "set_timer") {
    props = {{"minutes", {{"type", "integer"}}}};
  } else if (tool == "convert_currency") {
    json cur = {{"type", "string"}, {"enum", {"USD", "EUR", "GBP", "JPY", "CHF"}}};
    props = {{"amount", {{"type", "number"}}}, {"from", cur}, {"to", cur}};
  } else {
    props = {{"query", {{"type", "string"}}}};
  }
  json required = json::array();
  for (auto it = props.begin(); it != props.end(); ++it) required.push_back(it.key());
  return {{"type", "object"}, {"properties", props}, {"required", required}, {"additionalProperties", false}};
}

Task ToolTask(Rng& rng, int d) {
  static const char* kCities[] = {"Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Oslo", "Lima", "Cairo", "Seoul"};
  static const char* kCur[] = {"USD", "EUR", "GBP", "JPY", "CHF"};
  static const char* kTopics[] = {"cheap flights", "pasta recipes", "jazz music", "hiking boots", "news today",
                                  "python tutorial", "weather radar", "chess openings"};
  Task t;
  t.domain = "tool_call";
  int which = static_cast<int>(rng.Below(d <= 1 ? 2 : 4));
  json args;
  std::string tool;
  if (which == 0) {
    tool = "get_weather";
    std::string city = kCities[rng.Below(10)], unit = rng.Below(2) ? "celsius" : "fahrenheit";
    t.prompt = "call: weather in " + city + ", " + unit + "\n";
    args = {{"city", city}, {"unit", unit}};
  } else if (which == 1) {
    tool = "set_timer";
    long long m = Range(rng, 1, 120);
    t.prompt = "call: timer for " + std::to_string(m) + " minutes\n";
    args = {{"minutes", m}};
  } else if (which == 2) {
    tool = "convert_currency";
    long long amount = Range(rng, 1, 1000);
    size_t a = rng.Below(5), b = (a + 1 + rng.Below(4)) % 5;
    t.prompt = "call: convert " + std::to_string(amount) + " " + kCur[a] + " to " + kCur[b] + "\n";
    args = {{"amount", amount}, {"from", kCur[a]}, {"to", kCur[b]}};
  } else {
    tool = "search";
    std::string q = kTopics[rng.Below(8)];
    t.prompt = "call: search " + q + "\n";
    args = {{"query", q}};
  }
  t.reward.kind = RewardKind::kToolCall;
  t.reward.tool = tool;
  t.reward.arguments = args;
  t.reward.schema = ToolSchema(tool);
  t.reference = "{\"name\":\"" + tool + "\",\"arguments\":" + args.dump() + "}\n";
  return t;
}

}  // namespace

Result<std::vector<Task>> GenerateTasks(const std::string& domain, int count, int difficulty, uint64_t seed,
                                        Split split) {
  int lo = 1, hi = 5;
  const char* tag = nullptr;
  if (domain == "arithmetic") tag = "arith";
  else if (domain == "countdown") tag = "countdown", lo = 2;
  else if (domain == "python") tag = "python", hi = 3;
  else if (domain == "tool_call") tag = "tool", hi = 2;
  else
    return Status::Error("tasks: unknown domain '" + domain + "' (expected arithmetic, countdown, python or tool_call)");
  if (difficulty < lo || difficulty > hi)
    return Status::Error("tasks: " + domain + " difficulty " + std::to_string(difficulty) + " out of range [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  if (count < 0) return Status::Error("tasks: count " + std::to_string(count) + " is negative");
  Rng rng(seed ^ (ProblemHash(domain) + static_cast<uint64_t>(difficulty) * 0x9E3779B97F4A7C15ull));
  std::vector<Task> out;
  const long long max_attempts = 1000ll * count + 10000;
  for (long long attempt = 0; static_cast<int>(out.size()) < count; ++attempt) {
    if (attempt >= max_attempts)
      return Status::Error("tasks: could not generate " + std::to_string(count) + " " + domain + " tasks");
    Task t;
    if (domain == "arithmetic") t = ArithTask(rng, difficulty);
    else if (domain == "countdown") {
      if (!CountdownTask(rng, difficulty, &t)) continue;
    } else if (domain == "python") t = PythonTask(rng, difficulty);
    else t = ToolTask(rng, difficulty);
    if (SplitOf(t.prompt) != split) continue;
    t.difficulty = difficulty;
    t.id = Id(tag, difficulty, static_cast<int>(out.size()));
    out.push_back(std::move(t));
  }
  return out;
}

Result<std::vector<Task>> LoadTasksJsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open");
  std::string stem = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  if (size_t dot = stem.find('.'); dot != std::string::npos) stem = stem.substr(0, dot);
  std::vector<Task> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno);
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status::Error(where + ": invalid JSON");
    if (!j.is_object()) return Status::Error(where + ": expected a JSON object");
    Task t;
    auto p = j.find("prompt");
    if (p == j.end()) return Status::Error(where + ": prompt: missing");
    if (!p->is_string()) return Status::Error(where + ": prompt: expected a string");
    t.prompt = *p;
    auto r = j.find("reward");
    if (r == j.end()) return Status::Error(where + ": reward: missing");
    auto spec = ParseRewardSpec(*r);
    if (!spec.ok()) return spec.status().With(where);
    t.reward = std::move(spec.value());
    for (const char* f : {"id", "domain", "reference"})
      if (j.contains(f) && !j[f].is_string()) return Status::Error(where + ": " + f + ": expected a string");
    t.id = j.value("id", stem + "-" + std::to_string(lineno));
    t.domain = j.value("domain", stem);
    t.reference = j.value("reference", "");
    if (j.contains("difficulty")) {
      if (!j["difficulty"].is_number_integer()) return Status::Error(where + ": difficulty: expected an integer");
      t.difficulty = j["difficulty"];
    }
    out.push_back(std::move(t));
  }
  return out;
}

Status WriteTasksJsonl(const std::string& path, const std::vector<Task>& tasks) {
  std::ofstream out(path);
  if (!out) return Status::Error(path + ": cannot open for writing");
  for (const Task& t : tasks) {
    json j = {{"id", t.id}, {"domain", t.domain}, {"prompt", t.prompt}, {"reward", RewardSpecToJson(t.reward)},
              {"difficulty", t.difficulty}};
    if (!t.reference.empty()) j["reference"] = t.reference;
    out << j.dump() << "\n";
  }
  out.flush();
  if (!out) return Status::Error(path + ": write failed");
  return Status::Ok();
}

}  // namespace myriad::rl
