#include "data/chat_template.h"

#include "core/env.h"

namespace myriad {

namespace {

using ojson = nlohmann::ordered_json;

// Special tokens transformers passes to the template (special_tokens_map).
constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

Result<ojson> ReadJson(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  try {
    return ojson::parse(text);
  } catch (const std::exception& e) {
    return Status::Error(path + ": not valid JSON: " + e.what());
  }
}

// A token is "text", {"content": "text", ...} (an AddedToken) or null.
Result<std::optional<std::string>> TokenText(const ojson& v, const std::string& where) {
  if (v.is_null()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.get<std::string>());
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return std::optional<std::string>(v["content"].get<std::string>());
  }
  return Status::Error(where + " must be a string or an object with a string \"content\", got " + v.dump());
}

// The template text and the name its errors carry.
struct Source {
  std::string text;
  std::string name;
};

// `value` is the "chat_template" of `file`: a string, or named templates.
Result<Source> PickTemplate(const ojson& value, const std::string& file, const std::string& template_name) {
  const std::string where = file + "[chat_template]";
  if (value.is_string()) return Source{value.get<std::string>(), where};
  if (!value.is_array()) {
    return Status::Error(where + " must be a string or a list of {\"name\", \"template\"}, got " +
                         std::string(value.type_name()));
  }
  std::string names;
  for (const auto& entry : value) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
        !entry["template"].is_string()) {
      return Status::Error(where + ": each entry must be {\"name\": string, \"template\": string}");
    }
    const std::string name = entry["name"].get<std::string>();
    if (name == template_name) return Source{entry["template"].get<std::string>(), file + "[chat_template:" + name + "]"};
    names += (names.empty() ? "" : ", ") + name;
  }
  return Status::Error(where + " has no template named '" + template_name + "' (it has: " + names + ")");
}

}  // namespace

Result<ChatTemplate> ChatTemplate::FromString(const std::string& source, const std::string& name,
                                              std::map<std::string, std::string> special_tokens) {
  ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(source, name));
  ChatTemplate ct(std::move(t), source);
  ct.special_tokens_ = std::move(special_tokens);
  return ct;
}

Result<ChatTemplate> ChatTemplate::FromHfDir(const std::string& dir, const std::string& template_name) {
  ASSIGN_OR_RETURN(std::optional<ChatTemplate> ct, FindInHfDir(dir, template_name));
  if (!ct) {
    return Status::Error(dir + ": no chat template (looked for chat_template.jinja, chat_template.json and "
                               "\"chat_template\" in tokenizer_config.json; hint: a base model may have none)");
  }
  return std::move(*ct);
}

Result<std::optional<ChatTemplate>> ChatTemplate::FindInHfDir(const std::string& dir,
                                                             const std::string& template_name) {
  Env* env = Env::Default();
  const std::string config_path = dir + "/tokenizer_config.json";
  ojson config = ojson::object();
  if (env->FileExists(config_path)) {
    ASSIGN_OR_RETURN(config, ReadJson(env, config_path));
    if (!config.is_object()) return Status::Error(config_path + ": must hold a JSON object");
  }

  std::optional<Source> source;
  const std::string jinja_path = dir + "/chat_template.jinja";
  const std::string json_path = dir + "/chat_template.json";
  if (env->FileExists(jinja_path)) {
    ASSIGN_OR_RETURN(std::string text, env->ReadFile(jinja_path));
    source = Source{std::move(text), jinja_path};
  } else if (env->FileExists(json_path)) {
    ASSIGN_OR_RETURN(ojson j, ReadJson(env, json_path));
    if (!j.is_object() || !j.contains("chat_template")) {
      return Status::Error(json_path + ": expected an object with \"chat_template\"");
    }
    ASSIGN_OR_RETURN(Source s, PickTemplate(j["chat_template"], json_path, template_name));
    source = std::move(s);
  } else if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    ASSIGN_OR_RETURN(Source s, PickTemplate(config["chat_template"], config_path, template_name));
    source = std::move(s);
  }
  if (!source) return std::optional<ChatTemplate>();

  std::map<std::string, std::string> tokens;
  for (const char* key : kSpecialTokens) {
    if (!config.contains(key)) continue;
    ASSIGN_OR_RETURN(std::optional<std::string> text, TokenText(config[key], config_path + ": " + key));
    if (text) tokens[key] = *text;
  }
  ASSIGN_OR_RETURN(ChatTemplate ct, FromString(source->text, source->name, std::move(tokens)));

  const std::string gen_path = dir + "/generation_config.json";
  if (env->FileExists(gen_path)) {
    ASSIGN_OR_RETURN(ojson gen, ReadJson(env, gen_path));
    if (gen.is_object() && gen.contains("eos_token_id") && !gen["eos_token_id"].is_null()) {
      const ojson& ids = gen["eos_token_id"];
      auto bad = [&] {
        return Status::Error(gen_path + ": eos_token_id must be an integer or a list of integers, got " + ids.dump());
      };
      if (ids.is_number_integer()) {
        ct.eos_token_ids_.push_back(ids.get<int64_t>());
      } else if (ids.is_array()) {
        for (const auto& id : ids) {
          if (!id.is_number_integer()) return bad();
          ct.eos_token_ids_.push_back(id.get<int64_t>());
        }
      } else {
        return bad();
      }
    }
  }
  return std::optional<ChatTemplate>(std::move(ct));
}

nlohmann::ordered_json ChatTemplate::Variables(const ojson& messages, bool add_generation_prompt,
                                               const ojson& extra) const {
  // The keyword arguments apply_chat_template renders with.
  ojson v = ojson::object();
  v["messages"] = messages;
  v["tools"] = nullptr;
  v["documents"] = nullptr;
  v["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, text] : special_tokens_) v[k] = text;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) v[it.key()] = it.value();
  }
  return v;
}

Result<std::string> ChatTemplate::Render(const ojson& messages, bool add_generation_prompt, const ojson& extra) const {
  if (!messages.is_array()) {
    return Status::Error(name() + ": messages must be a JSON list, got " + std::string(messages.type_name()));
  }
  if (!extra.is_object()) {
    return Status::Error(name() + ": extra variables must be a JSON object, got " + std::string(extra.type_name()));
  }
  return template_.Render(Variables(messages, add_generation_prompt, extra), options_);
}

Result<std::string> ChatTemplate::Render(const nlohmann::json& messages, bool add_generation_prompt,
                                         const nlohmann::json& extra) const {
  // Same order as nlohmann::json iterates (sorted keys).
  ojson m, e;
  try {
    m = ojson::parse(messages.dump());
    e = extra.is_null() ? ojson::object() : ojson::parse(extra.dump());
  } catch (const std::exception& ex) {
    return Status::Error(name() + ": messages are not valid JSON text: " + ex.what());
  }
  return Render(m, add_generation_prompt, e);
}

std::string ChatTemplate::bos_token() const {
  auto it = special_tokens_.find("bos_token");
  return it == special_tokens_.end() ? "" : it->second;
}

std::string ChatTemplate::eos_token() const {
  auto it = special_tokens_.find("eos_token");
  return it == special_tokens_.end() ? "" : it->second;
}

}  // namespace myriad
