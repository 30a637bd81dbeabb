#include "edge/route_data.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "core/checksum.h"
#include "core/env.h"
#include "core/rng.h"
#include "data/corpus.h"
#include "edge/entity.h"
#include "rl/tasks.h"

namespace myriad::edge {

int RouteDomainIndex(std::string_view domain) {
  for (int i = 0; i < kNumRouteDomains; ++i)
    if (domain == kRouteDomains[i]) return i;
  return -1;
}

namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Lines(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == '\n') out.push_back(s.substr(start, i - start)), start = i + 1;
  return out;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool LooksLikeCode(std::string_view text) {
  const std::vector<std::string_view> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view l = lines[i];
    const std::string_view t = Trim(l);
    if (StartsWith(t, "def ") || StartsWith(t, "class ") || StartsWith(t, "import ") || StartsWith(t, "```"))
      return true;
    if (StartsWith(t, "from ") && t.find(" import ") != std::string_view::npos) return true;
    if (StartsWith(l, "#") && i + 1 < lines.size() && !lines[i + 1].empty() &&
        (lines[i + 1][0] == ' ' || StartsWith(lines[i + 1], "def ")))
      return true;
  }
  return false;
}

bool LooksLikeArithmetic(std::string_view text) {
  const std::string_view t = Trim(text);
  if (StartsWith(t, "use ") && t.find(" make ") != std::string_view::npos && t.back() == ':') return true;
  if (t.empty() || t.back() != '=') return false;
  bool digit = false, op = false;
  for (size_t i = 0; i + 1 < t.size(); ++i) {
    const char c = t[i];
    if (c >= '0' && c <= '9') digit = true;
    else if (c == '+' || c == '-' || c == '*' || c == '/') op = true;
    else if (c != ' ' && c != '(' && c != ')') return false;
  }
  return digit && op;
}

const char* const kBusinessCues[] = {"report", "invoice", "contract", "customer", "revenue", "summarise",
                                     "summarize", "meeting", "quarter", "budget", "payment", "account",
                                     "employee", "client", "agreement", "合同", "报告", "客户", "公司",
                                     "总结", "摘要", "发票", "会议", "付款", "员工"};
const char* const kInstructionCues[] = {"summarise the", "summarize the", "list the action items",
                                        "draft a reply", "总结", "摘要"};

}  // namespace

std::string ClassifyDomain(std::string_view prompt) {
  if (LooksLikeCode(prompt)) return "code";
  if (LooksLikeArithmetic(prompt)) return "arithmetic";
  const std::string low = Lower(prompt);
  const std::string_view tail = Trim(std::string_view(low).substr(low.size() > 80 ? low.size() - 80 : 0));
  for (const char* cue : kInstructionCues)
    if (tail.find(cue) != std::string_view::npos) return "business";
  if (DecodeUtf8(prompt).size() >= 160)
    for (const char* cue : kBusinessCues)
      if (low.find(cue) != std::string::npos) return "business";
  return "chat";
}

namespace {

const char* const kBusinessInstructions[] = {
    "Summarise the report:", "List the action items:", "Who are the parties, and what do they agree?",
    "Draft a reply to the customer:", "用一句话总结：", "Summarise the key figures:"};

// The first part of a fortune: about half of its words (English, 3..12) or
// of its code points (Chinese, 4..20), cut at a boundary.
std::string FortunePrefix(const std::string& text, bool chinese) {
  if (chinese) {
    std::u32string cps;
    for (char32_t c : DecodeUtf8(text))
      if (c != U'\n' && c != U'\t') cps.push_back(c);
    const size_t n = std::clamp<size_t>(cps.size() / 2, 4, 20);
    return EncodeUtf8(std::u32string_view(cps).substr(0, std::min(n, cps.size())));
  }
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  const size_t n = std::min(words.size(), std::clamp<size_t>(words.size() / 2, 3, 12));
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? " " : "") + words[i];
  return out;
}

bool HeldOutByHash(std::string_view text) { return Checksum64(text) % 4 == 0; }

