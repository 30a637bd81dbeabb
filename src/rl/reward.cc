#include "rl/reward.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>

#include "rl/sandbox.h"

namespace myriad::rl {
namespace {

using nlohmann::json;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string_view FirstLine(std::string_view s) {
  size_t nl = s.find('\n');
  return nl == std::string_view::npos ? s : s.substr(0, nl);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A plain decimal number: [+-]digits[.digits] (or .digits).
bool ParseDecimal(const std::string& s, long double* v) {
  size_t i = 0, digits = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) ++digits;
  }
  if (digits == 0 || i != s.size()) return false;
  *v = std::strtold(s.c_str(), nullptr);
  return true;
}

const char* KindName(RewardKind k) {
  switch (k) {
    case RewardKind::kExact: return "exact";
    case RewardKind::kCountdown: return "countdown";
    case RewardKind::kPython: return "python";
    case RewardKind::kToolCall: return "tool_call";
  }
  return "exact";
}

// ---- rational arithmetic parser -------------------------------------------

struct Rat {
  long long n = 0, d = 1;
};

class ArithParser {
 public:
  explicit ArithParser(std::string_view s) : s_(s) {}
  Result<ArithValue> Run() {
    Rat r;
    if (!Expr(&r)) return Status::Error(err_);
    Skip();
    if (pos_ != s_.size()) return Status::Error("unexpected '" + std::string(1, s_[pos_]) + "' at " + std::to_string(pos_));
    ArithValue v;
    v.num = r.n;
    v.den = r.d;
    v.literals = std::move(literals_);
    return v;
  }

 private:
  void Skip() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  bool Fail(std::string m) {
    if (err_.empty()) err_ = std::move(m);
    return false;
  }
  bool Make(__int128 n, __int128 d, Rat* out) {
    if (d == 0) return Fail("division by zero");
    if (d < 0) n = -n, d = -d;
    __int128 a = n < 0 ? -n : n, b = d;
    while (b) {
      __int128 t = a % b;
      a = b;
      b = t;
    }
    if (a > 1) n /= a, d /= a;
    constexpr __int128 kMax = static_cast<__int128>(1) << 62;
    if (n > kMax || n < -kMax || d > kMax) return Fail("overflow");
    out->n = static_cast<long long>(n);
    out->d = static_cast<long long>(d);
    return true;
  }
  bool Apply(char op, const Rat& a, const Rat& b, Rat* out) {
    using I = __int128;
    switch (op) {
      case '+': return Make(I(a.n) * b.d + I(b.n) * a.d, I(a.d) * b.d, out);
      case '-': return Make(I(a.n) * b.d - I(b.n) * a.d, I(a.d) * b.d, out);
      case '*': return Make(I(a.n) * b.n, I(a.d) * b.d, out);
      default:
        if (b.n == 0) return Fail("division by zero");
        return Make(I(a.n) * b.d, I(a.d) * b.n, out);
    }
  }
  bool Expr(Rat* out) {
    if (!Term(out)) return false;
    for (;;) {
      Skip();
      if (pos_ >= s_.size() || (s_[pos_] != '+' && s_[pos_] != '-')) return true;
      char op = s_[pos_++];
      Rat r;
      if (!Term(&r) || !Apply(op, *out, r, out)) return false;
    }
  }
  bool Term(Rat* out) {
    if (!Factor(out)) return false;
    for (;;) {
      Skip();
      if (pos_ >= s_.size() || (s_[pos_] != '*' && s_[pos_] != '/')) return true;
      char op = s_[pos_++];
      Rat r;
      if (!Factor(&r) || !Apply(op, *out, r, out)) return false;
    }
  }
  bool Factor(Rat* out) {
    Skip();
    if (++depth_ > 200) return Fail("nesting too deep");
    if (pos_ < s_.size() && s_[pos_] == '(') {
      ++pos_;
      if (!Expr(out)) return false;
      Skip();
      if (pos_ >= s_.size() || s_[pos_] != ')') return Fail("missing ')'");
      ++pos_;
      --depth_;
      return true;
    }
    if (pos_ >= s_.size() || !std::isdigit(static_cast<unsigned char>(s_[pos_])))
      return Fail(pos_ >= s_.size() ? "unexpected end" : "unexpected '" + std::string(1, s_[pos_]) + "'");
    long long v = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      if (v > (1ll << 62) / 10) return Fail("number too large");
      v = v * 10 + (s_[pos_++] - '0');
    }
    literals_.push_back(v);
    out->n = v;
    out->d = 1;
    --depth_;
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string err_;
  std::vector<long long> literals_;
};

// ---- JSON-schema subset ---------------------------------------------------

std::string ValidateSchema(const json& v, const json& schema, const std::string& path) {
  if (!schema.is_object()) return "";
  if (auto t = schema.find("type"); t != schema.end() && t->is_string()) {
    const std::string ty = *t;
    bool ok = (ty == "object" && v.is_object()) || (ty == "string" && v.is_string()) ||
              (ty == "integer" && v.is_number_integer()) || (ty == "number" && v.is_number()) ||
              (ty == "boolean" && v.is_boolean()) || (ty == "array" && v.is_array()) || (ty == "null" && v.is_null());
    if (!ok) return path + ": expected " + ty;
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    if (std::find(e->begin(), e->end(), v) == e->end()) return path + ": not one of " + e->dump();
  }
  if (v.is_object()) {
    json props = schema.value("properties", json::object());
    if (auto r = schema.find("required"); r != schema.end() && r->is_array())
      for (const auto& name : *r)
        if (name.is_string() && !v.contains(name.get<std::string>()))
          return path + ": missing '" + name.get<std::string>() + "'";
    auto ap = schema.find("additionalProperties");
    bool closed = ap != schema.end() && ap->is_boolean() && !ap->get<bool>();
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        std::string e = ValidateSchema(it.value(), props[it.key()], path + "." + it.key());
        if (!e.empty()) return e;
      } else if (closed) {
        return path + ": unexpected '" + it.key() + "'";
      }
    }
  }
  if (v.is_array()) {
    if (auto items = schema.find("items"); items != schema.end())
      for (size_t i = 0; i < v.size(); ++i) {
        std::string e = ValidateSchema(v[i], *items, path + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
  }
  return "";
}

bool JsonEqual(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_number_integer() && b.is_number_integer()) {
      // Compare integers exactly (signed/unsigned mix included).
      if (a.is_number_unsigned() || b.is_number_unsigned()) return a == b;
      return a.get<long long>() == b.get<long long>();
    }
    return a.get<double>() == b.get<double>();
  }
  if (a.type() != b.type()) return false;
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto jt = b.find(it.key());
      if (jt == b.end() || !JsonEqual(it.value(), *jt)) return false;
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!JsonEqual(a[i], b[i])) return false;
    return true;
  }
  return a == b;
}

