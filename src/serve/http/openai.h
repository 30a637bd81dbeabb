// The OpenAI wire format for /v1/chat/completions and /v1/completions:
// request parsing and validation, response and chunk JSON, SSE framing, error
// bodies, and the text-level stop-sequence filter. No I/O here: server.cc
// does the HTTP, this file the JSON, so each can be tested alone.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/billing.h"
#include "serve/chat_template.h"

namespace myriad::serve {

// An error response: HTTP status and OpenAI's
// {"error": {"message", "type", "param", "code"}} body.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field ("" -> null)
  std::string code;   // "" -> null
};
std::string ErrorJson(const ApiError& e);
// The default error for a bare status (401, 404, 405, 413, ...).
ApiError ErrorForStatus(int status);

enum class Endpoint { kChat, kCompletion };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  std::vector<ChatMessage> messages;   // chat
  std::string prompt_text;             // completion, when given as text
  std::vector<int32_t> prompt_tokens;  // completion, when given as token ids
  bool prompt_is_tokens = false;
  bool echo = false;                   // completion: prepend the prompt to the text
  std::optional<int64_t> max_tokens;   // max_tokens or max_completion_tokens
  float temperature = 1.0f;            // OpenAI's default
  float top_p = 1.0f;
  int top_k = 0;                       // extension: 0 = off
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;       // up to kMaxStops non-empty strings
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  // Log-probabilities: -1 none; else how many alternatives per token (chat:
  // logprobs true with top_logprobs 0..20; completions: logprobs 0..5).
  int logprobs = -1;
};

constexpr int kMaxStops = 16;
constexpr int kMaxChatTopLogprobs = 20;       // OpenAI's limits
constexpr int kMaxCompletionLogprobs = 5;

// Parses and validates a request body. Unknown fields are ignored (clients
// send many); known fields of the wrong type or out of range, and features
// this server does not implement (tool calling, n > 1, penalties,
// logit_bias, structured output, audio, prompt logprobs), are 400 errors
// naming the field (docs/serving.md lists them).
bool ParseCompletionRequest(const std::string& body, Endpoint endpoint, CompletionRequest* out, ApiError* err);

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  // Speculative decoding (an extension: "speculative" in the usage object,
  // present when the request verified drafts): verifications, draft tokens
  // proposed and accepted.
  int64_t draft_steps = 0, draft_proposed = 0, draft_accepted = 0;
};
nlohmann::json UsageJson(const Usage& u);
// The extra top-level "cost" field (see docs/serving.md, "Billing").
nlohmann::json CostJson(const RequestCost& c, const std::string& currency);

// Identity shared by a response and all its chunks.
struct ResponseMeta {
  Endpoint endpoint = Endpoint::kChat;
  std::string id;  // chatcmpl-... / cmpl-...
  int64_t created = 0;
  std::string model;
  // Extension (myriad serve --edge): where the request was answered, "edge",
  // "collaborative" or "cloud"; a top-level "route" field when not empty.
  std::string route;
};

// One generated token's log-probabilities, as text.
struct TokenLogprob {
  std::string token;   // the token's bytes (may be part of a UTF-8 character)
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;  // most likely first
  int64_t text_offset = 0;  // completions: where its text starts in the choice's text, in code points
  int32_t id = -1;                                  // the token id
  std::vector<std::pair<int32_t, double>> top_ids;  // `top` by token id
  bool scored = true;  // false: an echoed prompt's first token (no log-probability: nulls)
};
// choices[].logprobs for these tokens: chat's {"content": [{token, logprob,
// bytes, top_logprobs: [{token, logprob, bytes}]}], "refusal": null};
// completions' {tokens, token_logprobs, top_logprobs: [{token: logprob}]
// (the top ones and the chosen one), text_offset}, with two extensions
// that keep the ids (texts can collide): token_ids, and top_logprobs_ids
// ([[id, logprob], ...] most likely first, or null).
nlohmann::json LogprobsJson(Endpoint ep, const std::vector<TokenLogprob>& tokens);

// A whole (non-streamed) response; `logprobs` (LogprobsJson, or null) goes
// into the choice.
nlohmann::json ResponseJson(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                            const Usage& u, const nlohmann::json& cost,
                            const nlohmann::json& logprobs = nullptr);
// One streamed chunk: chat's first chunk carries the role; the last carries
// finish_reason (otherwise null); `logprobs`, those of this chunk's tokens.
nlohmann::json ChunkJson(const ResponseMeta& m, const std::string& text, bool with_role,
                         const std::string& finish_reason, const nlohmann::json& logprobs = nullptr);
// The final usage chunk (choices: []) sent when stream_options.include_usage.
nlohmann::json UsageChunkJson(const ResponseMeta& m, const Usage& u, const nlohmann::json& cost);

std::string SseData(const nlohmann::json& j);  // "data: {...}\n\n"
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

// Stop sequences matched on decoded text (token-level matching in the engine
// misses a stop string that tokenizes differently in context). Push returns
// the text that is safe to show now; text that might be the start of a stop
// string is held back until it is known not to be. Once a stop string
// appears, the text before it is returned and everything after is dropped.
class StopTextFilter {
 public:
  explicit StopTextFilter(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  std::string Push(const std::string& text);
  // End of output: whatever is still held back (empty after a stop).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace myriad::serve
