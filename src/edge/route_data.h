// The router's data: the prompt set (verifiable tasks, chat prompts from the
// built-in fortunes, business documents with an instruction), the domain
// rules the device applies to a prompt's text, and the judge's per-prompt
// records (verdicts.jsonl) that the router trains and is evaluated on.
// docs/edge.md ("Router") describes each.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "rl/reward.h"

namespace myriad::edge {

// The four domains, in the order of the features' one-hot.
inline constexpr const char* kRouteDomains[] = {"chat", "arithmetic", "code", "business"};
constexpr int kNumRouteDomains = 4;
int RouteDomainIndex(std::string_view domain);  // -1 when not one of them

// The domain of a prompt from its text alone (what the device knows before
// answering): a small ordered rule set, deterministic, no model.
//   code:       a line starting with "def ", "class ", "import ", "from ... import",
//               a "```" fence, or a "# ...\n" comment line followed by an indented or def line
//   arithmetic: the text, trimmed, is an expression of digits, spaces and + - * / ( )
//               ending in "=" (at least one digit and one operator), or "use N.. make N:"
//   business:   at least 160 code points with a business cue (report, invoice,
//               contract, customer, revenue, summarise/summarize, 合同, 报告, 客户,
//               公司, 总结, 摘要, ...), or any length ending in an instruction cue
//               ("Summarise the", "总结")
//   chat:       anything else
std::string ClassifyDomain(std::string_view prompt);

struct RoutePrompt {
  std::string id;      // unique in a set: "arith-2-000012", "chat-en-000003", "biz-000001"
  std::string domain;  // the set's tag (where the prompt came from)
  std::string split;   // "train" or "held_out"
  std::string prompt;
  std::optional<rl::RewardSpec> verifier;  // arithmetic and python tasks
  int difficulty = 0;  // tasks only
};

struct PromptSetOptions {
  int count = 200;           // train prompts
  int held_out_count = 100;  // held-out prompts
  uint64_t seed = 1;
  // Shares of the domains (business only with docs; its share goes to chat without).
  double arithmetic_share = 0.35, python_share = 0.2, chat_share = 0.25, business_share = 0.2;
  std::vector<int> arithmetic_difficulties{1, 2, 3};  // spread evenly
  std::vector<std::string> business_docs;             // the documents' texts
  int doc_chars = 600;                                // a document is cut to this many code points
  std::string fortunes_dir = "/usr/share/games/fortunes";
};

// Deterministic in the options. Train and held-out prompts never share a
// text: tasks by rl::Split, fortunes and documents by a hash of their text,
// and a final pass keeps one prompt per text (a held-out prompt whose text
// is a train prompt's is dropped; so a split may come out a few short).
// A split with too few documents fills its business share with chat.
Result<std::vector<RoutePrompt>> BuildPromptSet(const PromptSetOptions& opt);

nlohmann::json PromptToJson(const RoutePrompt& p);
Result<RoutePrompt> PromptFromJson(const nlohmann::json& j);
Status WritePromptsJsonl(const std::string& path, const std::vector<RoutePrompt>& prompts);
// Errors name the file and line: "prompts.jsonl:3: missing \"prompt\"".
Result<std::vector<RoutePrompt>> LoadPromptsJsonl(const std::string& path);
// The "text" field of every line of a JSONL file (the redactor's corpus).
Result<std::vector<std::string>> LoadDocsJsonl(const std::string& path);

// What the device computes before answering (edge/router.h's FeatureExtractor).
struct RouteFeatures {
  std::vector<float> embedding;  // mean of the edge model's hidden states over the (truncated) prompt
  int64_t prompt_tokens = 0;     // before truncation
  double probe_entropy = 0;      // mean entropy (nats) of the probe's next-token distributions
  double probe_max_prob = 0;     // mean max probability of the same
  std::string domain;            // ClassifyDomain
  bool pii = false;
};
nlohmann::json FeaturesToJson(const RouteFeatures& f);
Result<RouteFeatures> FeaturesFromJson(const nlohmann::json& j);

// The judge's record of one prompt.
struct RouteRecord {
  RoutePrompt prompt;
  std::string edge_answer, remote_answer;
  double q_edge = 0, q_remote = 0;  // judged quality in [0, 1]
  std::string judged_by;            // "verifier" or "rubric"
  bool pii = false;                 // the remote answer is the collaborative one
  std::string verdict;              // "edge", "collaborative", "cloud"
  RouteFeatures features;
  // The edge model and feature spec the features were computed with:
  // {"vocab_size", "d_model", "n_layers", "path", "max_prompt_tokens", "probe_tokens"}.
  nlohmann::json edge_model = nlohmann::json::object();
  bool remote_needed() const { return verdict != "edge"; }
};
nlohmann::json RecordToJson(const RouteRecord& r);
Result<RouteRecord> RecordFromJson(const nlohmann::json& j);
Status WriteRecordsJsonl(const std::string& path, const std::vector<RouteRecord>& records);
Result<std::vector<RouteRecord>> LoadRecordsJsonl(const std::string& path);

}  // namespace myriad::edge