// ---- scorers --------------------------------------------------------------

RewardResult ScoreExact(const RewardSpec& spec, std::string_view completion) {
  RewardResult r;
  std::string got = NormalizeAnswer(ExtractAnswer(completion));
  if (got.empty()) {
    r.detail = "no answer";
    return r;
  }
  r.parsed = true;
  std::string want = NormalizeAnswer(spec.answer);
  long double gv, wv;
  if (ParseDecimal(got, &gv) && ParseDecimal(want, &wv))
    r.correct = gv == wv;
  else
    r.correct = got == want;
  r.reward = r.correct ? 1.0 : 0.0;
  r.detail = r.correct ? "ok" : "wrong answer " + got + " != " + want;
  return r;
}

RewardResult ScoreCountdown(const RewardSpec& spec, std::string_view completion) {
  RewardResult r;
  std::string_view line = FirstLine(completion);
  if (size_t eq = line.find('='); eq != std::string_view::npos) line = line.substr(0, eq);
  line = Trim(line);
  if (line.empty()) {
    r.detail = "no expression";
    return r;
  }
  auto v = EvaluateArithmetic(line);
  if (!v.ok()) {
    r.detail = "malformed expression: " + v.status().message();
    return r;
  }
  r.parsed = true;
  std::map<long long, int> avail;
  for (long long n : spec.numbers) ++avail[n];
  for (long long lit : v->literals) {
    auto it = avail.find(lit);
    if (it == avail.end()) {
      r.detail = "number " + std::to_string(lit) + " not given";
      return r;
    }
    if (it->second-- == 0) {
      r.detail = "number " + std::to_string(lit) + " used too often";
      return r;
    }
  }
  r.correct = v->den == 1 && v->num == spec.target;
  r.reward = r.correct ? 1.0 : 0.0;
  std::string value = std::to_string(v->num) + (v->den == 1 ? "" : "/" + std::to_string(v->den));
  r.detail = r.correct ? "ok" : "value " + value + " != " + std::to_string(spec.target);
  return r;
}