Result<std::vector<std::string>> ReadFortunes(const std::string& dir, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names) {
    Result<std::string> body = Env::Default()->ReadFile(dir + "/" + name);
    if (!body.ok()) continue;
    std::string text = body.value();
    if (!corpus_text::IsValidUtf8(text)) {
      Result<std::string> conv = corpus_text::ConvertToUtf8(text, "GB18030");
      if (!conv.ok()) continue;
      text = conv.value();
    }
    for (std::string& f : corpus_text::SplitFortunes(text))
      if (f.size() >= 12 && f.size() <= 400) out.push_back(std::move(f));
  }
  if (out.empty())
    return Status::Error(dir + ": no fortunes in " + names.front() +
                         "... (hint: install the packages fortunes and fortunes-zh, scripts/install-deps.sh)");
  return out;
}

// `n` items of `pool` for a split (by hash), picked by the rng, each once.
std::vector<const std::string*> Pick(const std::vector<std::string>& pool, bool held_out, int n, Rng* rng) {
  std::vector<const std::string*> eligible;
  for (const std::string& s : pool)
    if (HeldOutByHash(s) == held_out) eligible.push_back(&s);
  for (size_t i = eligible.size(); i > 1; --i) std::swap(eligible[i - 1], eligible[rng->Below(i)]);
  if (static_cast<int>(eligible.size()) > n) eligible.resize(n);
  return eligible;
}

