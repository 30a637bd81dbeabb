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
//
// A Hugging Face model (imported, or served with --hf) brings its own Jinja
// template (data/chat_template.h), which this class then renders instead
// (ForModel, FromJinja): the prompt is byte-identical to what transformers'
// apply_chat_template(messages, add_generation_prompt=True) gives.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/chat_template.h"

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
  // A Hugging Face model's Jinja template.
  static ChatTemplate FromJinja(::myriad::ChatTemplate jinja);
  // The template of a loaded model: with a Hugging Face folder `hf_dir` that
  // has a chat template, that one; otherwise ForCheckpoint(step_dir).
  static Result<ChatTemplate> ForModel(const std::string& step_dir, const std::string& hf_dir, std::string* origin);

  // The prompt text for `messages` followed by the generation prompt. Only a
  // Jinja template can fail (its raise_exception, e.g. on roles it refuses).
  Result<std::string> Render(const std::vector<ChatMessage>& messages) const;

  // A Jinja template writes the model's own special tokens (bos included):
  // its text is tokenized with nothing prepended, as transformers does.
  bool writes_own_bos() const { return jinja_ != nullptr; }

  // True for the roles Render accepts.
  static bool KnownRole(const std::string& role);

 private:
  const std::string& FormatFor(const std::string& role) const;

  std::shared_ptr<const ::myriad::ChatTemplate> jinja_;  // set: render it instead of the formats
  std::string prefix_;
  std::string message_ = "<|{role}|>\n{content}\n";
  std::string generation_prompt_ = "<|assistant|>\n";
  std::string system_, developer_, user_, assistant_, tool_;  // empty: use message_
};

}  // namespace myriad::serve