RewardResult ScorePython(const RewardSpec& spec, std::string_view completion) {
  RewardResult r;
  r.parsed = !Trim(completion).empty();
  if (!r.parsed) {
    r.detail = "empty completion";
    return r;
  }
  PythonTestOutcome o = RunPythonTests(spec.prefix + std::string(completion), spec.entry, spec.tests, spec.timeout_s);
  if (o.total <= 0) {
    r.detail = o.reason.empty() ? "no tests run" : o.reason;
    return r;
  }
  r.correct = o.passed == o.total && !o.timed_out;
  if (spec.all_or_nothing)
    r.reward = r.correct ? 1.0 : 0.0;
  else
    r.reward = o.timed_out ? 0.0 : static_cast<double>(o.passed) / o.total;
  r.detail = o.timed_out ? "timeout" : o.reason + " (" + std::to_string(o.passed) + "/" + std::to_string(o.total) + ")";
  if (o.reason != "ok" && !o.timed_out) r.reward = 0.0;  // exited early, tampered, import error
  return r;
}

RewardResult ScoreToolCall(const RewardSpec& spec, std::string_view completion) {
  RewardResult r;
  std::string_view line = Trim(FirstLine(completion));
  json call = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (call.is_discarded() || !call.is_object()) {
    r.detail = "not JSON: the first line must be exactly one JSON object";
    return r;
  }
  if (!call.contains("name") || !call["name"].is_string() || !call.contains("arguments") ||
      !call["arguments"].is_object() || call.size() != 2) {
    r.detail = "not a tool call: expected {\"name\": string, \"arguments\": object}";
    return r;
  }
  r.parsed = true;
  if (call["name"] != spec.tool) {
    r.detail = "wrong tool '" + call["name"].get<std::string>() + "' (expected '" + spec.tool + "')";
    return r;
  }
  const json& args = call["arguments"];
  if (std::string e = ValidateSchema(args, spec.schema, "arguments"); !e.empty()) {
    r.detail = "schema violation: " + e;
    return r;
  }
  const json want = spec.arguments.is_object() ? spec.arguments : json::object();
  for (auto it = want.begin(); it != want.end(); ++it)
    if (!args.contains(it.key()) || !JsonEqual(args[it.key()], it.value())) {
      r.detail = "wrong argument '" + it.key() + "'";
      return r;
    }
  for (auto it = args.begin(); it != args.end(); ++it)
    if (!want.contains(it.key())) {
      r.detail = "unexpected argument '" + it.key() + "'";
      return r;
    }
  r.correct = true;
  r.reward = 1.0;
  r.detail = "ok";
  return r;
}

// Field helpers for ParseRewardSpec.
Status GetString(const json& j, const char* field, bool required, std::string* out) {
  auto it = j.find(field);
  if (it == j.end()) return required ? Status::Error(std::string("reward.") + field + ": missing") : Status::Ok();
  if (!it->is_string()) return Status::Error(std::string("reward.") + field + ": expected a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

}  // namespace

std::string ExtractAnswer(std::string_view completion) {
  // The last final-answer marker anywhere wins.
  std::string lower = Lower(completion);
  size_t best = std::string::npos, best_len = 0;
  for (const char* marker : {"answer:", "####"}) {
    size_t p = lower.rfind(marker);
    if (p != std::string::npos && (best == std::string::npos || p > best)) best = p, best_len = std::string(marker).size();
  }
  if (best != std::string::npos) return std::string(Trim(FirstLine(completion.substr(best + best_len))));
  std::string_view line = FirstLine(completion);
  if (size_t eq = line.rfind('='); eq != std::string_view::npos) line = line.substr(eq + 1);
  return std::string(Trim(line));
}

std::string NormalizeAnswer(std::string_view answer) {
  std::string s = Lower(Trim(answer));
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == ',' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])))
      continue;
    out += s[i];
  }
  return out;
}

Result<ArithValue> EvaluateArithmetic(std::string_view expr) { return ArithParser(expr).Run(); }

