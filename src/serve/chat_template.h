// The chat template: how /v1/chat/completions turns a list of messages into
// the prompt text the model continues. Plain string formats, no scripting:
//
//   prefix            = ""                          # once, before the first message
//   message           = "<|{role}|>\n{content}\n"   # each message; {role}, {content} replaced
//   generation_prompt = "<|assistant|>\n"           # once, at the end: the reply follows it
//   system = "..." / user = "..." / assistant = "..." / tool = "..."   # optional per-role formats
//
// Stored with the model: `chat_template.toml` in the step directory or in
// the run directory (checked in that order), else a "chat_template" object
// with the same keys in the step's manifest.json, else the default above.
// `myriad serve --chat-template FILE` overrides all of them.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace myriad::serve {

struct ChatMessage {
  std::string role;  // system, developer, user, assistant, tool
  std::string content;
};

class ChatTemplate {
 public:
  ChatTemplate() = default;  // the default template

  // Parses the TOML text of a template (`source` names it in errors).
  static Result<ChatTemplate> Parse(const std::string& toml_text, const std::string& source);
  static Result<ChatTemplate> LoadFile(const std::string& path);
  // The template stored with the checkpoint in `step_dir` (see above); the
  // default when there is none. Sets *origin to where it came from.
  static Result<ChatTemplate> ForCheckpoint(const std::string& step_dir, std::string* origin);

  // The prompt text for `messages` followed by the generation prompt.
  std::string Render(const std::vector<ChatMessage>& messages) const;

  // True for the roles Render accepts.
  static bool KnownRole(const std::string& role);

 private:
  const std::string& FormatFor(const std::string& role) const;

  std::string prefix_;
  std::string message_ = "<|{role}|>\n{content}\n";
  std::string generation_prompt_ = "<|assistant|>\n";
  std::string system_, developer_, user_, assistant_, tool_;  // empty: use message_
};

}  // namespace myriad::serve
