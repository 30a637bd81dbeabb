#include "serve/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace myriad::serve {

namespace {

// Replaces {role} and {content} in one left-to-right pass, so braces inside
// the content are never substituted again.
std::string Substitute(const std::string& fmt, const std::string& role, const std::string& content) {
  std::string out;
  out.reserve(fmt.size() + content.size());
  for (size_t i = 0; i < fmt.size();) {
    if (fmt.compare(i, 6, "{role}") == 0) {
      out += role;
      i += 6;
    } else if (fmt.compare(i, 9, "{content}") == 0) {
      out += content;
      i += 9;
    } else {
      out += fmt[i++];
    }
  }
  return out;
}

}  // namespace

bool ChatTemplate::KnownRole(const std::string& role) {
  return role == "system" || role == "developer" || role == "user" || role == "assistant" || role == "tool";
}

Result<ChatTemplate> ChatTemplate::Parse(const std::string& toml_text, const std::string& source) {
  ASSIGN_OR_RETURN(auto doc, ConfigDoc::Parse(toml_text, source));
  ChatTemplate t;
  t.prefix_ = doc->GetString("prefix", t.prefix_);
  t.message_ = doc->GetString("message", t.message_);
  t.generation_prompt_ = doc->GetString("generation_prompt", t.generation_prompt_);
  t.system_ = doc->GetString("system", "");
  t.developer_ = doc->GetString("developer", "");
  t.user_ = doc->GetString("user", "");
  t.assistant_ = doc->GetString("assistant", "");
  t.tool_ = doc->GetString("tool", "");
  RETURN_IF_ERROR(doc->Finish());
  if (t.message_.find("{content}") == std::string::npos)
    return Status::Error(source + ": message = \"" + t.message_ +
                         "\" has no {content} (hint: e.g. \"<|{role}|>\\n{content}\\n\")");
  return t;
}

Result<ChatTemplate> ChatTemplate::LoadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Error(path + ": cannot read the chat template (hint: a TOML file, see docs/serving.md)");
  std::stringstream ss;
  ss << f.rdbuf();
  return Parse(ss.str(), path);
}

Result<ChatTemplate> ChatTemplate::ForCheckpoint(const std::string& step_dir, std::string* origin) {
  namespace fs = std::filesystem;
  fs::path step(step_dir);
  for (const fs::path& p : {step / "chat_template.toml", step.parent_path() / "chat_template.toml"}) {
    std::error_code ec;
    if (fs::exists(p, ec)) {
      if (origin) *origin = p.string();
      return LoadFile(p.string());
    }
  }
  std::ifstream mf(step / "manifest.json");
  if (mf) {
    nlohmann::json m = nlohmann::json::parse(mf, nullptr, /*allow_exceptions=*/false);
    if (m.is_object() && m.contains("chat_template")) {
      const auto& ct = m["chat_template"];
      std::string src = (step / "manifest.json").string() + ": chat_template";
      if (!ct.is_object()) return Status::Error(src + " is not an object (hint: keys message, generation_prompt, ...)");
      // Re-express as TOML so both forms go through one parser and one set of checks.
      std::string toml;
      for (auto it = ct.begin(); it != ct.end(); ++it) {
        if (!it.value().is_string()) return Status::Error(src + "." + it.key() + " is not a string");
        toml += it.key() + " = " + nlohmann::json(it.value().get<std::string>()).dump() + "\n";
      }
      if (origin) *origin = src;
      return Parse(toml, src);
    }
  }
  if (origin) *origin = "default";
  return ChatTemplate();
}

const std::string& ChatTemplate::FormatFor(const std::string& role) const {
  const std::string* specific = nullptr;
  if (role == "system") specific = &system_;
  if (role == "developer") specific = developer_.empty() ? &system_ : &developer_;
  if (role == "user") specific = &user_;
  if (role == "assistant") specific = &assistant_;
  if (role == "tool") specific = &tool_;
  return specific && !specific->empty() ? *specific : message_;
}

ChatTemplate ChatTemplate::FromJinja(::myriad::ChatTemplate jinja) {
  ChatTemplate t;
  t.jinja_ = std::make_shared<const ::myriad::ChatTemplate>(std::move(jinja));
  return t;
}

Result<ChatTemplate> ChatTemplate::ForModel(const std::string& step_dir, const std::string& hf_dir,
                                            std::string* origin) {
  if (!hf_dir.empty()) {
    ASSIGN_OR_RETURN(std::optional<::myriad::ChatTemplate> jt, ::myriad::ChatTemplate::FindInHfDir(hf_dir));
    if (jt) {
      if (origin) *origin = jt->name() + " (Jinja)";
      return FromJinja(std::move(*jt));
    }
  }
  return ForCheckpoint(step_dir, origin);
}

Result<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages) const {
  if (jinja_) {
    nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
    for (const auto& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    return jinja_->Render(msgs, /*add_generation_prompt=*/true);
  }
  std::string out = prefix_;
  for (const auto& m : messages) out += Substitute(FormatFor(m.role), m.role, m.content);
  out += generation_prompt_;
  return out;
}

}  // namespace myriad::serve