Result<RewardSpec> ParseRewardSpec(const json& j) {
  if (!j.is_object()) return Status::Error("reward: expected an object");
  RewardSpec s;
  std::string kind;
  RETURN_IF_ERROR(GetString(j, "kind", true, &kind));
  if (kind == "exact") {
    s.kind = RewardKind::kExact;
    RETURN_IF_ERROR(GetString(j, "answer", true, &s.answer));
  } else if (kind == "countdown") {
    s.kind = RewardKind::kCountdown;
    auto n = j.find("numbers");
    if (n == j.end()) return Status::Error("reward.numbers: missing");
    if (!n->is_array() || n->empty()) return Status::Error("reward.numbers: expected a non-empty array of integers");
    for (const auto& x : *n) {
      if (!x.is_number_integer()) return Status::Error("reward.numbers: expected a non-empty array of integers");
      s.numbers.push_back(x.get<long long>());
    }
    auto t = j.find("target");
    if (t == j.end()) return Status::Error("reward.target: missing");
    if (!t->is_number_integer()) return Status::Error("reward.target: expected an integer");
    s.target = t->get<long long>();
  } else if (kind == "python") {
    s.kind = RewardKind::kPython;
    RETURN_IF_ERROR(GetString(j, "entry", true, &s.entry));
    RETURN_IF_ERROR(GetString(j, "prefix", false, &s.prefix));
    auto t = j.find("tests");
    if (t == j.end()) return Status::Error("reward.tests: missing");
    if (!t->is_array() || t->empty()) return Status::Error("reward.tests: expected a non-empty array of strings");
    for (const auto& x : *t) {
      if (!x.is_string()) return Status::Error("reward.tests: expected an array of strings");
      s.tests.push_back(x.get<std::string>());
    }
    if (auto a = j.find("all_or_nothing"); a != j.end()) {
      if (!a->is_boolean()) return Status::Error("reward.all_or_nothing: expected a boolean");
      s.all_or_nothing = a->get<bool>();
    }
    if (auto to = j.find("timeout_s"); to != j.end()) {
      if (!to->is_number() || to->get<double>() <= 0 || to->get<double>() > 60)
        return Status::Error("reward.timeout_s: expected a number in (0, 60]");
      s.timeout_s = to->get<double>();
    }
  } else if (kind == "tool_call") {
    s.kind = RewardKind::kToolCall;
    RETURN_IF_ERROR(GetString(j, "tool", true, &s.tool));
    auto a = j.find("arguments");
    if (a == j.end()) return Status::Error("reward.arguments: missing");
    if (!a->is_object()) return Status::Error("reward.arguments: expected an object");
    s.arguments = *a;
    if (auto sc = j.find("schema"); sc != j.end()) {
      if (!sc->is_object()) return Status::Error("reward.schema: expected an object");
      s.schema = *sc;
    }
  } else {
    return Status::Error("reward.kind: unknown kind '" + kind + "' (expected exact, countdown, python or tool_call)");
  }
  return s;
}

json RewardSpecToJson(const RewardSpec& s) {
  json j;
  j["kind"] = KindName(s.kind);
  switch (s.kind) {
    case RewardKind::kExact: j["answer"] = s.answer; break;
    case RewardKind::kCountdown:
      j["numbers"] = s.numbers;
      j["target"] = s.target;
      break;
    case RewardKind::kPython:
      j["entry"] = s.entry;
      if (!s.prefix.empty()) j["prefix"] = s.prefix;
      j["tests"] = s.tests;
      if (s.all_or_nothing) j["all_or_nothing"] = true;
      j["timeout_s"] = s.timeout_s;
      break;
    case RewardKind::kToolCall:
      j["tool"] = s.tool;
      j["arguments"] = s.arguments.is_null() ? json::object() : s.arguments;
      if (!s.schema.is_null()) j["schema"] = s.schema;
      break;
  }
  return j;
}

RewardResult Score(const RewardSpec& spec, std::string_view completion, const RewardOptions& options) {
  RewardResult r;
  switch (spec.kind) {
    case RewardKind::kExact: r = ScoreExact(spec, completion); break;
    case RewardKind::kCountdown: r = ScoreCountdown(spec, completion); break;
    case RewardKind::kPython: r = ScorePython(spec, completion); break;
    case RewardKind::kToolCall: r = ScoreToolCall(spec, completion); break;
  }
  if (!r.parsed) r.reward -= options.format_penalty;
  if (options.max_chars > 0 && completion.size() > static_cast<size_t>(options.max_chars))
    r.reward -= options.length_penalty * static_cast<double>(completion.size() - options.max_chars);
  r.reward = std::clamp(r.reward, -1.0, 1.0);
  return r;
}

}  // namespace myriad::rl
