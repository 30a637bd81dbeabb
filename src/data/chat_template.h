// Chat templates of Hugging Face model folders: the Jinja template that
// turns a conversation into the prompt text a model was trained on, read
// from the folder and rendered as transformers' apply_chat_template renders
// it (data/jinja.h has the renderer; docs/chat-templates.md the details).
//
// Where the template comes from, first found wins (as transformers):
//   <dir>/chat_template.jinja              the template itself
//   <dir>/chat_template.json               {"chat_template": "..."}
//   <dir>/tokenizer_config.json            "chat_template": a string, or a
//                                          list of {"name", "template"}
// tokenizer_config.json also gives the special tokens (bos_token,
// eos_token, ...: a string or an AddedToken-like {"content": ...}), and
// <dir>/generation_config.json, when present, eos_token_id (an id or a
// list of ids).
//
// Thread safety: a loaded ChatTemplate is immutable; Render may be called
// from any number of threads at once.
#pragma once

#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "data/jinja.h"

namespace myriad {

class ChatTemplate {
 public:
  // Loads the template named `template_name` ("default" is what
  // transformers uses when the folder has several). Errors name the file.
  static Result<ChatTemplate> FromHfDir(const std::string& dir, const std::string& template_name = "default");
  // The same, but a folder without a template is no error: nullopt.
  static Result<std::optional<ChatTemplate>> FindInHfDir(const std::string& dir,
                                                         const std::string& template_name = "default");
  // A template from text; `name` prefixes its errors. `special_tokens` maps
  // variable names (bos_token, eos_token, ...) to token text.
  static Result<ChatTemplate> FromString(const std::string& source, const std::string& name,
                                         std::map<std::string, std::string> special_tokens = {});

  // Renders `messages` (a list of {role, content, ...}). The template sees
  // messages, tools and documents (none unless `extra` gives them),
  // add_generation_prompt, the special tokens, and every key of `extra`
  // (an object: enable_thinking, tools, date_string, ...), which wins.
  // nlohmann::json has sorted object keys, so |tojson writes them sorted;
  // pass nlohmann::ordered_json to keep a request's key order, as
  // transformers does.
  Result<std::string> Render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  Result<std::string> Render(const nlohmann::json& messages, bool add_generation_prompt,
                             const nlohmann::json& extra = nlohmann::json::object()) const;

  // The variables Render gives the template, as JSON (for tests and tools).
  nlohmann::ordered_json Variables(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                   const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // Token text from tokenizer_config.json; empty when the folder has none.
  std::string bos_token() const;
  std::string eos_token() const;
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }
  // generation_config.json's eos_token_id (empty when absent).
  const std::vector<int64_t>& eos_token_ids() const { return eos_token_ids_; }
  const std::string& source() const { return source_; }
  const std::string& name() const { return template_.name(); }

  // What strftime_now() formats (Llama 3.1's date line); default: the clock.
  void set_clock(std::function<std::tm()> now) { options_.now = std::move(now); }

 private:
  ChatTemplate(jinja::Template t, std::string source) : template_(std::move(t)), source_(std::move(source)) {}

  jinja::Template template_;
  std::string source_;
  std::map<std::string, std::string> special_tokens_;
  std::vector<int64_t> eos_token_ids_;
  jinja::RenderOptions options_;
};

}  // namespace myriad