Status AddSplit(const PromptSetOptions& opt, bool held_out, int count, const std::vector<std::string>& en,
                const std::vector<std::string>& zh, std::vector<RoutePrompt>* out) {
  const std::string split = held_out ? "held_out" : "train";
  const bool docs = !opt.business_docs.empty();
  const double total =
      opt.arithmetic_share + opt.python_share + opt.chat_share + (docs ? opt.business_share : 0);
  if (total <= 0) return Status::Error("route prompts: the domain shares sum to 0");
  int n_arith = static_cast<int>(std::lround(count * opt.arithmetic_share / total));
  int n_py = static_cast<int>(std::lround(count * opt.python_share / total));
  int n_biz = docs ? static_cast<int>(std::lround(count * opt.business_share / total)) : 0;
  int n_chat = std::max(0, count - n_arith - n_py - n_biz);
  const rl::Split rs = held_out ? rl::Split::kHeldOut : rl::Split::kTrain;
  const uint64_t seed = opt.seed * 1000003ULL + (held_out ? 7 : 0);
  // Python first: the generator has few distinct problems, so its
  // shortfall goes to arithmetic.
  if (n_py > 0) {
    ASSIGN_OR_RETURN(std::vector<rl::Task> tasks, rl::GenerateTasks("python", n_py, 1, seed + 101, rs));
    std::set<std::string> seen;
    int kept = 0;
    for (rl::Task& t : tasks)
      if (seen.insert(t.prompt).second)
        out->push_back({split + "-" + t.id, "code", split, t.prompt, t.reward, t.difficulty}), ++kept;
    n_arith += n_py - kept;
  }
  // Arithmetic: spread over the difficulties.
  const int nd = static_cast<int>(opt.arithmetic_difficulties.size());
  for (int d = 0; d < nd && n_arith > 0; ++d) {
    const int n = n_arith / nd + (d < n_arith % nd ? 1 : 0);
    if (n == 0) continue;
    ASSIGN_OR_RETURN(std::vector<rl::Task> tasks,
                     rl::GenerateTasks("arithmetic", n, opt.arithmetic_difficulties[d], seed + d, rs));
    for (rl::Task& t : tasks)
      out->push_back({split + "-" + t.id, "arithmetic", split, t.prompt, t.reward, t.difficulty});
  }
  Rng rng(seed + 202);
  std::vector<const std::string*> biz = Pick(opt.business_docs, held_out, n_biz, &rng);
  n_chat += n_biz - static_cast<int>(biz.size());  // too few documents for the split: chat fills in
  const int n_zh = n_chat / 3, n_en = n_chat - n_zh;
  int i = 0;
  for (const std::string* f : Pick(en, held_out, n_en, &rng)) {
    char id[64];
    std::snprintf(id, sizeof id, "%s-chat-en-%06d", split.c_str(), i++);
    out->push_back({id, "chat", split, FortunePrefix(*f, false), std::nullopt, 0});
  }
  i = 0;
  for (const std::string* f : Pick(zh, held_out, n_zh, &rng)) {
    char id[64];
    std::snprintf(id, sizeof id, "%s-chat-zh-%06d", split.c_str(), i++);
    out->push_back({id, "chat", split, FortunePrefix(*f, true), std::nullopt, 0});
  }
  i = 0;
  for (const std::string* d : biz) {
    std::u32string cps = DecodeUtf8(*d);
    if (static_cast<int>(cps.size()) > opt.doc_chars) cps.resize(opt.doc_chars);
    const char* instr = kBusinessInstructions[rng.Below(std::size(kBusinessInstructions))];
    char id[64];
    std::snprintf(id, sizeof id, "%s-biz-%06d", split.c_str(), i++);
    out->push_back({id, "business", split, EncodeUtf8(cps) + "\n\n" + instr, std::nullopt, 0});
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<RoutePrompt>> BuildPromptSet(const PromptSetOptions& opt) {
  if (opt.count < 0 || opt.held_out_count < 0) return Status::Error("route prompts: negative --count");
  ASSIGN_OR_RETURN(std::vector<std::string> en,
                   ReadFortunes(opt.fortunes_dir, {"fortunes", "wisdom", "people", "literature", "science",
                                                   "computers", "work", "education"}));
  ASSIGN_OR_RETURN(std::vector<std::string> zh, ReadFortunes(opt.fortunes_dir, {"chinese"}));
  std::vector<RoutePrompt> train, held, out;
  RETURN_IF_ERROR(AddSplit(opt, false, opt.count, en, zh, &train));
  RETURN_IF_ERROR(AddSplit(opt, true, opt.held_out_count, en, zh, &held));
  // One prompt per text (tasks of two difficulties can coincide), none
  // held out that is also in train.
  std::set<std::string> seen;
  for (RoutePrompt& p : train)
    if (seen.insert(p.prompt).second) out.push_back(std::move(p));
  for (RoutePrompt& p : held)
    if (seen.insert(p.prompt).second) out.push_back(std::move(p));
  return out;
}

nlohmann::json PromptToJson(const RoutePrompt& p) {
  nlohmann::json j = {{"id", p.id}, {"domain", p.domain}, {"split", p.split}, {"prompt", p.prompt}};
  if (p.verifier) j["verifier"] = rl::RewardSpecToJson(*p.verifier), j["difficulty"] = p.difficulty;
  return j;
}

namespace {
Result<std::string> Str(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return Status::Error(std::string("missing \"") + key + "\"");
  if (!j[key].is_string()) return Status::Error(std::string("\"") + key + "\": expected a string");
  return j[key].get<std::string>();
}
Result<double> Num(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return Status::Error(std::string("missing \"") + key + "\"");
  if (!j[key].is_number()) return Status::Error(std::string("\"") + key + "\": expected a number");
  return j[key].get<double>();
}

template <typename T, typename F>
Result<std::vector<T>> LoadJsonl(const std::string& path, F parse) {
  std::ifstream in(path);
  if (!in) return Status::Error(path + ": cannot open (hint: check the path)");
  std::vector<T> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (Trim(line).empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const std::string where = path + ":" + std::to_string(n);
    if (j.is_discarded() || !j.is_object()) return Status::Error(where + ": not a JSON object");
    Result<T> r = parse(j);
    if (!r.ok()) return r.status().With(where);
    out.push_back(std::move(r.value()));
  }
  if (out.empty()) return Status::Error(path + ": no records");
  return out;
}

template <typename T, typename F>
Status WriteJsonl(const std::string& path, const std::vector<T>& items, F to_json) {
  std::string body;
  // Answers are model output: invalid UTF-8 (a token cut mid-character) is replaced, not fatal.
  for (const T& x : items) body += to_json(x).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return WriteFileAtomic(Env::Default(), path, body);
}
}  // namespace

Result<RoutePrompt> PromptFromJson(const nlohmann::json& j) {
  RoutePrompt p;
  ASSIGN_OR_RETURN(p.id, Str(j, "id"));
  ASSIGN_OR_RETURN(p.domain, Str(j, "domain"));
  ASSIGN_OR_RETURN(p.split, Str(j, "split"));
  if (p.split != "train" && p.split != "held_out")
    return Status::Error("\"split\": '" + p.split + "' (expected train or held_out)");
  ASSIGN_OR_RETURN(p.prompt, Str(j, "prompt"));
  if (j.contains("verifier")) {
    Result<rl::RewardSpec> spec = rl::ParseRewardSpec(j["verifier"]);
    if (!spec.ok()) return spec.status().With("verifier");
    p.verifier = spec.value();
    p.difficulty = j.value("difficulty", 0);
  }
  return p;
}

Status WritePromptsJsonl(const std::string& path, const std::vector<RoutePrompt>& prompts) {
  return WriteJsonl(path, prompts, PromptToJson);
}
Result<std::vector<RoutePrompt>> LoadPromptsJsonl(const std::string& path) {
  return LoadJsonl<RoutePrompt>(path, PromptFromJson);
}
Result<std::vector<std::string>> LoadDocsJsonl(const std::string& path) {
  return LoadJsonl<std::string>(path, [](const nlohmann::json& j) { return Str(j, "text"); });
}

nlohmann::json FeaturesToJson(const RouteFeatures& f) {
  return {{"embedding", f.embedding},         {"prompt_tokens", f.prompt_tokens},
          {"probe_entropy", f.probe_entropy}, {"probe_max_prob", f.probe_max_prob},
          {"domain", f.domain},               {"pii", f.pii}};
}

Result<RouteFeatures> FeaturesFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return Status::Error("\"features\": expected an object");
  RouteFeatures f;
  if (!j.contains("embedding") || !j["embedding"].is_array())
    return Status::Error("features.embedding: expected an array of numbers");
  for (const auto& x : j["embedding"]) {
    if (!x.is_number()) return Status::Error("features.embedding: expected an array of numbers");
    f.embedding.push_back(x.get<float>());
  }
  ASSIGN_OR_RETURN(double len, Num(j, "prompt_tokens"));
  f.prompt_tokens = static_cast<int64_t>(len);
  ASSIGN_OR_RETURN(f.probe_entropy, Num(j, "probe_entropy"));
  ASSIGN_OR_RETURN(f.probe_max_prob, Num(j, "probe_max_prob"));
  ASSIGN_OR_RETURN(f.domain, Str(j, "domain"));
  f.pii = j.value("pii", false);
  return f;
}

nlohmann::json RecordToJson(const RouteRecord& r) {
  nlohmann::json j = PromptToJson(r.prompt);
  j["answers"] = {{"edge", r.edge_answer}, {"remote", r.remote_answer}};
  j["quality"] = {{"edge", r.q_edge}, {"remote", r.q_remote}};
  j["judged_by"] = r.judged_by;
  j["pii"] = r.pii;
  j["verdict"] = r.verdict;
  j["features"] = FeaturesToJson(r.features);
  j["edge_model"] = r.edge_model;
  return j;
}

Result<RouteRecord> RecordFromJson(const nlohmann::json& j) {
  RouteRecord r;
  ASSIGN_OR_RETURN(r.prompt, PromptFromJson(j));
  if (!j.contains("quality") || !j["quality"].is_object()) return Status::Error("missing \"quality\"");
  ASSIGN_OR_RETURN(r.q_edge, Num(j["quality"], "edge"));
  ASSIGN_OR_RETURN(r.q_remote, Num(j["quality"], "remote"));
  if (j.contains("answers") && j["answers"].is_object()) {
    r.edge_answer = j["answers"].value("edge", "");
    r.remote_answer = j["answers"].value("remote", "");
  }
  r.judged_by = j.value("judged_by", "");
  r.pii = j.value("pii", false);
  ASSIGN_OR_RETURN(r.verdict, Str(j, "verdict"));
  if (r.verdict != "edge" && r.verdict != "collaborative" && r.verdict != "cloud")
    return Status::Error("\"verdict\": '" + r.verdict + "' (expected edge, collaborative or cloud)");
  if (!j.contains("features")) return Status::Error("missing \"features\"");
  ASSIGN_OR_RETURN(r.features, FeaturesFromJson(j["features"]));
  if (j.contains("edge_model") && j["edge_model"].is_object()) r.edge_model = j["edge_model"];
  return r;
}

Status WriteRecordsJsonl(const std::string& path, const std::vector<RouteRecord>& records) {
  return WriteJsonl(path, records, RecordToJson);
}
Result<std::vector<RouteRecord>> LoadRecordsJsonl(const std::string& path) {
  return LoadJsonl<RouteRecord>(path, RecordFromJson);
}

}  // namespace myriad::edge
